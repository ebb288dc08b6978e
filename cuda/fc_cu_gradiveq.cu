// fc_cu_gradiveq.cu: kernels of `gradiveq` (m_gradiveq.c): slices of dim elements projected on
// the unit's basis U (dim x k, the device copy of the host's unit state, csrc/python/state_cuda.c),
// k coefficients per slice, each a thread's dot product in the CPU's order; on learn steps the
// covariance of the slices, one thread per entry adding slice after slice in the CPU's order (the
// host sums it over ranks and solves the k x k eigenproblem, as on the CPU). Receivers sum the
// coefficients in rank order and decode once per element (the compressed domain).
#include "fc_cu_dense.cuh"

#define GVQ_THREADS 256

struct gvq_cfg {
    int m, k;
};

// coef[s*k + j] = sum_i U[j][i] * v_s[i] from 0.0f, i ascending (v zero past the chunk), as the
// CPU's `d += u * v`; a coefficient beyond fp32's largest / k (so that U c decodes finite) or
// not finite is m_gradiveq.c's rare case: the dot product again in double, saturated at that
// bound when every v is finite, else the canonical NaN.
__global__ void gvq_coefs(fc_cu_enc e, gvq_cfg g, const float *u)
{
    const int c = blockIdx.y;
    int64_t start, n;
    float *coef = (float *)fc_cu_enc_body(e, c, &start, &n);
    if (coef == NULL)
        return;
    const float lim = fc_bits_f32(FC_MAX_BITS) / (float)g.k;
    const int64_t total = (n + g.m - 1) / g.m * g.k;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        const int64_t s = t / g.k, lo = s * g.m;
        const int j = (int)(t - s * g.k);
        float d = 0.0f;
        for (int i = 0; i < g.m; i++) {
            const float v = lo + i < n ? e.src.x(start + lo + i) : 0.0f;
            d += u[j * g.m + i] * v;
        }
        if (!(fc_bits_f32(fc_abs_bits(d)) <= lim)) {
            double ed = 0;
            int finite = 1;
            for (int i = 0; i < g.m; i++) {
                const float v = lo + i < n ? e.src.x(start + lo + i) : 0.0f;
                ed += (double)u[j * g.m + i] * v;
                finite &= fc_abs_bits(v) < FC_INF_BITS;
            }
            d = !finite ? fc_canon_nan(d) : ed > lim ? lim : ed < -lim ? -lim : (float)ed;
        }
        coef[t] = d;
    }
}

// e = x + (-1 * d), d = sum_j U[j][i] * coef[s*k + j]: the CPU's decode_add with alpha = -1,
// under fc_cu_residual's rules (always replaced, saturated; the passed-chunk rule).
__global__ void gvq_residual(fc_cu_enc e, gvq_cfg g, const float *u)
{
    const int c = blockIdx.y;
    int64_t start, n;
    const float *coef = (const float *)fc_cu_enc_body(e, c, &start, &n);
    if (coef == NULL)
        return;
    fc_cu_res_sink sink = fc_cu_res_sink::make(e, start, fc_cu_sampled(e, c));
    if (!sink.on())
        return;
    const fc_cu_chunk_x x = fc_cu_chunk_x::make(e.src, start);
    const int64_t stride = 8 * (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = 8 * ((int64_t)blockIdx.x * blockDim.x + threadIdx.x); i < n; i += stride) {
        float v[8], r[8];
        const int cnt = fc_cu_valid8(n, i);
        x.load8(i, cnt, v);
        for (int q = 0; q < 8; q++) {
            if (q >= cnt) { // past the chunk: no slice to read
                r[q] = 0.0f;
                continue;
            }
            const int64_t a = i + q, s = a / g.m;
            const int t = (int)(a - s * g.m);
            float d = 0.0f;
            for (int j = 0; j < g.k; j++)
                d += u[j * g.m + t] * coef[s * g.k + j];
            r[q] = -1.0f * d;
        }
        sink.put8(i, cnt, v, r);
    }
    sink.sum.flush(e.ws, sink.ef ? e.unit_slot : -1, sink.sample);
    fc_cu_count(&e.ws->saturated, sink.sat);
}

// Learn steps: cov[p][q] += v_s[p] * v_s[q] over the sent chunks in order, slices in order, a
// product or sum beyond fp32 saturated (fc_mul_sat, fc_add_sat: it is a unit state).
__global__ void gvq_covariance(fc_cu_enc e, gvq_cfg g, float *cov)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (int64_t)g.m * g.m)
        return;
    const int p = (int)(t / g.m), q = (int)(t - (int64_t)p * g.m);
    float acc = cov[t];
    int64_t sat = 0; // a method state's saturation: not counted on the device, as the codecs'
    for (int c = 0; c < e.geo.world; c++) {
        int64_t start, n;
        fc_cu_span(e.geo, c, &start, &n);
        if (!fc_cu_sent(e.geo, c, n))
            continue;
        for (int64_t lo = 0; lo < n; lo += g.m) {
            const float vp = lo + p < n ? e.src.x(start + lo + p) : 0.0f;
            const float vq = lo + q < n ? e.src.x(start + lo + q) : 0.0f;
            acc = fc_add_sat(acc, fc_mul_sat(vp, vq, &sat), &sat);
        }
    }
    cov[t] = acc;
}

