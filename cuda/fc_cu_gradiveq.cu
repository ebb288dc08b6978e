// fc_cu_gradiveq.cu: kernels of `gradiveq` (m_gradiveq.c): slices of dim elements projected on
// the unit's basis U (dim x k, the device copy of the host's unit state, csrc/python/state_cuda.c),
// k coefficients per slice, each a thread's dot product in the CPU's order; on learn steps the
// covariance of the slices, each entry a serial sum in the CPU's order (the host sums it over
// ranks and solves the k x k eigenproblem, as on the CPU). Receivers sum the coefficients in rank
// order and decode once per element (the compressed domain).
//
// Shapes (issue 37): every kernel stages a tile of slices in shared memory with coalesced loads
// (g' read once per tile, not once per use), U sits in shared memory, and each float sum keeps the
// CPU's order. The covariance is dim^2 serial chains of one add per slice (the order the CPU's
// bytes fix): its blocks split the entries, each block streams every slice through shared memory
// (double-buffered, the next tile's loads in flight while this one is summed), so a chain step
// costs a shared-memory read and the add's latency, not two dependent global loads.
#include "fc_cu_sparse.cuh"

#define GVQ_THREADS 256
#define GVQ_TILE 2048        // elements of whole slices a block of the encode or decode stages
#define GVQ_U_SMEM 3072      // floats of U (rows padded to an odd stride) kept in shared memory
#define GVQ_COV_THREADS 128
#define GVQ_COV_TILE 4096    // floats of slices per staging buffer of the covariance (two)
#define GVQ_COV_PER (GVQ_COV_TILE / GVQ_COV_THREADS)

struct gvq_cfg {
    int m, k;
};

// Slices per tile of the encode and decode: as many as GVQ_TILE holds, a count whose elements
// are a multiple of 8 (each tile starts 8-aligned in its chunk, for the residual's 8-wide stores;
// 8 slices of the largest dim, 256, fill it).
__host__ __device__ __forceinline__ int gvq_tile_slices(int m)
{
    int ts = GVQ_TILE / m;
    while ((ts * m) % 8 != 0)
        ts--;
    return ts;
}

// U's row stride in shared memory: odd, so that lanes reading rows j (or slices s) at the same
// column hit distinct banks.
__host__ __device__ __forceinline__ int gvq_stride(int m)
{
    return m | 1;
}

// U into shared memory (rows at gvq_stride) when it fits, else read where it is; *stride is the
// row stride of what is returned. Every thread of the block calls it (a barrier).
__device__ __forceinline__ const float *gvq_stage_u(const gvq_cfg &g, const float *u, float *us, int *stride)
{
    const int mu = gvq_stride(g.m);
    if (g.k * mu > GVQ_U_SMEM) {
        *stride = g.m;
        return u;
    }
    for (int t = threadIdx.x; t < g.k * g.m; t += blockDim.x) {
        const int j = t / g.m;
        us[j * mu + (t - j * g.m)] = u[t];
    }
    __syncthreads();
    *stride = mu;
    return us;
}

// Slice s of element i (i / m) without a 64-bit division: a double product and a correction.
__device__ __forceinline__ int64_t gvq_slice_of(int64_t i, int m, double inv)
{
    int64_t s = (int64_t)((double)i * inv);
    s -= s * m > i;
    s += (s + 1) * m <= i;
    return s;
}

// A thread's walk over a tile's elements j = threadIdx.x, + GVQ_THREADS, ...: slice s and index i
// of element j (j = s * m + i) carried along, without a division per step.
struct gvq_walk {
    int j, s, i;
    int step_s, step_i, m;

    __device__ static gvq_walk start(int m)
    {
        const int tid = threadIdx.x, s = tid / m, step_s = GVQ_THREADS / m;
        return gvq_walk{tid, s, tid - s * m, step_s, GVQ_THREADS - step_s * m, m};
    }
    __device__ __forceinline__ void next()
    {
        j += GVQ_THREADS;
        s += step_s;
        i += step_i;
        if (i >= m) {
            i -= m;
            s++;
        }
    }
};

// ---- encode: coefficients and residual of a tile of slices per block iteration

