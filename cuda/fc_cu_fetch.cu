// fc_cu_fetch.cu: the second round of a two-round method on CUDA (fc_fetch.c's three steps): the
// owner's picks out of the fetch buffer, this rank's exact error-fed values at every owner's
// picks (taken out of the residual), and the owner's sum of them with its exact chunk, in rank
// order. The picks of a chunk of n are min(kmax, n) (sketch's rule, fc_cuda.h).
#include "fc_cu_ctx.cuh"
#include "fc_cu_sparse.cuh"

#define FETCH_THREADS 256

__host__ __device__ __forceinline__ uint32_t *fetch_flags(uint8_t *f)
{
    return (uint32_t *)f;
}

__host__ __device__ __forceinline__ double *fetch_taken(uint8_t *f)
{
    return (double *)(f + FC_CUDA_FETCH_TAKEN);
}

__host__ __device__ __forceinline__ uint32_t *fetch_own_picks(uint8_t *f)
{
    return (uint32_t *)(f + FC_CUDA_FETCH_PICKS);
}

// Whether rank `from` sends chunk `to` a payload, and so values in this round.
__host__ __device__ __forceinline__ int fetch_sends(const fc_cuda_geom &g, int from, int to)
{
    return from != to || !g.skip_own;
}

// Owner c's picks and where this rank's values for it start in the send buffer.
__device__ __forceinline__ void owner_span(const fc_cuda_fetch_args &a, int c, int64_t *k, int64_t *off)
{
    int64_t at = 0, start, n;
    for (int q = 0; q < c; q++) {
        fc_cu_span(a.h.geo, q, &start, &n);
        at += fetch_sends(a.h.geo, a.h.geo.rank, q) ? (n < a.kmax ? n : a.kmax) : 0;
    }
    fc_cu_span(a.h.geo, c, &start, &n);
    *k = fetch_sends(a.h.geo, a.h.geo.rank, c) ? (n < a.kmax ? n : a.kmax) : 0;
    *off = at;
}

// Every owner's picks in range and strictly ascending, or the owner is rejected (its values
// become NaN and its part of the residual stays): the CPU raises PayloadError instead.
__global__ void fetch_check(fc_cuda_fetch_args a)
{
    const int c = blockIdx.y;
    int64_t k, off, start, n;
    owner_span(a, c, &k, &off);
    fc_cu_span(a.h.geo, c, &start, &n);
    const uint32_t *p = a.all_picks + (int64_t)c * a.kmax;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < k; j += stride)
        if ((int64_t)p[j] >= n || (j > 0 && p[j] <= p[j - 1]))
            fc_cu_reject(a.h.ws, a.h.ws->bad, c, FC_PAYLOAD_PICKS, a.h.unit, 0);
}

// This rank's values at owner c's picks, as fc_fetch.c's: the residual there (round 1 left
// e = g', 0 where a chunk that passed NaN/Inf held one), taken out of it; without error feedback
// g itself. A NaN/Inf of the gradient goes as the canonical NaN ("pass") or, in "zero" mode, as
// e (0 without a residual): fc_gprime_fix's g'.
__global__ void fetch_values(fc_cuda_fetch_args a)
{
    const int c = blockIdx.y;
    int64_t k, off, start, n;
    owner_span(a, c, &k, &off);
    fc_cu_span(a.h.geo, c, &start, &n);
    const uint32_t *p = a.all_picks + (int64_t)c * a.kmax;
    const int rejected = a.h.ws->bad[c] != 0;
    double taken = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < k; j += stride) {
        float v;
        if (rejected) {
            v = fc_cu_poison();
        } else {
            const int64_t i = start + p[j];
            const float g = fc_cu_load(a.h.grad, a.h.grad_dtype, i);
            if (a.residual != NULL) {
                int64_t unused = 0;
                v = fc_cu_load(a.residual, a.res_dtype, i);
                fc_cu_store_res(a.residual, a.res_dtype, i, 0.0f, &unused);
                taken += (double)v * v;
            } else {
                v = g;
            }
            if (!(fc_abs_bits(g) < FC_INF_BITS) && (!a.h.nonfinite_zero || a.residual == NULL))
                v = a.h.nonfinite_zero ? 0.0f : fc_canon_nan(g);
        }
        a.values[off + j] = v;
    }
    taken = fc_cu_warp_sum(taken);
    if ((threadIdx.x & 31) == 0 && taken != 0)
        atomicAdd(fetch_taken(a.h.x.fetch), taken);
}

// ||e||^2 of the unit loses what was taken (never below 0), as fc_fetch.c's.
__global__ void fetch_residual_sq(fc_cuda_fetch_args a)
{
    double *t = fetch_taken(a.h.x.fetch);
    if (a.h.unit < FC_CUDA_MAX_UNITS) {
        const double e = a.h.ws->unit_sq[a.h.unit] - *t;
        a.h.ws->unit_sq[a.h.unit] = e > 0 ? e : 0;
    }
    *t = 0;
}

