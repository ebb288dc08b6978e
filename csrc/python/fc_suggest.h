/* fc_suggest.h: the near match a refusal of an unknown name suggests ("did you mean 'k'?"), one
 * rule for every such message: the C config parser's unknown keys, and through _C.near_name the
 * Python side's unknown methods and powersgd keys. */
#ifndef FC_SUGGEST_H
#define FC_SUGGEST_H

#include <stddef.h>

/* The candidate (of `count`) that `name` most likely misspells, or NULL when none is close:
 * the same name but for case, '_' and '-' (PowerSGD, top-k); an edit distance (insertions,
 * deletions, substitutions and swaps of neighbours) of at most 1, or 2 for names of 6 letters
 * or more (error_feeback, rnak); or a name that is a candidate with a '_'-joined prefix (top_k
 * for k). The closest wins, the first of equals. */
const char *fc_near_name(const char *name, const char *const *candidates, size_t count);

#endif
