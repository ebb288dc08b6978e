// fc_cu_ef.cu: error feedback for a residual no codec reads (PowerSGD's error e), common/fc_ef.h's
// rules element by element, so the values are the CPU backend's (backend_cpu/fc_ef_cpu.c), and
// the counts go to the workspace as a codec's encode counts them (nonfinite_in, saturated).
// A grid-stride loop over a grid of about one thread per 4 elements: the work is one
// read-modify-write of x and one read or write of the residual, memory-bound like a copy.
#include "fc_cu_ctx.cuh"
#include "common/fc_ef.h"

__global__ void ef_kernel(fc_cuda_ef_args a)
{
    const int bf16 = a.res_dtype != FC_CU_F32; // fp32 or bf16 (fc_drive_ef checked)
    int64_t bad = 0, sat = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) {
        if (a.op == FC_EF_ADD)
            a.x[i] = fc_ef_add(a.x[i], fc_ef_load(a.residual, bf16, i), a.ef_decay, a.h.nonfinite_zero,
                               &bad, &sat);
        else
            fc_ef_store(a.residual, bf16, i, fc_ef_keep(a.x[i], a.ref[i], &sat), &sat);
    }
    fc_cu_count(&a.h.ws->nonfinite_in, bad);
    fc_cu_count(&a.h.ws->saturated, sat);
}

int fc_cu_ef(fc_cuda_ctx *ctx, const fc_cuda_ef_args *a, fc_err *err)
{
    int rc = FC_OK;
    fc_cu_frame f;
    fc_cu_frame_init(&f, a->h);
    if (a->n <= 0)
        return FC_OK;
    if (a->op != FC_EF_ADD && a->op != FC_EF_KEEP)
        return fc_fail(err, FC_ERR_VALUE, "ef: no operation %d", a->op);
    FC_TRY(fc_cu_frame_enter(&f, err));
    {
        const int64_t want = (a->n + 4 * 256 - 1) / (4 * 256);
        const unsigned grid = (unsigned)(want > 65535 ? 65535 : want);
        ef_kernel<<<grid, 256, 0, f.s>>>(*a);
    }
    FC_CHECK_LAUNCH(err, error);
    fc_cu_frame_done(ctx, &f); // the counters' read waits on this stream
error:
    return fc_cu_frame_leave(&f, rc);
}