// Whether any value received is NaN/Inf (fc_fetch.c's `passed`: then every element's NaN/Inf
// goes through, as a flagged payload's); into ws->passed (zeroed before). The own chunk's pass
// at their own elements (fc_output_passes), decided where each is stored.
__global__ void finish_passed(fc_cuda_fetch_args a, int64_t values)
{
    int bad = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int64_t j = t0; j < values && !bad; j += stride)
        bad = !(fc_abs_bits(a.values[j]) < FC_INF_BITS);
    if (bad)
        a.h.ws->passed = 1;
}

// The own chunk's NaN/Inf pass at their elements: it was added exact, in "pass" mode.
__device__ __forceinline__ int fetch_own_pass(const fc_cuda_fetch_args &a)
{
    return a.h.geo.skip_own && !a.h.nonfinite_zero;
}

// The own chunk's element as fc_cpu_add_own adds it (0 in "zero" mode for a NaN/Inf).
__device__ __forceinline__ float fetch_own(const fc_cuda_fetch_args &a, int64_t i)
{
    const float g = fc_cu_load(a.h.grad, a.h.grad_dtype, i);
    return fc_abs_bits(g) < FC_INF_BITS ? g : a.h.nonfinite_zero ? 0.0f : fc_canon_nan(g);
}

// out = (0 + own) / W everywhere first (own: when the own chunk was not sent), then the picks.
__global__ void finish_dense(fc_cuda_fetch_args a)
{
    int64_t start, n;
    fc_cu_span(a.h.geo, a.h.geo.rank, &start, &n);
    const float w = (float)a.h.geo.world;
    const int passed = a.h.ws->passed != 0, own_pass = fetch_own_pass(a);
    int64_t nonfinite = 0, sat = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.out_numel; i += stride) {
        if (fc_cu_out_tail(a.out, a.out_dtype, i, n)) // FSDP's padded tail
            continue;
        float acc = 0.0f;
        if (a.h.geo.skip_own)
            acc += fetch_own(a, start + i);
        fc_cu_store_out(a.out, a.out_dtype, i, acc / w, fc_output_passes(passed, own_pass, acc), &nonfinite, &sat);
    }
    fc_cu_count(&a.h.ws->nonfinite_out, nonfinite);
    fc_cu_count(&a.h.ws->saturated, sat);
}

// At each pick the senders' values and the own chunk, in rank order (fc_fetch.c's sum); the
// output there is rewritten and its counts moved with it.
__global__ void finish_picks(fc_cuda_fetch_args a)
{
    int64_t start, n;
    fc_cu_span(a.h.geo, a.h.geo.rank, &start, &n);
    const uint32_t *picks = fetch_own_picks(a.h.x.fetch);
    const float w = (float)a.h.geo.world;
    const int passed = a.h.ws->passed != 0, own_pass = fetch_own_pass(a);
    int64_t was = 0, now = 0, was_sat = 0, now_sat = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < a.n_picks; j += stride) {
        const int64_t i = picks[j];
        const float own = fetch_own(a, start + i);
        float acc = 0.0f, before = 0.0f;
        int64_t at = 0;
        for (int r = 0; r < a.h.geo.world; r++) {
            if (!fetch_sends(a.h.geo, r, a.h.geo.rank)) {
                acc += own;
                continue;
            }
            acc += a.values[at + j];
            at += a.n_picks;
        }
        if (a.h.geo.skip_own)
            before += own;
        const int p = fc_output_passes(passed, own_pass, before); // before: 0 + own, or 0
        fc_cu_store_out(a.out, a.out_dtype, i, before / w, p, &was, &was_sat); // finish_dense's
        fc_cu_store_out(a.out, a.out_dtype, i, acc / w, p, &now, &now_sat);
    }
    // the counts move by now - was (negative where fewer: the unsigned add wraps, a subtraction)
    fc_cu_count(&a.h.ws->nonfinite_out, now - was);
    fc_cu_count(&a.h.ws->saturated, now_sat - was_sat);
}

// ---- the API entries

// The round's checks, then its device entered (f readied by fc_cu_frame_init).
static int fetch_enter(const fc_cuda_fetch_args *a, fc_cu_frame *f, fc_err *err)
{
    if (a->h.x.fetch == NULL)
        return fc_fail(err, FC_ERR_STATE, "internal: the second round has no fetch buffer");
    if (a->h.geo.world < 1 || a->h.geo.world > FC_CUDA_MAX_WORLD)
        return fc_fail(err, FC_ERR_VALUE, "world must be in [1, %d], got %d", FC_CUDA_MAX_WORLD,
                       a->h.geo.world);
    return fc_cu_frame_enter(f, err);
}

