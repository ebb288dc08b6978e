/* fc_cuda_path.h: the CUDA backend of the driver (fc_backend_cuda in fc_backend.h): the call a
 * State prepares for CUDA tensors (library, stream, workspace) and what the backend asks of
 * the State (device buffers, host records); the element work is queued through the CUDA
 * library's table on the caller's stream, under the driver's plan, checks and counters
 * (fc_drive.c, fc_fetch.c). */
#ifndef FC_CUDA_PATH_H
#define FC_CUDA_PATH_H

#include "driver/fc_backend.h"
#include "driver/fc_core.h"
#include "backend_cuda/fc_cuda_loader.h"

/* What the CUDA backend asks of the State that prepared its call (csrc/python/state_cuda.c): device
 * buffers come from the State's allocator (torch's, never cudaMalloc), which needs the GIL, so
 * the backend asks for them in prepare only. The host records of a data-dependent encode live
 * here from call to call (grown when a world needs more; the State frees them). */
typedef struct {
    void *owner; /* the State */
    /* the device buffer `name` (NULL: unit `unit`'s method state) of at least `bytes`, on the
     * device of `like`: its pointer and size; *fresh when it was just made */
    int (*buffer)(void *owner, void *like, const char *name, uint32_t unit, int64_t bytes,
                  void **ptr, int64_t *have, int *fresh, fc_err *err);
    fc_cuda_sent *sent;
    int sent_cap;
    fc_cuda_part *parts; /* a parts method's spans of the call (fc_cuda_parts.c), grown when needed */
    int64_t parts_cap;
} fc_cuda_host;

typedef struct fc_cuda_call_s {
    const fc_cuda_api *api;
    fc_cuda_ctx *ctx;
    fc_cuda_ws *ws; /* device memory of a torch tensor the State holds; NULL: none yet */
    int device;
    void *stream;
    fc_cuda_host *host;
    void *like;      /* a tensor of the call (borrowed): where its device buffers go */
    fc_cuda_extra x; /* scratch, unit state, fetch buffer: made by prepare (fc_backend.h) */
} fc_cuda_call;

/* Tests: the rows fc_cuda_geom gives the kernels (fc_cuda_api.probe_geometry) for a unit of
 * `numel` elements of `dtype`, as the collective builds it; rows holds world * FC_GEO_COLS. */
void fc_cuda_probe(const fc_core *s, const fc_cuda_api *api, int64_t numel, int dtype, int world,
                   int rank, int64_t *rows);

#endif
