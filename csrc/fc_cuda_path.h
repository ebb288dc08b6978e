/* fc_cuda_path.h: the CUDA backend of the driver: encode / decode / compress / decompress and the
 * second round's work on CUDA tensors, queued through the CUDA library's table on the caller's
 * stream, with the driver's plan, counters and checks (fc_core.h, fc_fetch.c). */
#ifndef FC_CUDA_PATH_H
#define FC_CUDA_PATH_H

#include "fc_core.h"
#include "fc_cuda_loader.h"

typedef struct fc_cuda_call_s {
    const fc_cuda_api *api;
    fc_cuda_ctx *ctx;
    fc_cuda_ws *ws; /* device memory of a torch tensor the State holds */
    int device;
    void *stream;
    fc_cuda_extra x; /* scratch, unit state, fetch buffer: torch tensors (csrc/state_cuda.c) */
} fc_cuda_call;

/* sizes[c]: bytes of the payload for rank c (0 for none), back to back in send: the plan's
 * for fixed-size methods; for data-dependent ones what the device wrote, read back (the one
 * wait on the GPU of a hook call). */
int fc_cuda_encode(fc_core *s, const fc_cuda_call *k, const fc_buf *grad, fc_buf *send,
                   fc_buf *residual, int world, int rank, uint32_t unit, int64_t *sizes,
                   fc_err *err);
int fc_cuda_decode(fc_core *s, const fc_cuda_call *k, const fc_buf *recv, const fc_buf *grad,
                   fc_buf *out, int world, int rank, uint32_t unit, fc_err *err);

/* What a CUDA encode or decode of a unit needs besides its tensors: device scratch bytes (0:
 * none), the fetch buffer's bytes (0: no second round). k->x is not read. */
int fc_cuda_unit_needs(const fc_core *s, const fc_cuda_call *k, int decode, const fc_buf *recv,
                       const fc_buf *grad, const fc_buf *out, int world, int rank, uint32_t unit,
                       int64_t *scratch, int64_t *fetch, fc_err *err);

/* The second round's element work on CUDA tensors (picks stay on the device); fc_fetch.c's
 * three steps check, split and count, then call these. */
int fc_cuda_fetch_picks(const fc_core *s, const fc_cuda_call *k, uint32_t unit, uint32_t *picks,
                        int64_t kmax, fc_err *err);
int fc_cuda_fetch_values(fc_core *s, const fc_cuda_call *k, const uint32_t *all_picks, int64_t kmax,
                         const fc_buf *grad, fc_buf *residual, int world, int rank, uint32_t unit,
                         float *send, fc_err *err);
int fc_cuda_fetch_finish(fc_core *s, const fc_cuda_call *k, const float *recv, const fc_buf *grad,
                         fc_buf *out, int world, int rank, uint32_t unit, fc_err *err);
/* Bytes of the fetch buffer a unit's second round keeps on the device. */
int64_t fc_cuda_fetch_bytes(int64_t kmax);

/* fc_core_compress / fc_core_decompress on device memory: the same payload bytes, the same
 * checks (a malformed header is caught on the device: acc becomes NaN and the next counters()
 * raises). x and acc are fp32; k->x holds the scratch and unit state of fc_cuda_single_needs. */
int fc_cuda_compress(fc_core *s, const fc_cuda_call *k, const fc_buf *x, fc_buf *payload,
                     uint32_t unit, uint32_t chunk, int world, int rank, int64_t *written,
                     fc_err *err);
int fc_cuda_decompress(fc_core *s, const fc_cuda_call *k, const fc_buf *payload, fc_buf *acc,
                       float alpha, uint32_t unit, uint32_t chunk, int world, fc_err *err);
/* The device scratch compress() (decode 0) of n values or decompress() (decode 1) into n needs;
 * k->x is not read. The unit state they use is fc_core_single_state's (csrc/state_cuda.c). */
int fc_cuda_single_needs(const fc_core *s, const fc_cuda_call *k, int64_t n, int world, int rank,
                         uint32_t unit, uint32_t chunk, int decode, int64_t *scratch, fc_err *err);

/* Tests: the rows fc_cuda_geom gives the kernels (fc_cuda_api.probe_geometry) for a unit of
 * `numel` elements of `dtype`, as the collective builds it; rows holds world * FC_GEO_COLS. */
void fc_cuda_probe(const fc_core *s, const fc_cuda_api *api, int64_t numel, int dtype, int world,
                   int rank, int64_t *rows);

#endif
