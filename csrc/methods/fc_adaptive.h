/* fc_adaptive.h: adaptive's ladder, the codecs a parts table chooses from (m_adaptive.c), for the
 * glue that shows it to Python (fsdpcomp._budget.LADDER must equal it: tests/core/test_adaptive.py). */
#ifndef FC_ADAPTIVE_H
#define FC_ADAPTIVE_H

#include <stdint.h>
#include "methods/fc_method.h"

#define FC_ADAPTIVE_RUNGS 12
#define FC_RUNG_SETS 4

/* One key a rung sets over its method's defaults: an INT to `value`, or a CHOICE to `choice`. */
typedef struct {
    const char *key; /* NULL: unused slot */
    double value;
    const char *choice;
} fc_rung_set;

typedef struct {
    const char *name;   /* as tables and _budget.LADDER show it */
    const char *method; /* a method of the table (methods.c) */
    fc_rung_set set[FC_RUNG_SETS];
} fc_rung;

extern const fc_rung fc_adaptive_ladder[FC_ADAPTIVE_RUNGS];

/* One span of a chunk as adaptive's encode and decode walk it (m_adaptive.c's sub_chunk), for a
 * backend that runs each rung's own kernels on it (CUDA's: csrc/backend_cuda/fc_cuda_parts.c). */
typedef struct {
    const fc_method *m; /* the rung's method */
    const void *cfg;           /* and its parsed config */
    int64_t lo, n;             /* elements [lo, lo + n) of the chunk */
    int64_t at, bytes;         /* its body: [at, at + bytes) of the chunk's body */
    uint32_t mix;              /* XORed into key0 of the chunk's streams: the span's own draws */
} fc_adaptive_span;

/* Chunk c's spans, in order, into out (at most cap of them); returns how many it has (0 for an
 * empty chunk), so a call with cap 0 counts them. */
int64_t fc_adaptive_spans(const fc_chunk *c, fc_adaptive_span *out, int64_t cap);

#endif
