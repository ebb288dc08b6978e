/* fc_counters.h: what a state counts. Cumulative since the last reset; the glue turns it into
 * the Python dict that results.jsonl and the Jupyter table read. */
#ifndef FC_COUNTERS_H
#define FC_COUNTERS_H

#include <math.h>
#include <stdint.h>
#include "common/fc_hostdev.h"

/* One error sample's cosine between g' and its decode D from ||g'||^2, ||D||^2 and g' . D: 1 for
 * two zero vectors, 0 where one of them is: the CPU encode's and the CUDA driver's one rule. */
FC_HOSTDEV double fc_sample_cos(double xx, double dd, double xd)
{
    return (xx > 0 && dd > 0) ? xd / sqrt(xx * dd) : (double)(xx == 0 && dd == 0);
}

typedef struct {
    int64_t calls;            /* reduce-scatter calls */
    int64_t calls_uncompressed; /* calls whose unit went as `none`: below min_numel, or fallen back */
    int64_t fallback_units;   /* calls whose payloads (all, or for data-dependent sizes some) went as
                               * `none` because the method's would have been no smaller */
    int64_t elements;         /* gradient elements handed to the hook */
    int64_t chunks_sent;
    int64_t bytes_raw;        /* what an uncompressed collective would have sent from this rank */
    int64_t bytes_sent;       /* every byte this rank put on the wire */
    int64_t header_bytes;     /* headers and padding */
    int64_t meta_bytes;       /* scales, norms, counts */
    int64_t index_bytes;      /* sparse coordinates */
    int64_t value_bytes;      /* codes and values */
    int64_t kept;             /* coordinates carried by the payloads */
    int64_t sent_elements;    /* coordinates that were to be carried */
    int64_t nonfinite_in;     /* non-finite gradient elements seen by encode */
    int64_t nonfinite_out;    /* non-finite elements written to the output */
    int64_t saturated;        /* finite values a format could not hold, clamped to its largest:
                                 wire codes, g + e, the fp32 sum, narrow outputs and residuals */
    int64_t extra_collectives;
    int64_t stats_samples;
    double compress_s, decompress_s, comm_s, extra_collective_s;
    /* FSDP2's parameter all-gathers (fsdpcomp.AllGather), apart from the gradient path above */
    int64_t param_gather_calls;
    int64_t param_gather_bytes_raw;  /* what an uncompressed all-gather sends from this rank */
    int64_t param_gather_bytes_sent; /* the payloads this rank sent */
    double param_gather_s, param_gather_codec_s; /* wall time of the calls, and their codec part */
    double err_sq, ref_sq; /* sampled ||g' - D(C(g'))||^2 and ||g'||^2 */
    double cos_sum;        /* sum over samples of cos(g', D(C(g'))) */
} fc_counters;

#endif
