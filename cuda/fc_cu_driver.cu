// fc_cu_driver.cu: the method-agnostic CUDA driver of one unit's compressed reduce-scatter:
// non-finite counts, headers, the method's fused kernels, sampled statistics, header checks on
// the receiving side, and the exported function table. Mirrors fc_core.c step for step.
#include <stddef.h>
#include "fc_cu_ctx.cuh"

// Non-finite elements of g' per sent chunk: a chunk with any keeps its old residual.
__global__ void count_nonfinite(fc_cuda_geom geo, fc_cu_src src, fc_cuda_ws *ws)
{
    const int c = blockIdx.y;
    int64_t start, n;
    fc_cu_span(geo, c, &start, &n);
    if (!fc_cu_sent(geo, c, n))
        return;
    unsigned int bad = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        bad += !(fc_abs_bits(src.x(start + i)) < FC_INF_BITS);
    bad = fc_cu_warp_sum(bad);
    if ((threadIdx.x & 31) == 0 && bad) {
        atomicAdd(&ws->bad[c], bad);
        atomicAdd(&ws->nonfinite_in, (unsigned long long)bad);
    }
}

// Header and zero padding of every sent chunk; the body is the method's.
__global__ void write_headers(fc_cuda_geom geo, uint8_t *send, int method, int dtype,
                              uint32_t unit, uint32_t step)
{
    const int c = blockIdx.x;
    int64_t start, n;
    fc_cu_span(geo, c, &start, &n);
    if (!fc_cu_sent(geo, c, n))
        return;
    uint8_t *p = send + fc_cu_send_off(geo, c);
    const int64_t body = fc_cu_body_bytes(geo, n);
    const int64_t size = n == geo.per ? geo.pay_full : geo.pay_last;
    if (threadIdx.x == 0) {
        fc_header h;
        memset(&h, 0, sizeof(h));
        h.magic = FC_MAGIC;
        h.version = FC_WIRE_VERSION;
        h.method = (uint8_t)method;
        h.dtype = (uint8_t)dtype;
        h.unit = unit;
        h.step = step;
        h.numel = (uint64_t)n;
        h.body_bytes = (uint64_t)body;
        memcpy(p, &h, sizeof(h));
    }
    for (int64_t i = FC_HEADER_BYTES + body + threadIdx.x; i < size; i += blockDim.x)
        p[i] = 0;
}

// The sampled call's sums become one sample of the error statistics, as in the CPU driver.
__global__ void finish_sample(fc_cuda_ws *ws)
{
    const double ee = ws->call_sum[0], xx = ws->call_sum[1], xe = ws->call_sum[2];
    ws->call_sum[0] = ws->call_sum[1] = ws->call_sum[2] = 0;
    if (!isfinite(xx) || !isfinite(ee))
        return;
    const double xd = xx - xe, dd = xx - 2 * xe + ee; // D = x - e
    ws->err_sq += ee;
    ws->ref_sq += xx;
    ws->cos_sum += (xx > 0 && dd > 0) ? xd / sqrt(xx * dd) : (double)(xx == 0 && dd == 0);
    ws->samples++;
}

// Rejects payloads whose header does not match what this rank expects (fc_core.c's
// check_header); a rejected slot is never read and makes its outputs NaN, and the first
// rejection is kept in the workspace for the host to raise when it next reads counters.
__global__ void check_headers(fc_cuda_geom geo, const uint8_t *recv, int64_t slot, int method,
                              int dtype, uint32_t unit, uint32_t step, fc_cuda_ws *ws)
{
    int64_t start, n;
    fc_cu_span(geo, geo.rank, &start, &n);
    const uint64_t body_expect = (uint64_t)fc_cu_body_bytes(geo, n);
    for (int r = threadIdx.x; r < geo.world; r += blockDim.x) {
        if (geo.skip_own && r == geo.rank)
            continue;
        fc_header h;
        memcpy(&h, recv + fc_cu_recv_off(geo, r, slot), sizeof(h));
        unsigned int code = 0;
        if (h.magic != FC_MAGIC)
            code = FC_PAYLOAD_MAGIC;
        else if (h.version != FC_WIRE_VERSION)
            code = FC_PAYLOAD_VERSION;
        else if (h.method != method)
            code = FC_PAYLOAD_METHOD;
        else if (h.dtype != dtype || h.reserved != 0)
            code = FC_PAYLOAD_DTYPE;
        else if (h.unit != unit || h.step != step)
            code = FC_PAYLOAD_ORDER;
        else if (h.numel != (uint64_t)n)
            code = FC_PAYLOAD_NUMEL;
        else if (h.body_bytes != body_expect || h.body_bytes > (uint64_t)(slot - FC_HEADER_BYTES))
            code = FC_PAYLOAD_BODY;
        ws->bad[r] = code;
        if (code != 0 && atomicCAS(&ws->payload_error, 0u, code) == 0u) {
            ws->payload_error_rank = r;
            ws->payload_error_unit = h.unit;
            ws->payload_error_step = h.step;
        }
    }
}

