/* fc_suggest.c: the near match of an unknown name (fc_suggest.h). Names here are config keys
 * and method names, a few dozen letters at most, so plain loops over small arrays do. */
#include "python/fc_suggest.h"

#include <ctype.h>
#include <string.h>

#define NAME_MAX_LEN 64 /* longer names are never suggested for or suggested */

/* name lowercased without '_' and '-', into out (NAME_MAX_LEN + 1 bytes); its length. */
static size_t folded(const char *name, char *out)
{
    size_t n = 0;
    for (const char *p = name; *p != '\0' && n < NAME_MAX_LEN; p++)
        if (*p != '_' && *p != '-')
            out[n++] = (char)tolower((unsigned char)*p);
    out[n] = '\0';
    return n;
}

/* Edit distance of a and b (lowercased) where a swap of two neighbours counts as one edit, as
 * a typist makes them (the optimal string alignment distance). */
static size_t distance(const char *a, size_t la, const char *b, size_t lb)
{
    size_t d[NAME_MAX_LEN + 1][NAME_MAX_LEN + 1];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            const int same = tolower((unsigned char)a[i - 1]) == tolower((unsigned char)b[j - 1]);
            size_t v = d[i - 1][j - 1] + !same;
            if (d[i - 1][j] + 1 < v)
                v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && tolower((unsigned char)a[i - 1]) == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == tolower((unsigned char)b[j - 1]) && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[la][lb];
}

/* name is candidate with a '_'-joined prefix: top_k for k, grad_error_feedback for error_feedback. */
static int prefixed(const char *name, size_t ln, const char *cand, size_t lc)
{
    return lc > 0 && ln > lc + 1 && name[ln - lc - 1] == '_' && strcmp(name + ln - lc, cand) == 0;
}

const char *fc_near_name(const char *name, const char *const *candidates, size_t count)
{
    const size_t ln = strlen(name);
    if (ln == 0 || ln > NAME_MAX_LEN)
        return NULL;
    char fn[NAME_MAX_LEN + 1], fc[NAME_MAX_LEN + 1];
    folded(name, fn);
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < count; i++) {
        const char *c = candidates[i];
        const size_t lc = strlen(c);
        if (lc > NAME_MAX_LEN)
            continue;
        folded(c, fc);
        size_t d;
        if (strcmp(fn, fc) == 0)
            d = 0;
        else if (prefixed(name, ln, c, lc))
            d = 1;
        else {
            d = distance(name, ln, c, lc);
            const size_t shorter = ln < lc ? ln : lc;
            if (d > (shorter >= 6 ? 2u : 1u) || d >= shorter) /* "k" is not near "x" */
                continue;
        }
        if (d < best_d) {
            best = c;
            best_d = d;
        }
    }
    return best;
}
