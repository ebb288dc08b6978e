/* fc_cuda_path.h: the CUDA backend of the driver (fc_backend_cuda in fc_backend.h): the call a
 * State prepares for CUDA tensors (library, stream, workspace, scratch) and what it must
 * allocate for one; the element work is queued through the CUDA library's table on the caller's
 * stream, under the driver's plan, checks and counters (fc_drive.c, fc_fetch.c). */
#ifndef FC_CUDA_PATH_H
#define FC_CUDA_PATH_H

#include "driver/fc_backend.h"
#include "driver/fc_core.h"
#include "backend_cuda/fc_cuda_loader.h"

typedef struct fc_cuda_call_s {
    const fc_cuda_api *api;
    fc_cuda_ctx *ctx;
    fc_cuda_ws *ws; /* device memory of a torch tensor the State holds */
    int device;
    void *stream;
    fc_cuda_extra x; /* scratch, unit state, fetch buffer: torch tensors (csrc/python/state_cuda.c) */
} fc_cuda_call;

/* What a CUDA encode or decode of a unit needs besides its tensors: device scratch bytes (0:
 * none), the fetch buffer's bytes (0: no second round). k->x is not read. */
int fc_cuda_unit_needs(const fc_core *s, const fc_cuda_call *k, int decode, const fc_buf *recv,
                       const fc_buf *grad, const fc_buf *out, int world, int rank, uint32_t unit,
                       int64_t *scratch, int64_t *fetch, fc_err *err);

/* Bytes of the fetch buffer a unit's second round keeps on the device. */
int64_t fc_cuda_fetch_bytes(int64_t kmax);

/* The device scratch compress() (decode 0) of n values or decompress() (decode 1) into n needs;
 * k->x is not read. The unit state they use is fc_core_single_state's (csrc/python/state_cuda.c). */
int fc_cuda_single_needs(const fc_core *s, const fc_cuda_call *k, int64_t n, int world, int rank,
                         uint32_t unit, uint32_t chunk, int decode, int64_t *scratch, fc_err *err);

/* Tests: the rows fc_cuda_geom gives the kernels (fc_cuda_api.probe_geometry) for a unit of
 * `numel` elements of `dtype`, as the collective builds it; rows holds world * FC_GEO_COLS. */
void fc_cuda_probe(const fc_core *s, const fc_cuda_api *api, int64_t numel, int dtype, int world,
                   int rank, int64_t *rows);

#endif