static int encode(fc_cuda_ctx *ctx, const fc_cuda_encode_args *a, fc_err *err)
{
    int rc = FC_OK;
    fc_cu_device_guard dg = {0, 0};
    fc_cu_timer *t = NULL;
    const cudaStream_t s = (cudaStream_t)a->stream;
    const fc_cu_method *m = fc_cu_method_by_id(a->m.id);
    if (m == NULL)
        return fc_fail(err, FC_ERR_TYPE, "method id %d has no CUDA kernels in this build", a->m.id);
    if (a->geo.world < 1 || a->geo.world > FC_CUDA_MAX_WORLD)
        return fc_fail(err, FC_ERR_VALUE, "world must be in [1, %d], got %d", FC_CUDA_MAX_WORLD,
                       a->geo.world);
    if (a->geo.numel == 0)
        return FC_OK;
    FC_TRY(fc_cu_device_enter(&dg, a->device, err));
    t = fc_cu_timer_start(ctx, FC_TIME_COMPRESS, s);
    {
        fc_cu_enc e;
        memset(&e, 0, sizeof(e));
        e.geo = a->geo;
        e.src.grad = a->grad;
        e.src.res = a->residual;
        e.src.gdt = a->grad_dtype;
        e.src.rdt = a->res_dtype;
        e.res = a->residual;
        e.rdt = a->res_dtype;
        e.send = a->send;
        e.bad = a->ws->bad;
        e.ws = a->ws;
        e.unit_slot = a->residual != NULL && a->unit < FC_CUDA_MAX_UNITS ? (int)a->unit : -1;
        e.sample_chunk = -1;
        for (int c = 0; a->sample && c < a->geo.world && e.sample_chunk < 0; c++) {
            int64_t st, n;
            fc_cu_span(a->geo, c, &st, &n);
            if (fc_cu_sent(a->geo, c, n))
                e.sample_chunk = c;
        }
        e.rng.key0 = (uint32_t)a->seed;
        e.rng.key1 = (uint32_t)(a->seed >> 32);
        e.rng.unit = a->unit;
        e.rng.step = a->step;

        FC_CHECK_CUDA(cudaMemsetAsync(a->ws->bad, 0, sizeof(unsigned int) * (size_t)a->geo.world, s),
                      err, error);
        if (e.unit_slot >= 0)
            FC_CHECK_CUDA(cudaMemsetAsync(&a->ws->unit_sq[e.unit_slot], 0, sizeof(double), s), err, error);
        count_nonfinite<<<fc_cu_grid(a->geo.per, FC_CU_THREADS * 8, a->geo.world), FC_CU_THREADS, 0, s>>>(
            a->geo, e.src, a->ws);
        FC_CHECK_LAUNCH(err, error);
        e.src.zero_nonfinite = a->nonfinite_zero;
        write_headers<<<a->geo.world, 32, 0, s>>>(a->geo, a->send, a->m.id, a->grad_dtype, a->unit, a->step);
        FC_CHECK_LAUNCH(err, error);
        FC_TRY(m->encode(a, &e, s, err));
        if (e.sample_chunk >= 0) {
            finish_sample<<<1, 1, 0, s>>>(a->ws);
            FC_CHECK_LAUNCH(err, error);
        }
    }
    fc_cu_timer_stop(t, s);
    t = NULL;
    ctx->last_stream = s;
    ctx->last_device = a->device;
    ctx->have_last = 1;
error:
    if (t != NULL)
        fc_cu_timer_stop(t, s);
    fc_cu_device_leave(&dg);
    return rc;
}

static int decode(fc_cuda_ctx *ctx, const fc_cuda_decode_args *a, fc_err *err)
{
    int rc = FC_OK;
    fc_cu_device_guard dg = {0, 0};
    fc_cu_timer *t = NULL;
    const cudaStream_t s = (cudaStream_t)a->stream;
    const fc_cu_method *m = fc_cu_method_by_id(a->m.id);
    if (m == NULL)
        return fc_fail(err, FC_ERR_TYPE, "method id %d has no CUDA kernels in this build", a->m.id);
    if (a->geo.world < 1 || a->geo.world > FC_CUDA_MAX_WORLD)
        return fc_fail(err, FC_ERR_VALUE, "world must be in [1, %d], got %d", FC_CUDA_MAX_WORLD,
                       a->geo.world);
    if (a->out_numel == 0)
        return FC_OK;
    FC_TRY(fc_cu_device_enter(&dg, a->device, err));
    t = fc_cu_timer_start(ctx, FC_TIME_DECOMPRESS, s);
    {
        fc_cu_dec d;
        memset(&d, 0, sizeof(d));
        d.geo = a->geo;
        d.recv = a->recv;
        d.slot = a->slot;
        d.grad = a->grad;
        d.gdt = a->grad_dtype;
        d.out = a->out;
        d.odt = a->out_dtype;
        d.out_numel = a->out_numel;
        d.bad = a->ws->bad;
        d.ws = a->ws;
        FC_CHECK_CUDA(cudaMemsetAsync(a->ws->bad, 0, sizeof(unsigned int) * (size_t)a->geo.world, s),
                      err, error);
        int64_t start, n;
        fc_cu_span(a->geo, a->geo.rank, &start, &n);
        if (n > 0 && a->slot > 0) {
            int threads = a->geo.world < 256 ? 32 * ((a->geo.world + 31) / 32) : 256;
            check_headers<<<1, threads, 0, s>>>(a->geo, a->recv, a->slot, a->m.id, a->grad_dtype,
                                                a->unit, a->step, a->ws);
            FC_CHECK_LAUNCH(err, error);
        }
        FC_TRY(m->decode(a, &d, s, err));
    }
    fc_cu_timer_stop(t, s);
    t = NULL;
    ctx->last_stream = s;
    ctx->last_device = a->device;
    ctx->have_last = 1;
error:
    if (t != NULL)
        fc_cu_timer_stop(t, s);
    fc_cu_device_leave(&dg);
    return rc;
}