int fc_cu_fetch_picks(fc_cuda_ctx *ctx, const fc_cuda_fetch_args *a, fc_err *err)
{
    int rc = FC_OK;
    fc_cu_frame f;
    fc_cu_frame_init(&f, a->h);
    const cudaStream_t s = f.s;
    if (a->h.x.fetch == NULL)
        return fc_fail(err, FC_ERR_STATE, "internal: the second round has no fetch buffer");
    FC_TRY(fc_cu_frame_enter(&f, err));
    if (a->n_picks > 0)
        FC_CHECK_CUDA(cudaMemcpyAsync(a->picks, fetch_own_picks(a->h.x.fetch), 4 * (size_t)a->n_picks,
                                      cudaMemcpyDeviceToDevice, s), err, error);
    if (a->kmax > a->n_picks)
        FC_CHECK_CUDA(cudaMemsetAsync(a->picks + a->n_picks, 0xFF, 4 * (size_t)(a->kmax - a->n_picks), s),
                      err, error);
    fc_cu_frame_done(ctx, &f);
error:
    return fc_cu_frame_leave(&f, rc);
}

int fc_cu_fetch_values(fc_cuda_ctx *ctx, const fc_cuda_fetch_args *a, fc_err *err)
{
    int rc = FC_OK;
    fc_cu_frame f;
    fc_cu_frame_init(&f, a->h);
    const cudaStream_t s = f.s;
    FC_TRY(fetch_enter(a, &f, err));
    f.t = fc_cu_timer_start(ctx, FC_TIME_COMPRESS, s);
    {
        const dim3 grid(fc_cu_blocks(a->kmax, FETCH_THREADS * 4), (unsigned)a->h.geo.world);
        FC_CHECK_CUDA(cudaMemsetAsync(a->h.ws->bad, 0, sizeof(unsigned int) * (size_t)a->h.geo.world, s),
                      err, error);
        fetch_check<<<grid, FETCH_THREADS, 0, s>>>(*a);
        FC_CHECK_LAUNCH(err, error);
        fetch_values<<<grid, FETCH_THREADS, 0, s>>>(*a);
        FC_CHECK_LAUNCH(err, error);
        if (a->residual != NULL) {
            fetch_residual_sq<<<1, 1, 0, s>>>(*a);
            FC_CHECK_LAUNCH(err, error);
        }
    }
    fc_cu_frame_done(ctx, &f);
error:
    return fc_cu_frame_leave(&f, rc);
}

int fc_cu_fetch_finish(fc_cuda_ctx *ctx, const fc_cuda_fetch_args *a, fc_err *err)
{
    int rc = FC_OK;
    fc_cu_frame f;
    fc_cu_frame_init(&f, a->h);
    const cudaStream_t s = f.s;
    FC_TRY(fetch_enter(a, &f, err));
    if (a->out_numel == 0)
        return fc_cu_frame_leave(&f, FC_OK);
    f.t = fc_cu_timer_start(ctx, FC_TIME_DECOMPRESS, s);
    {
        int64_t values = 0;
        for (int r = 0; r < a->h.geo.world; r++)
            values += fetch_sends(a->h.geo, r, a->h.geo.rank) ? a->n_picks : 0;
        FC_CHECK_CUDA(cudaMemsetAsync(&a->h.ws->passed, 0, sizeof(unsigned int), s), err, error);
        finish_passed<<<fc_cu_blocks(values, FETCH_THREADS * 4), FETCH_THREADS, 0, s>>>(*a, values);
        FC_CHECK_LAUNCH(err, error);
    }
    finish_dense<<<fc_cu_blocks(a->out_numel, FETCH_THREADS * 4), FETCH_THREADS, 0, s>>>(*a);
    FC_CHECK_LAUNCH(err, error);
    if (a->n_picks > 0) {
        finish_picks<<<fc_cu_blocks(a->n_picks, FETCH_THREADS), FETCH_THREADS, 0, s>>>(*a);
        FC_CHECK_LAUNCH(err, error);
    }
    fc_cu_frame_done(ctx, &f);
error:
    return fc_cu_frame_leave(&f, rc);
}

// Encode's side of the round: its per-chunk non-finite flags, which the values step reads
// after the decode has reused the workspace's (fc_cu_sketch.cu calls this at its encode).
__global__ void fetch_keep_flags(uint8_t *fetch, const unsigned int *bad, int world)
{
    for (int c = threadIdx.x; c < world; c += blockDim.x)
        fetch_flags(fetch)[c] = bad[c];
}

int fc_cu_fetch_keep_flags(uint8_t *fetch, const fc_cuda_ws *ws, int world, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    fetch_keep_flags<<<1, 256, 0, s>>>(fetch, ws->bad, world);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

// The owner's picks go here (the decode that picks writes them).
uint32_t *fc_cu_fetch_picks_at(uint8_t *fetch)
{
    return fetch_own_picks(fetch);
}
