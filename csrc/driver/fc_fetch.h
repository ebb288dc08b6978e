/* fc_fetch.h: the second round of a two-round method (sketch with second_round, after
 * Sketched-SGD): the owner of each chunk picks k coordinates from the summed first-round
 * payloads, every sender answers with its exact (error-fed) values there, and the owner sums
 * them with its exact own chunk. The collectives themselves are the caller's (an all-gather of
 * the picks, an all-to-all of the values); their bytes are counted here. The round's first
 * step, the owner's picks, runs inside fc_drive_decode through the method table (fc_core.h:
 * fc_core_fetch_kmax); this file builds on fc_core.h and the core never includes it. Each step
 * checks and counts here for CPU and CUDA tensors alike; x's backend does the element work. */
#ifndef FC_FETCH_H
#define FC_FETCH_H

#include "driver/fc_core.h"
#include "driver/fc_backend.h"

/* The owner's picks, padded to kmax with 0xFFFFFFFF: what this rank contributes to the
 * all-gather. */
int fc_fetch_picks(const fc_core *s, const fc_exec *x, uint32_t unit, uint32_t *out,
                   int64_t kmax, fc_err *err);

/* all_picks: world x kmax, every owner's picks. Writes this rank's exact values at the picks of
 * each owner it sends to, back to back into send (send_cap floats; splits in floats), takes them out of the
 * residual (NULL: no error feedback), and counts the round's bytes. */
int fc_fetch_values(fc_core *s, const fc_exec *x, const uint32_t *all_picks, int64_t kmax,
                    const fc_buf *grad, fc_buf *residual, int world, int rank, uint32_t unit,
                    float *send, int64_t send_cap, int64_t *send_splits, int64_t *recv_splits,
                    fc_err *err);

/* recv: the values of every sender (recv_splits of fc_fetch_values); sums them at the picks,
 * in rank order with the exact own chunk, and writes out = sum / world. */
int fc_fetch_finish(fc_core *s, const fc_exec *x, const float *recv, int64_t recv_n,
                    const fc_buf *grad, fc_buf *out, int world, int rank, uint32_t unit,
                    fc_err *err);

#endif