// coef[s*k + j] = sum_i U[j][i] * v_s[i] from 0.0f, i ascending (v zero past the chunk), as the
// CPU's `d += u * v`; a coefficient beyond fp32's largest / k (so that U c decodes finite) or
// not finite is m_gradiveq.c's rare case: the dot product again in double, saturated at that
// bound when every v is finite, else the canonical NaN. With error feedback (or a sample) the
// residual follows from the same tile: e = x + (-1 * d), d = sum_j U[j][i] * coef[s*k + j] from
// 0.0f (the CPU's decode_add with alpha = -1), under fc_cu_residual's rules.
//
// Per tile: g' staged once (xs contiguous for the residual's 8-wide reads, vs at an odd slice
// stride for the coefficients, whose lanes read several slices at one column), coefficients from
// shared memory into cs and the payload (coalesced), then d for consecutive elements per lane
// (U's columns conflict-free) into rs, then the sink 8 elements a lane.
__global__ void __launch_bounds__(GVQ_THREADS) gvq_encode_tiles(fc_cu_enc e, gvq_cfg g, const float *u)
{
    __shared__ float xs[GVQ_TILE];
    __shared__ float vs[GVQ_TILE + GVQ_TILE / 2]; // slices at stride m | 1; later rs, the decode
    __shared__ float cs[GVQ_TILE];                // the tile's coefficients (ts * k <= ts * m)
    __shared__ float us[GVQ_U_SMEM];
    const int c = blockIdx.y;
    int64_t start, n;
    float *coef = (float *)fc_cu_enc_body(e, c, &start, &n);
    if (coef == NULL) // the whole block: no barrier skipped
        return;
    const int m = g.m, k = g.k, mv = gvq_stride(m), ts = gvq_tile_slices(m);
    int ustr;
    const float *uu = gvq_stage_u(g, u, us, &ustr);
    const float lim = fc_bits_f32(FC_MAX_BITS) / (float)k;
    fc_cu_res_sink sink = fc_cu_res_sink::make(e, start, fc_cu_sampled(e, c));
    const int64_t ns = (n + m - 1) / m, tiles = (ns + ts - 1) / ts;
    const int tid = threadIdx.x;
    const gvq_walk walk = gvq_walk::start(m);
    for (int64_t tl = blockIdx.x; tl < tiles; tl += gridDim.x) {
        const int64_t s0 = tl * ts, lo0 = s0 * m;
        const int cnt = (int)(ns - s0 < ts ? ns - s0 : ts), len = cnt * m;
        for (gvq_walk w = walk; w.j < len; w.next()) {
            const float v = lo0 + w.j < n ? e.src.x(start + lo0 + w.j) : 0.0f;
            xs[w.j] = v;
            vs[w.s * mv + w.i] = v;
        }
        __syncthreads();
        for (int t = tid; t < cnt * k; t += GVQ_THREADS) {
            const int s = t / k, j = t - s * k;
            const float *v = vs + s * mv, *uj = uu + j * ustr;
            float d = 0.0f;
            for (int i = 0; i < m; i++)
                d += uj[i] * v[i];
            if (!(fc_bits_f32(fc_abs_bits(d)) <= lim)) {
                double ed = 0;
                int finite = 1;
                for (int i = 0; i < m; i++) {
                    ed += (double)uj[i] * v[i];
                    finite &= fc_abs_bits(v[i]) < FC_INF_BITS;
                }
                d = !finite ? fc_canon_nan(d) : ed > lim ? lim : ed < -lim ? -lim : (float)ed;
            }
            cs[t] = d;
            coef[s0 * k + t] = d;
        }
        __syncthreads();
        if (sink.on()) { // uniform: the chunk's
            float *rs = vs; // the slices are read: d per element of the tile, contiguous
            for (gvq_walk w = walk; w.j < len; w.next()) {
                float d = 0.0f;
                for (int q = 0; q < k; q++)
                    d += uu[q * ustr + w.i] * cs[w.s * k + q];
                rs[w.j] = -1.0f * d;
            }
            __syncthreads();
            for (int j = 8 * tid; j < len; j += 8 * GVQ_THREADS) {
                const int valid = fc_cu_valid8(n - lo0, j);
                float x[8], r[8];
                for (int q = 0; q < 8; q++) { // the tile's 8-aligned elements: whole groups of 8
                    x[q] = xs[j + q];
                    r[q] = rs[j + q];
                }
                sink.put8(lo0 + j, valid, x, r);
            }
            __syncthreads();
        }
    }
    if (sink.on()) {
        sink.sum.flush(e.ws, sink.ef ? e.unit_slot : -1, sink.sample);
        fc_cu_count(&e.ws->saturated, sink.sat);
    }
}