static int read_counters(fc_cuda_ctx *ctx, const fc_cuda_ws *dev_ws, fc_cuda_ws *host_ws,
                         double seconds[FC_TIME_KINDS], fc_err *err)
{
    int rc = FC_OK;
    fc_cu_device_guard dg = {0, 0};
    memset(host_ws, 0, sizeof(*host_ws));
    if (ctx->have_last && dev_ws != NULL) {
        FC_TRY(fc_cu_device_enter(&dg, ctx->last_device, err));
        FC_CHECK_CUDA(cudaMemcpyAsync(host_ws, dev_ws, sizeof(*host_ws), cudaMemcpyDeviceToHost,
                                      ctx->last_stream), err, error);
        FC_CHECK_CUDA(cudaStreamSynchronize(ctx->last_stream), err, error);
        fc_cu_timers_harvest(ctx, 1);
    }
    for (int k = 0; k < FC_TIME_KINDS; k++) {
        seconds[k] = ctx->seconds[k];
        ctx->seconds[k] = 0;
    }
error:
    fc_cu_device_leave(&dg);
    return rc;
}

static int reset_counters(fc_cuda_ctx *ctx, fc_cuda_ws *dev_ws, fc_err *err)
{
    int rc = FC_OK;
    fc_cu_device_guard dg = {0, 0};
    if (ctx->have_last && dev_ws != NULL) {
        FC_TRY(fc_cu_device_enter(&dg, ctx->last_device, err));
        FC_CHECK_CUDA(cudaMemsetAsync(dev_ws, 0, offsetof(fc_cuda_ws, call_sum), ctx->last_stream),
                      err, error);
        fc_cu_timers_harvest(ctx, 1);
    }
    for (int k = 0; k < FC_TIME_KINDS; k++)
        ctx->seconds[k] = 0;
error:
    fc_cu_device_leave(&dg);
    return rc;
}

static int has_method(int id)
{
    return fc_cu_method_by_id(id) != NULL;
}

int fc_cu_nccl_unique_id(uint8_t id[128], fc_err *err);
int fc_cu_nccl_comm_init(const uint8_t id[128], int world, int rank, int device, fc_cuda_comm **out,
                         fc_err *err);
void fc_cu_nccl_comm_free(fc_cuda_comm *comm);
int fc_cu_nccl_all_to_all(fc_cuda_ctx *ctx, fc_cuda_comm *comm, int device, void *stream,
                          const uint8_t *send, const int64_t *send_splits, uint8_t *recv,
                          const int64_t *recv_splits, fc_err *err);

// the sparse, aggregate and stateful methods' entries (fc_cu_sparse_api.cu, fc_cu_fetch.cu)
int fc_cu_scratch_bytes(const fc_cuda_encode_args *enc, const fc_cuda_decode_args *dec, int64_t *bytes,
                        fc_err *err);
int fc_cu_fetch_picks(fc_cuda_ctx *ctx, const fc_cuda_fetch_args *a, fc_err *err);
int fc_cu_fetch_values(fc_cuda_ctx *ctx, const fc_cuda_fetch_args *a, fc_err *err);
int fc_cu_fetch_finish(fc_cuda_ctx *ctx, const fc_cuda_fetch_args *a, fc_err *err);
int fc_cu_copy(fc_cuda_ctx *ctx, int device, void *stream, void *dst, const void *src, int64_t bytes,
               int to_host, fc_err *err);

#ifndef FC_CUDA_BUILD_INFO
#define FC_CUDA_BUILD_INFO "unknown"
#endif

static const fc_cuda_api api = {
    FC_CUDA_ABI,
    FC_CUDA_BUILD_INFO,
    has_method,
    fc_cu_ctx_new,
    fc_cu_ctx_free,
    encode,
    decode,
    read_counters,
    reset_counters,
    fc_cu_nccl_unique_id,
    fc_cu_nccl_comm_init,
    fc_cu_nccl_comm_free,
    fc_cu_nccl_all_to_all,
    fc_cu_scratch_bytes,
    fc_cu_fetch_picks,
    fc_cu_fetch_values,
    fc_cu_fetch_finish,
    fc_cu_copy,
};

// The library's only exported symbol.
extern "C" __attribute__((visibility("default"))) const fc_cuda_api *fc_cuda_get_api(int abi)
{
    return abi == FC_CUDA_ABI ? &api : NULL;
}
