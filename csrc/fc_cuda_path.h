/* fc_cuda_path.h: the CUDA twin of fc_core_encode / fc_core_decode: the same geometry and host
 * counters, with the work queued through the CUDA library's table on the caller's stream. */
#ifndef FC_CUDA_PATH_H
#define FC_CUDA_PATH_H

#include "fc_core.h"
#include "fc_cuda_loader.h"

typedef struct {
    const fc_cuda_api *api;
    fc_cuda_ctx *ctx;
    fc_cuda_ws *ws; /* device memory of a torch tensor the State holds */
    int device;
    void *stream;
} fc_cuda_call;

int fc_cuda_encode(fc_core *s, const fc_cuda_call *k, const fc_buf *grad, fc_buf *send,
                   fc_buf *residual, int world, int rank, uint32_t unit, fc_err *err);
int fc_cuda_decode(fc_core *s, const fc_cuda_call *k, const fc_buf *recv, const fc_buf *grad,
                   fc_buf *out, int world, int rank, uint32_t unit, fc_err *err);

#endif