// ---- learn steps: the covariance

// The slices of the sent chunks in order, a tile of up to `ts` slices at a time (a tile never
// spans two chunks). Every thread of a block walks the same tiles.
struct gvq_cursor {
    int c;           // chunk; geo.world once past the last
    int64_t start, n; // its span
    int64_t s0;       // the tile's first slice in the chunk

    __device__ __forceinline__ void settle(const fc_cuda_geom &geo, int m)
    {
        while (c < geo.world && s0 * m >= n) {
            c++;
            s0 = 0;
            n = 0;
            if (c < geo.world) {
                fc_cu_span(geo, c, &start, &n);
                if (!fc_cu_sent(geo, c, n))
                    n = 0;
            }
        }
    }
    __device__ __forceinline__ bool on(const fc_cuda_geom &geo) const { return c < geo.world; }
    __device__ __forceinline__ int slices(int m, int ts) const
    {
        const int64_t left = (n + m - 1) / m - s0;
        return (int)(left < ts ? left : ts);
    }
};

// The tile at k into registers: element j = threadIdx.x + r * GVQ_COV_THREADS of its slices.
__device__ __forceinline__ void gvq_cov_load(const fc_cu_enc &e, const gvq_cursor &k, int m, int ts,
                                             float pre[GVQ_COV_PER])
{
    const int len = k.slices(m, ts) * m;
    const int64_t lo0 = k.s0 * m;
#pragma unroll
    for (int r = 0; r < GVQ_COV_PER; r++) {
        const int j = threadIdx.x + r * GVQ_COV_THREADS;
        pre[r] = j < len && lo0 + j < k.n ? e.src.x(k.start + lo0 + j) : 0.0f;
    }
}

__device__ __forceinline__ void gvq_cov_store(const float pre[GVQ_COV_PER], float *buf)
{
#pragma unroll
    for (int r = 0; r < GVQ_COV_PER; r++)
        buf[threadIdx.x + r * GVQ_COV_THREADS] = pre[r];
}

// One pass of the covariance's chains over every slice (gvq_covariance): the block's threads
// stream the tiles through shared memory (the next tile loads into registers while this one is
// summed, one barrier per tile); the entries `on` add v_s[p] * v_s[q] into acc in slice order,
// with plain float products and sums (SAT 0) or fc_mul_sat / fc_add_sat's (SAT 1).
template <int E, bool SAT>
__device__ __forceinline__ void gvq_cov_pass(const fc_cu_enc &e, int m, float (*buf)[GVQ_COV_TILE], int p,
                                             const int col[E], const bool on[E], float acc[E])
{
    const int ts = GVQ_COV_TILE / m;
    bool any = false;
#pragma unroll
    for (int r = 0; r < E; r++)
        any |= on[r];
    int64_t sat = 0; // a method state's saturation: not counted on the device, as the codecs'
    gvq_cursor cur = {-1, 0, 0, 0};
    cur.settle(e.geo, m);
    float pre[GVQ_COV_PER];
    if (cur.on(e.geo)) {
        gvq_cov_load(e, cur, m, ts, pre);
        gvq_cov_store(pre, buf[0]);
    }
    __syncthreads();
    for (int b = 0; cur.on(e.geo); b ^= 1) {
        gvq_cursor nxt = cur;
        nxt.s0 += ts;
        nxt.settle(e.geo, m);
        if (nxt.on(e.geo)) // in flight while this tile is summed
            gvq_cov_load(e, nxt, m, ts, pre);
        if (any) {
            const int cnt = cur.slices(m, ts);
            const float *v = buf[b];
#pragma unroll 4
            for (int s = 0; s < cnt; s++, v += m) {
                const float vp = v[p];
#pragma unroll
                for (int r = 0; r < E; r++) {
                    if (SAT)
                        acc[r] = on[r] ? fc_add_sat(acc[r], fc_mul_sat(vp, v[col[r]], &sat), &sat) : acc[r];
                    else
                        acc[r] = acc[r] + vp * v[col[r]];
                }
            }
        }
        if (nxt.on(e.geo)) // buf[b ^ 1] was last read before the previous barrier
            gvq_cov_store(pre, buf[b ^ 1]);
        __syncthreads();
        cur = nxt;
    }
}

