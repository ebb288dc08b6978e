// fc_cu_timing.cu: the per-State context: CUDA event pairs around compress / comm / decompress
// (and the collectives torch.distributed runs, marked from Python), harvested only when
// counters are read or a pair is needed again, so the hook never waits for the GPU.
#include "fc_cu_ctx.cuh"

// Adds the elapsed time of every finished pending pair of `kind`. A pair still running stays
// pending; cudaEventQuery's cudaErrorNotReady is taken out of the last-error slot at once:
// left there, the next FC_CHECK_LAUNCH of an encode on this thread raised it as a CudaError.
static void harvest_kind(fc_cuda_ctx *ctx, int k, int wait)
{
    for (int i = 0; i < FC_CU_EVENTS; i++) {
        fc_cu_timer *t = &ctx->t[k][i];
        if (!t->pending)
            continue;
        cudaError_t q = wait ? cudaEventSynchronize(t->b) : cudaEventQuery(t->b);
        if (q == cudaErrorNotReady) {
            (void)cudaGetLastError();
            continue;
        }
        float ms = 0.0f;
        if (q == cudaSuccess && cudaEventElapsedTime(&ms, t->a, t->b) == cudaSuccess)
            ctx->seconds[k] += 1e-3 * (double)ms;
        else
            (void)cudaGetLastError(); // a failed query loses one timing, nothing else
        t->pending = 0;
    }
}

void fc_cu_timers_harvest(fc_cuda_ctx *ctx, int wait)
{
    for (int k = 0; k < FC_TIME_KINDS; k++)
        harvest_kind(ctx, k, wait);
}

fc_cuda_ctx *fc_cu_ctx_new(void)
{
    return (fc_cuda_ctx *)calloc(1, sizeof(fc_cuda_ctx));
}

void fc_cu_ctx_free(fc_cuda_ctx *ctx)
{
    if (ctx == NULL)
        return;
    for (int k = 0; k < FC_TIME_KINDS; k++)
        for (int i = 0; i < FC_CU_EVENTS; i++)
            if (ctx->t[k][i].a != NULL) {
                FC_CUDA_IGNORE(cudaEventDestroy(ctx->t[k][i].a));
                FC_CUDA_IGNORE(cudaEventDestroy(ctx->t[k][i].b));
            }
    free(ctx);
}

fc_cu_timer *fc_cu_timer_start(fc_cuda_ctx *ctx, int kind, cudaStream_t s)
{
    fc_cu_timer *t = &ctx->t[kind][ctx->next[kind]];
    if (t->pending) // the ring came round: collect what finished (once, not per slot)
        harvest_kind(ctx, kind, 0);
    if (t->pending)
        return NULL; // 64 calls of this kind still queued on the GPU: this one goes untimed
    if (t->a == NULL) {
        if (cudaEventCreate(&t->a) != cudaSuccess || cudaEventCreate(&t->b) != cudaSuccess) {
            (void)cudaGetLastError();
            if (t->a != NULL)
                FC_CUDA_IGNORE(cudaEventDestroy(t->a));
            t->a = t->b = NULL;
            return NULL;
        }
    }
    if (cudaEventRecord(t->a, s) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    ctx->next[kind] = (ctx->next[kind] + 1) % FC_CU_EVENTS;
    return t;
}

void fc_cu_timer_stop(fc_cu_timer *t, cudaStream_t s)
{
    if (t == NULL)
        return;
    if (cudaEventRecord(t->b, s) == cudaSuccess)
        t->pending = 1;
    else
        (void)cudaGetLastError();
}

// A collective issued by torch.distributed: its time is what the caller's stream spends from
// the point it reaches the collective to the point it may go on, which includes waiting for
// earlier collectives queued on the process group's own stream.
int fc_cu_comm_mark(fc_cuda_ctx *ctx, int device, void *stream, int end, int kind, fc_err *err)
{
    int rc = FC_OK;
    fc_cu_device_guard dg = {0, 0};
    const cudaStream_t s = (cudaStream_t)stream;
    if (kind != FC_TIME_COMM && kind != FC_TIME_EXTRA)
        return fc_fail(err, FC_ERR_VALUE, "comm_mark: kind must be comm (%d) or extra (%d), got %d",
                       FC_TIME_COMM, FC_TIME_EXTRA, kind);
    FC_TRY(fc_cu_device_enter(&dg, device, err));
    if (!end) {
        ctx->open_comm = fc_cu_timer_start(ctx, kind, s); // a begin never ended is dropped
        ctx->open_kind = kind;
    } else if (ctx->open_comm != NULL) {
        if (ctx->open_kind != kind)
            rc = fc_fail(err, FC_ERR_STATE, "comm_mark: the end names kind %d, its begin %d", kind,
                         ctx->open_kind);
        else
            fc_cu_timer_stop(ctx->open_comm, s);
        ctx->open_comm = NULL;
    }
error:
    fc_cu_device_leave(&dg);
    return rc;
}
