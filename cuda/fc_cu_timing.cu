// fc_cu_timing.cu: the per-State context: CUDA event pairs around compress / comm / decompress
// (and the collectives torch.distributed runs, marked from Python), from one pool made at the
// context's first timed call, harvested only when counters are read or a pair is needed again,
// so the hook never waits for the GPU and a warm call makes no event.
#include "fc_cu_ctx.cuh"

// Adds the elapsed time of every finished pending pair to its kind. A pair still running stays
// pending; cudaEventQuery's cudaErrorNotReady is taken out of the last-error slot at once: left
// there, the next FC_CHECK_LAUNCH of an encode on this thread raised it as a CudaError.
void fc_cu_timers_harvest(fc_cuda_ctx *ctx, int wait)
{
    for (int i = 0; i < ctx->made; i++) {
        fc_cu_timer *t = &ctx->t[i];
        if (!t->pending)
            continue;
        cudaError_t q = wait ? cudaEventSynchronize(t->b) : cudaEventQuery(t->b);
        if (q == cudaErrorNotReady) {
            (void)cudaGetLastError();
            continue;
        }
        float ms = 0.0f;
        if (q == cudaSuccess && cudaEventElapsedTime(&ms, t->a, t->b) == cudaSuccess)
            ctx->seconds[t->kind] += 1e-3 * (double)ms;
        else
            (void)cudaGetLastError(); // a failed query loses one timing, nothing else
        t->pending = 0;
    }
}

fc_cuda_ctx *fc_cu_ctx_new(void)
{
    return (fc_cuda_ctx *)calloc(1, sizeof(fc_cuda_ctx));
}

void fc_cu_ctx_free(fc_cuda_ctx *ctx)
{
    if (ctx == NULL)
        return;
    for (int i = 0; i < ctx->made; i++) {
        FC_CUDA_IGNORE(cudaEventDestroy(ctx->t[i].a));
        FC_CUDA_IGNORE(cudaEventDestroy(ctx->t[i].b));
    }
    free(ctx);
}

// The pool, on the current device (the caller's frame entered it): as many pairs as can be made;
// a failure leaves the ring the pairs made before it (none: every call goes untimed).
static void make_pool(fc_cuda_ctx *ctx)
{
    ctx->tried = 1;
    while (ctx->made < FC_CU_PAIRS) {
        fc_cu_timer *t = &ctx->t[ctx->made];
        if (cudaEventCreate(&t->a) != cudaSuccess) {
            (void)cudaGetLastError();
            return;
        }
        if (cudaEventCreate(&t->b) != cudaSuccess) {
            (void)cudaGetLastError();
            FC_CUDA_IGNORE(cudaEventDestroy(t->a));
            return;
        }
        ctx->made++;
    }
}

fc_cu_timer *fc_cu_timer_start(fc_cuda_ctx *ctx, int kind, cudaStream_t s)
{
    if (!ctx->tried)
        make_pool(ctx);
    if (ctx->made == 0)
        return NULL;
    fc_cu_timer *t = &ctx->t[ctx->next % ctx->made];
    if (t->pending) // the ring came round: collect what finished (once, not per slot)
        fc_cu_timers_harvest(ctx, 0);
    if (t->pending)
        return NULL; // FC_CU_PAIRS timed calls still queued on the GPU: this one goes untimed
    if (cudaEventRecord(t->a, s) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    t->kind = kind;
    ctx->next = (ctx->next + 1) % ctx->made;
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