// cov[p][q] += v_s[p] * v_s[q] over the sent chunks in order, slices in order, a product or sum
// beyond fp32 saturated (fc_mul_sat, fc_add_sat: it is a unit state): one serial chain per entry,
// in the CPU's order. A thread owns E entries of row p (columns q0 + r * ceil(m / E): lanes at
// consecutive columns, conflict-free); the block's threads split the entries and the block
// streams every slice through shared memory.
//
// The chains run with plain float products and sums first: each step then costs an add's
// latency, not the saturation checks'. That is the saturating chain's result whenever it ends
// finite: the two agree up to their first difference, which is a product or sum that overflowed
// to +-Inf (or a NaN/Inf input, which both carry), and from there the plain chain stays Inf or
// NaN (Inf + finite is Inf, Inf - Inf and NaN + x are NaN). An entry that ends non-finite (fp32
// overflow, NaN/Inf in g', a NaN already in the state: rare) is summed again from its old value
// with fc_mul_sat / fc_add_sat, in a second pass of its block.
template <int E>
__global__ void __launch_bounds__(GVQ_COV_THREADS, 1) gvq_covariance(fc_cu_enc e, gvq_cfg g, float *cov)
{
    __shared__ float buf[2][GVQ_COV_TILE];
    __shared__ int again;
    const int m = g.m, qt = (m + E - 1) / E;
    const int t = blockIdx.x * GVQ_COV_THREADS + threadIdx.x;
    const int p = t / qt < m ? t / qt : m - 1, q0 = t - (t / qt) * qt;
    int col[E];
    bool on[E], redo[E];
    float acc[E];
    if (threadIdx.x == 0)
        again = 0; // read after the pass's barriers
#pragma unroll
    for (int r = 0; r < E; r++) {
        const int q = q0 + r * qt;
        on[r] = t / qt < m && q < m;
        col[r] = q < m ? q : m - 1; // a column past the matrix reads a real one, stores nothing
        acc[r] = on[r] ? cov[p * m + q] : 0.0f;
    }
    gvq_cov_pass<E, false>(e, m, buf, p, col, on, acc);
    bool any = false;
#pragma unroll
    for (int r = 0; r < E; r++) {
        redo[r] = on[r] && !(fc_abs_bits(acc[r]) < FC_INF_BITS);
        any |= redo[r];
    }
    if (any)
        again = 1;
    __syncthreads();
    if (again) { // the whole block (a barrier apart): the saturating chains of the entries that need them
#pragma unroll
        for (int r = 0; r < E; r++)
            if (redo[r])
                acc[r] = cov[p * m + q0 + r * qt];
        gvq_cov_pass<E, true>(e, m, buf, p, col, redo, acc);
    }
#pragma unroll
    for (int r = 0; r < E; r++)
        if (on[r])
            cov[p * m + q0 + r * qt] = acc[r];
}

// ---- decode

// The receiver's coefficients summed over the senders in rank order (fc_aggregate_add_f32:
// saturating, from 0.0f), one thread per coefficient of the own chunk: each payload read once.
__global__ void gvq_aggregate(fc_cu_dec d, int64_t coefs, float *agg)
{
    int64_t sat = 0; // the senders' sum saturating: not counted
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < coefs; t += stride) {
        agg[t] = fc_cu_fold_senders(d.geo, [&](float a, int r) {
            const float *coef = (const float *)(d.recv + fc_cu_recv_off(d.geo, r, d.slot) + FC_HEADER_BYTES);
            return fc_add_sat(a, coef[t], &sat);
        });
    }
}

