// fc_cu_timing.cu: the per-State context: CUDA event pairs around compress / comm / decompress,
// harvested only when counters are read, so the hook never waits for the GPU.
#include "fc_cu_ctx.cuh"

static void harvest(fc_cuda_ctx *ctx, int wait)
{
    for (int k = 0; k < FC_TIME_KINDS; k++)
        for (int i = 0; i < FC_CU_EVENTS; i++) {
            fc_cu_timer *t = &ctx->t[k][i];
            if (!t->pending)
                continue;
            cudaError_t q = wait ? cudaEventSynchronize(t->b) : cudaEventQuery(t->b);
            if (q == cudaErrorNotReady)
                continue;
            float ms = 0.0f;
            if (q == cudaSuccess && cudaEventElapsedTime(&ms, t->a, t->b) == cudaSuccess)
                ctx->seconds[k] += 1e-3 * (double)ms;
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
    for (int k = 0; k < FC_TIME_KINDS; k++)
        for (int i = 0; i < FC_CU_EVENTS; i++)
            if (ctx->t[k][i].a != NULL) {
                cudaEventDestroy(ctx->t[k][i].a);
                cudaEventDestroy(ctx->t[k][i].b);
            }
    free(ctx);
}

// The next free event pair of a kind, or NULL: when every pair is still in flight (counters
// never read) the timing of this call is skipped rather than waited for.
fc_cu_timer *fc_cu_timer_start(fc_cuda_ctx *ctx, int kind, cudaStream_t s)
{
    fc_cu_timer *t = NULL;
    for (int i = 0; i < FC_CU_EVENTS && t == NULL; i++) {
        fc_cu_timer *c = &ctx->t[kind][(ctx->next[kind] + i) % FC_CU_EVENTS];
        if (c->pending)
            harvest(ctx, 0);
        if (!c->pending)
            t = c;
    }
    if (t == NULL)
        return NULL;
    ctx->next[kind] = (int)((t - ctx->t[kind]) + 1) % FC_CU_EVENTS;
    if (t->a == NULL) {
        if (cudaEventCreate(&t->a) != cudaSuccess || cudaEventCreate(&t->b) != cudaSuccess) {
            (void)cudaGetLastError();
            if (t->a != NULL)
                cudaEventDestroy(t->a);
            t->a = t->b = NULL;
            return NULL;
        }
    }
    if (cudaEventRecord(t->a, s) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
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

void fc_cu_timers_harvest(fc_cuda_ctx *ctx, int wait)
{
    harvest(ctx, wait);
}