// The receiver: acc = (0 + own) + 1 * d, d the decode of the coefficients summed over the
// senders in rank order (fc_aggregate_add_f32: saturating, then gvq_decode_agg).
__global__ void gvq_decode(fc_cu_dec d, gvq_cfg g, const float *u, int senders)
{
    fc_cu_decode_out(d, [&](int64_t i, float acc) {
        int64_t agg_sat = 0; // the senders' sum saturating: not counted
        if (senders > 0) {
            const int64_t s = i / g.m;
            const int t = (int)(i - s * g.m);
            float dd = 0.0f;
            int rejected = 0;
            for (int j = 0; j < g.k; j++) {
                float agg = 0.0f;
                for (int r = 0; r < d.geo.world; r++) {
                    if (d.geo.skip_own && r == d.geo.rank)
                        continue;
                    rejected |= d.bad[r] != 0;
                    const float *coef = (const float *)(d.recv + fc_cu_recv_off(d.geo, r, d.slot) + FC_HEADER_BYTES);
                    agg = fc_add_sat(agg, coef[s * g.k + j], &agg_sat);
                }
                dd += u[j * g.m + t] * agg;
            }
            acc += rejected ? fc_bits_f32(FC_NAN_BITS) : 1.0f * dd; // a rejected payload poisons
        }
        return acc;
    });
}

// decompress(): out += alpha * d of the one payload's coefficients (rank 0's), d = sum_j U[j][t] *
// coef[s*k + j] from 0.0f, as the CPU's decode_add; a rejected payload makes every element NaN.
__global__ void gvq_add(fc_cu_dec d, gvq_cfg g, const float *u)
{
    const float *coef = (const float *)(d.recv + FC_HEADER_BYTES);
    float *out = (float *)d.out;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < d.out_numel; i += stride) {
        if (d.bad[0] != 0) {
            fc_cu_add_canon(out + i, fc_bits_f32(FC_NAN_BITS));
            continue;
        }
        const int64_t s = i / g.m;
        const int t = (int)(i - s * g.m);
        float dd = 0.0f;
        for (int j = 0; j < g.k; j++)
            dd += u[j * g.m + t] * coef[s * g.k + j];
        fc_cu_add_canon(out + i, d.alpha * dd);
    }
}

static int config(const fc_cuda_method_cfg *m, const float *ustate, gvq_cfg *g, fc_err *err)
{
    const fc_gradiveq_cfg *k = fc_cu_cfg_of<fc_gradiveq_cfg>(m);
    g->m = (int)k->dim;
    g->k = (int)k->k;
    if (g->m < 2 || g->m > 256 || g->k < 1 || g->k > g->m)
        return fc_fail(err, FC_ERR_VALUE, "gradiveq dim must be in [2, 256] and k in [1, dim], got "
                       "%d and %d", g->m, g->k);
    if (ustate == NULL)
        return fc_fail(err, FC_ERR_STATE, "internal: gradiveq on CUDA without the unit's device state");
    return FC_OK;
}

static int encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    gvq_cfg g;
    FC_TRY(config(&a->h.m, a->h.x.ustate, &g, err));
    {
        const float *u = a->h.x.ustate;
        const int64_t coefs = (a->h.geo.per + g.m - 1) / g.m * g.k;
        if (a->h.x.learn) { // before the residual changes what g' reads
            gvq_covariance<<<fc_cu_grid((int64_t)g.m * g.m, GVQ_THREADS, 1), GVQ_THREADS, 0, s>>>(
                *e, g, a->h.x.ustate + (int64_t)g.m * g.k);
            FC_CHECK_LAUNCH(err, error);
        }
        gvq_coefs<<<fc_cu_grid(coefs, GVQ_THREADS * 4, a->h.geo.world), GVQ_THREADS, 0, s>>>(*e, g, u);
        FC_CHECK_LAUNCH(err, error);
        if (e->res != NULL || e->sample) {
            gvq_residual<<<fc_cu_grid(a->h.geo.per, GVQ_THREADS * 8, a->h.geo.world), GVQ_THREADS, 0, s>>>(*e, g, u);
            FC_CHECK_LAUNCH(err, error);
        }
    }
error:
    return rc;
}

static int decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    gvq_cfg g;
    int64_t start, n;
    FC_TRY(config(&a->h.m, a->h.x.ustate, &g, err));
    fc_cu_span(a->h.geo, a->h.geo.rank, &start, &n);
    {
        const int senders = n > 0 ? a->h.geo.world - (a->h.geo.skip_own ? 1 : 0) : 0;
        if (d->add) { // decompress(): one payload decoded alone
            gvq_add<<<fc_cu_grid(d->out_numel, GVQ_THREADS * 4, 1), GVQ_THREADS, 0, s>>>(*d, g, a->h.x.ustate);
            FC_CHECK_LAUNCH(err, error);
            return FC_OK;
        }
        if (d->out_numel > 0) {
            gvq_decode<<<fc_cu_grid(d->out_numel, GVQ_THREADS * 4, 1), GVQ_THREADS, 0, s>>>(*d, g, a->h.x.ustate,
                                                                                         senders);
            FC_CHECK_LAUNCH(err, error);
        }
    }
error:
    return rc;
}

extern const fc_cu_method fc_cu_gradiveq = {FC_ID_GRADIVEQ, encode, decode, NULL};