// The receiver: acc = (0 + own) + 1 * d, d the decode of the summed coefficients (gvq_decode_agg:
// sum_j U[j][t] * agg[s*k + j] from 0.0f), through the shared output pass; a rejected payload
// poisons the sum. agg NULL: no senders.
__global__ void __launch_bounds__(GVQ_THREADS) gvq_decode(fc_cu_dec d, gvq_cfg g, const float *u, const float *agg)
{
    __shared__ float us[GVQ_U_SMEM];
    int ustr;
    const float *uu = gvq_stage_u(g, u, us, &ustr);
    const int rejected = fc_cu_any_rejected(d);
    const double inv = 1.0 / (double)g.m;
    fc_cu_decode_out(d, [&](int64_t i, float acc) {
        if (agg == NULL)
            return acc;
        const int64_t s = gvq_slice_of(i, g.m, inv);
        const int t = (int)(i - s * g.m);
        const float *a = agg + s * g.k;
        float dd = 0.0f;
        for (int j = 0; j < g.k; j++)
            dd += uu[j * ustr + t] * a[j];
        return acc + (rejected ? fc_bits_f32(FC_NAN_BITS) : 1.0f * dd);
    });
}

// decompress(): out += alpha * d of the one payload's coefficients (rank 0's), d = sum_j U[j][t] *
// coef[s*k + j] from 0.0f, as the CPU's decode_add; a rejected payload makes every element NaN.
// A tile of slices at a time: its coefficients staged once, U in shared memory.
__global__ void __launch_bounds__(GVQ_THREADS) gvq_add(fc_cu_dec d, gvq_cfg g, const float *u)
{
    __shared__ float us[GVQ_U_SMEM];
    __shared__ float cs[GVQ_TILE];
    int ustr;
    const float *uu = gvq_stage_u(g, u, us, &ustr);
    const float *coef = (const float *)(d.recv + FC_HEADER_BYTES);
    float *out = (float *)d.out;
    const int m = g.m, k = g.k, ts = gvq_tile_slices(m);
    const int64_t n = d.out_numel, ns = (n + m - 1) / m, tiles = (ns + ts - 1) / ts;
    const int bad = d.bad[0] != 0;
    const int tid = threadIdx.x;
    const gvq_walk walk = gvq_walk::start(m);
    for (int64_t tl = blockIdx.x; tl < tiles; tl += gridDim.x) {
        const int64_t s0 = tl * ts, lo0 = s0 * m;
        const int cnt = (int)(ns - s0 < ts ? ns - s0 : ts);
        if (!bad)
            for (int t = tid; t < cnt * k; t += GVQ_THREADS)
                cs[t] = coef[s0 * k + t];
        __syncthreads();
        const int len = (int)(n - lo0 < (int64_t)cnt * m ? n - lo0 : (int64_t)cnt * m);
        for (gvq_walk w = walk; w.j < len; w.next()) {
            if (bad) {
                fc_cu_add_canon(out + lo0 + w.j, fc_bits_f32(FC_NAN_BITS));
            } else {
                float dd = 0.0f;
                for (int q = 0; q < k; q++)
                    dd += uu[q * ustr + w.i] * cs[w.s * k + q];
                fc_cu_add_canon(out + lo0 + w.j, d.alpha * dd);
            }
        }
        __syncthreads();
    }
}

// ---- the method

// The config; ustate (the unit's device state) is checked by the work, not by the carves, which
// also size the scratch before the call has its state.
static int config(const fc_cuda_method_cfg *m, gvq_cfg *g, fc_err *err)
{
    const fc_gradiveq_cfg *k = fc_cu_cfg_of<fc_gradiveq_cfg>(m);
    g->m = (int)k->dim;
    g->k = (int)k->k;
    if (g->m < 2 || g->m > 256 || g->k < 1 || g->k > g->m)
        return fc_fail(err, FC_ERR_VALUE, "gradiveq dim must be in [2, 256] and k in [1, dim], got "
                       "%d and %d", g->m, g->k);
    return FC_OK;
}

static int have_state(const float *ustate, fc_err *err)
{
    return ustate != NULL ? FC_OK
                          : fc_fail(err, FC_ERR_STATE, "internal: gradiveq on CUDA without the unit's device state");
}

// The encode takes no scratch.
struct gvq_enc_parts {
    int none;
};

static int carve_encode(const fc_cuda_encode_args *a, fc_cu_arena &ar, gvq_cfg *g, gvq_enc_parts *p, fc_err *err)
{
    (void)ar;
    (void)p;
    return config(&a->h.m, g, err);
}

// The collective's decode sums the senders' coefficients first: one float per coefficient of
// the own chunk (decompress() decodes its one payload directly).
struct gvq_dec_parts {
    float *agg;
};

static int gvq_senders(const fc_cuda_geom &geo)
{
    int64_t start, n;
    fc_cu_span(geo, geo.rank, &start, &n);
    return n > 0 ? geo.world - (geo.skip_own ? 1 : 0) : 0;
}

static int carve_decode(const fc_cuda_decode_args *a, fc_cu_arena &ar, gvq_cfg *g, gvq_dec_parts *p, fc_err *err)
{
    const int rc = config(&a->h.m, g, err);
    if (rc != FC_OK)
        return rc;
    int64_t start, n;
    fc_cu_span(a->h.geo, a->h.geo.rank, &start, &n);
    p->agg = gvq_senders(a->h.geo) > 0 ? ar.take<float>((n + g->m - 1) / g->m * g->k) : NULL;
    return FC_OK;
}

static int run_encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, const gvq_cfg &g, gvq_enc_parts &p,
                      cudaStream_t s, fc_err *err)
{
    (void)p;
    int rc = FC_OK;
    const float *u = a->h.x.ustate;
    if (have_state(u, err) != FC_OK)
        return FC_ERR_STATE;
    const int64_t slices = (a->h.geo.per + g.m - 1) / g.m;
    if (a->h.x.learn) { // before the residual changes what g' reads
        float *cov = a->h.x.ustate + (int64_t)g.m * g.k;
        if (g.m <= 128) { // one entry a thread: up to 128 blocks, one chain each
            gvq_covariance<1><<<fc_cu_blocks((int64_t)g.m * g.m, GVQ_COV_THREADS), GVQ_COV_THREADS, 0, s>>>(*e, g, cov);
        } else { // four a thread: at most 16384 threads, 128 blocks
            const int64_t threads = (int64_t)g.m * ((g.m + 3) / 4);
            gvq_covariance<4><<<fc_cu_blocks(threads, GVQ_COV_THREADS), GVQ_COV_THREADS, 0, s>>>(*e, g, cov);
        }
        FC_CHECK_LAUNCH(err, error);
    }
    gvq_encode_tiles<<<fc_cu_grid(slices, gvq_tile_slices(g.m), a->h.geo.world), GVQ_THREADS, 0, s>>>(*e, g, u);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

static int run_decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, const gvq_cfg &g, gvq_dec_parts &p,
                      cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    int64_t start, n;
    fc_cu_span(a->h.geo, a->h.geo.rank, &start, &n);
    const float *u = a->h.x.ustate;
    if (have_state(u, err) != FC_OK)
        return FC_ERR_STATE;
    if (d->add) { // decompress(): one payload decoded alone
        const int64_t slices = (d->out_numel + g.m - 1) / g.m;
        if (slices > 0) {
            gvq_add<<<fc_cu_blocks(slices, gvq_tile_slices(g.m)), GVQ_THREADS, 0, s>>>(*d, g, u);
            FC_CHECK_LAUNCH(err, error);
        }
        return FC_OK;
    }
    if (d->out_numel <= 0)
        return FC_OK;
    {
        const int senders = gvq_senders(a->h.geo);
        const int64_t coefs = (n + g.m - 1) / g.m * g.k;
        if (senders > 0) {
            gvq_aggregate<<<fc_cu_blocks(coefs, GVQ_THREADS * 4), GVQ_THREADS, 0, s>>>(*d, coefs, p.agg);
            FC_CHECK_LAUNCH(err, error);
        }
        gvq_decode<<<fc_cu_grid(d->out_numel, GVQ_THREADS * 4, 1), GVQ_THREADS, 0, s>>>(*d, g, u,
                                                                                    senders > 0 ? p.agg : NULL);
        FC_CHECK_LAUNCH(err, error);
    }
error:
    return rc;
}

extern const fc_cu_method fc_cu_gradiveq =
    fc_cu_carving<gvq_cfg, gvq_enc_parts, carve_encode, run_encode, gvq_dec_parts, carve_decode, run_decode>::entry(
        FC_ID_GRADIVEQ, 0);
