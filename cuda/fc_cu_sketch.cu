// fc_cu_sketch.cu: kernels of `sketch` (m_sketch.c). The CPU adds each bucket's terms in index
// order; the device builds the same tables (fc_cu_sketch_table.cu: a stable two-level partition of
// the terms by bucket, each bucket's chain walked in index order; tables wider than SKT_MAX_COLS
// here, through CUB's stable radix sort of (bucket, term) pairs and a thread per bucket): the
// CPU's table, bit for bit. Estimates are the CPU's median over rows, the heavy hitters the top-k
// selection of fc_cu_select.cu. Receivers sum the senders' tables in rank order (the compressed
// domain) and decode once; with second_round the owner only picks (fc_cu_fetch.cu does the rest).
#include "fc_cu_sketch.cuh"

#define SK_THREADS 256

// n: the length of the widest chunk the call handles (a unit's chunks: ceil(N / W); a decode:
// the own chunk's).
static int config(const fc_cuda_method_cfg *m, int64_t n, sk_cfg *c, fc_err *err)
{
    const fc_sketch_cfg *k = fc_cu_cfg_of<fc_sketch_cfg>(m);
    c->rows = (int)k->rows;
    c->ccfg = k->cols;
    c->kr.k = k->k;
    c->kr.ratio = 1.0;
    c->second = k->second_round != 0;
    if (c->rows < 1 || c->rows > SK_MAX_ROWS || c->ccfg < 0 || c->ccfg > (1 << 26))
        return fc_fail(err, FC_ERR_VALUE, "sketch rows must be in [1, %d] and cols in [0, 2^26], got %d and %lld",
                       SK_MAX_ROWS, c->rows, (long long)c->ccfg);
    c->cols = sk_width(*c, n);
    return FC_OK;
}

// ---- encode: the table of every sent chunk (fc_cu_sketch_table.cu); tables wider than
// SKT_MAX_COLS (a `cols` set above it) here, a row and a group of chunks at a time, through a
// stable radix sort of (bucket, term) pairs

// Chunks [g0, g0 + gc) lie in elements [a, b) of the unit; their pairs (c - g0) * cols + col,
// the term sign * x in index order; elements of a chunk that is not sent sort last.
__global__ void sk_pairs(fc_cu_enc e, sk_cfg cfg, int j, int g0, int gc, int64_t a, int64_t b, fc_rng shared,
                         uint32_t *keys, float *terms)
{
    const double inv = 1.0 / (double)(e.geo.per > 0 ? e.geo.per : 1);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = a + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < b; i += stride) {
        const int c = fc_cu_chunk_of(i, e.geo.per, inv);
        int64_t start, n;
        fc_cu_span(e.geo, c, &start, &n);
        if (!fc_cu_sent(e.geo, c, n)) {
            keys[i - a] = (uint32_t)(gc * cfg.cols);
            terms[i - a] = 0.0f;
            continue;
        }
        const uint32_t h = fc_sketch_hash((uint64_t)(i - start), sk_row_key(shared, c, j));
        keys[i - a] = (uint32_t)((c - g0) * cfg.cols) + fc_sketch_col(h, (uint32_t)sk_width(cfg, n));
        terms[i - a] = fc_sketch_sign(h) * e.src.x(i);
    }
}

// One thread per bucket of each chunk of the group: its terms in index order from 0.0f, each
// added as the CPU's `row[col] = fc_add_sat(row[col], term)` (a bucket beyond fp32 saturates;
// the codec's own count, not kept on the device), a NaN bucket written as the canonical NaN.
__global__ void sk_buckets(fc_cu_enc e, sk_cfg cfg, int j, int g0, int gc, const uint32_t *keys, const float *terms,
                           int64_t count)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < gc * cfg.cols; t += stride) {
        const int c = g0 + (int)(t / cfg.cols);
        int64_t start, n;
        fc_cu_span(e.geo, c, &start, &n);
        const int64_t col = t - (int64_t)(c - g0) * cfg.cols, width = sk_width(cfg, n);
        if (!fc_cu_sent(e.geo, c, n) || col >= width) // a shorter last chunk: a narrower table
            continue;
        const int64_t lo = fc_cu_lower_bound(keys, count, (uint32_t)t), hi = fc_cu_lower_bound(keys, count, (uint32_t)t + 1);
        float acc = 0.0f;
        int64_t sat = 0;
        for (int64_t q = lo; q < hi; q++)
            acc = fc_add_sat(acc, terms[q], &sat);
        float *table = (float *)(e.send + fc_cu_send_off(e.geo, c) + FC_HEADER_BYTES);
        table[j * width + col] = fc_canon_nan(acc);
    }
}

// ---- estimates: every coordinate's median over rows reads one random bucket per row. From
// global memory that is a gather of 32 cache lines per warp and row; from shared memory a few
// bank conflicts. So a block copies the table there when it fits (48 KiB: the default 3 x 4096),
// and estimates SK_EST_PER coordinates a thread, which pays for the copy and the row keys (one
// draw per 4 rows, kept in the thread).

#define SK_EST_SMEM 12288
#define SK_EST_PER 32

// The table t (rows x cols) where the block reads it: in tab, copied, when it fits (every thread
// calls it: a barrier), else t itself.
__device__ __forceinline__ const float *sk_est_table(const float *t, int rows, int64_t cols, float *tab)
{
    if ((int64_t)rows * cols > SK_EST_SMEM)
        return t;
    for (int64_t q = threadIdx.x; q < (int64_t)rows * cols; q += blockDim.x)
        tab[q] = t[q];
    __syncthreads();
    return tab;
}

// Chunk c's row keys (sk_row_key's draws, four rows a draw) into keys.
__device__ __forceinline__ void sk_thread_keys(fc_rng shared, int c, int rows, uint32_t keys[SK_MAX_ROWS])
{
    shared.chunk += (uint32_t)c;
    for (int j = 0; j < rows; j += 4) {
        const fc_u32x4 d = fc_rng_draw4(&shared, 0xFFFFFF00u + (uint32_t)(j >> 2));
        for (int q = 0; q < 4 && j + q < rows; q++)
            keys[j + q] = d.v[q];
    }
}

// The estimates of every sent chunk from its own table (the sender's residual decodes it alone).
__global__ void sk_own_estimates(fc_cu_enc e, sk_cfg cfg, fc_rng shared, float *est)
{
    __shared__ float tab[SK_EST_SMEM];
    const int c = blockIdx.y;
    int64_t start, n;
    const float *t = (const float *)fc_cu_enc_body(e, c, &start, &n);
    if (t == NULL)
        return;
    const int64_t w = sk_width(cfg, n);
    const float *tt = sk_est_table(t, cfg.rows, w, tab);
    uint32_t keys[SK_MAX_ROWS];
    sk_thread_keys(shared, c, cfg.rows, keys);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        est[start + i] = fc_sketch_estimate(tt, cfg.rows, w, keys, i);
}

__global__ void sk_gather(fc_cu_src src, const float *est, const int64_t *idx, const int64_t *num, float *vals,
                          float *dn)
{
    const int64_t total = *num, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < total; j += stride) {
        vals[j] = src.x(idx[j]);
        dn[j] = -1.0f * est[idx[j]]; // the CPU's decode_add, alpha = -1
    }
}

// Chunks per sort: their pair keys (chunk, bucket) stay below 2^31.
static int sk_group(const sk_cfg &c, int world)
{
    const int64_t g = ((int64_t)1 << 31) / (c.cols + 1) - 1;
    return g < 1 ? 1 : g > world ? world : (int)g;
}

static int sk_bits(int64_t v)
{
    int b = 1;
    while (b < 32 && ((int64_t)1 << b) <= v)
        b++;
    return b;
}

struct sk_enc_parts {
    sk_table_parts tab; // tables up to SKT_MAX_COLS wide
    uint32_t *kin, *kout; // wider ones
    float *tin, *tout;
    void *sort_temp;
    size_t sort_bytes;
    float *est, *vals, *ev;
    fc_cu_selection sel;
};

// The encode's parts, its config sized to the full chunk.
static int carve_encode(const fc_cuda_encode_args *a, fc_cu_arena &ar, sk_cfg *c, sk_enc_parts *p, fc_err *err)
{
    int rc = FC_OK;
    const int64_t N = a->h.geo.numel;
    memset(p, 0, sizeof(*p));
    FC_TRY(config(&a->h.m, a->h.geo.per, c, err));
    if (sk_table_fits(*c)) {
        sk_table_carve(ar, a->h.geo, *c, &p->tab);
    } else {
        p->kin = ar.take<uint32_t>(N);
        p->kout = ar.take<uint32_t>(N);
        p->tin = ar.take<float>(N);
        p->tout = ar.take<float>(N);
        FC_CHECK_CUDA(fc_cu_sort_pairs(NULL, &p->sort_bytes, NULL, NULL, NULL, NULL, N > 0 ? N : 1, 32, 0), err, error);
        p->sort_temp = ar.take_bytes(p->sort_bytes);
    }
    if (!c->second) { // the residual decodes the sender's own table: estimates and their top k
        p->est = ar.take<float>(N);
        p->vals = ar.take<float>(N);
        p->ev = ar.take<float>(N);
        FC_TRY(fc_cu_sel_carve(ar, fc_cu_sel_space_of(a->h.geo), &p->sel, err));
    }
error:
    return rc;
}

static int encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, const sk_cfg &c, sk_enc_parts &p, cudaStream_t s,
                  fc_err *err)
{
    int rc = FC_OK;
    {
        const fc_rng shared = fc_cu_call_rng(a->h);
        const int G = sk_group(c, a->h.geo.world);
        if (sk_table_fits(c))
            FC_TRY(sk_table_build(*e, c, shared, p.tab, s, err));
        for (int g0 = 0; g0 < a->h.geo.world && !sk_table_fits(c); g0 += G) {
            const int gc = g0 + G < a->h.geo.world ? G : a->h.geo.world - g0;
            int64_t a0, b0, s0, n0;
            fc_cu_span(a->h.geo, g0, &a0, &n0);
            fc_cu_span(a->h.geo, g0 + gc - 1, &s0, &n0);
            b0 = s0 + n0;
            const int64_t count = b0 - a0;
            if (count == 0)
                continue;
            for (int j = 0; j < c.rows; j++) {
                size_t bytes = p.sort_bytes;
                sk_pairs<<<fc_cu_blocks(count, SK_THREADS * 4), SK_THREADS, 0, s>>>(*e, c, j, g0, gc, a0, b0, shared,
                                                                                    p.kin, p.tin);
                FC_CHECK_LAUNCH(err, error);
                FC_CHECK_CUDA(fc_cu_sort_pairs(p.sort_temp, &bytes, p.kin, p.kout, p.tin, p.tout, count,
                                               sk_bits((int64_t)gc * c.cols), s), err, error);
                sk_buckets<<<fc_cu_blocks((int64_t)gc * c.cols, SK_THREADS), SK_THREADS, 0, s>>>(
                    *e, c, j, g0, gc, p.kout, p.tout, count);
                FC_CHECK_LAUNCH(err, error);
            }
        }
        if (e->single) { // compress(): the table is the payload; no residual, no second round
        } else if (c.second) { // nothing decodes from round 1: the residual is the whole g'
            if (a->h.x.fetch == NULL)
                FC_TRY(fc_fail(err, FC_ERR_STATE, "internal: sketch's second round without its fetch buffer"));
            FC_TRY(fc_cu_res_dense(*e, NULL, NULL, 0, s, err));
            FC_TRY(fc_cu_fetch_keep_flags(a->h.x.fetch, a->h.ws, a->h.geo.world, s, err));
        } else if (e->res != NULL || e->sample) {
            fc_cu_src est;
            memset(&est, 0, sizeof(est));
            est.grad = p.est;
            est.gdt = FC_CU_F32;
            sk_own_estimates<<<fc_cu_grid(a->h.geo.per, SK_THREADS * SK_EST_PER, a->h.geo.world), SK_THREADS, 0, s>>>(*e, c, shared,
                                                                                                     p.est);
            FC_CHECK_LAUNCH(err, error);
            FC_TRY(fc_cu_select_topk(p.sel, est, c.kr, s, err));
            sk_gather<<<fc_cu_blocks(a->h.geo.numel, SK_THREADS * 4), SK_THREADS, 0, s>>>(e->src, p.est, p.sel.idx,
                                                                                       p.sel.num, p.vals, p.ev);
            FC_CHECK_LAUNCH(err, error);
            FC_TRY(fc_cu_res_dense(*e, p.sel.idx, p.sel.num, a->h.geo.numel, s, err));
            FC_TRY(fc_cu_res_fix(*e, p.sel.idx, p.vals, p.ev, p.sel.num, a->h.geo.numel, s, err));
        }
    }
error:
    return rc;
}

// ---- decode: the senders' tables summed in rank order, then estimates, heavy hitters, picks

__global__ void sk_aggregate(fc_cu_dec d, int64_t cells, float *agg)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t sat = 0; // not counted: the CPU's aggregate does not count it either
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < cells; t += stride) {
        float a = 0.0f;
        for (int r = 0; r < d.geo.world; r++) {
            if (d.geo.skip_own && r == d.geo.rank)
                continue;
            a = fc_add_sat(a, ((const float *)(d.recv + fc_cu_recv_off(d.geo, r, d.slot) + FC_HEADER_BYTES))[t],
                           &sat); // fc_aggregate_add_f32's rule
        }
        agg[t] = a;
    }
}

// est of the own chunk from the summed table; `own` (second round): + the exact own chunk
// (0 + own, or 0 when it was sent too), which the owner adds anyway.
__global__ void sk_estimates(fc_cu_dec d, sk_cfg cfg, fc_rng shared, const float *agg, int own, float *est)
{
    __shared__ float tab[SK_EST_SMEM];
    int64_t start, n;
    fc_cu_span(d.geo, d.geo.rank, &start, &n);
    if (d.add && d.bad[0] != 0) // decompress() of a rejected payload: its table is not read
        return;
    const float *tt = sk_est_table(agg, cfg.rows, cfg.cols, tab);
    uint32_t keys[SK_MAX_ROWS];
    sk_thread_keys(shared, d.geo.rank, cfg.rows, keys);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = fc_sketch_estimate(tt, cfg.rows, cfg.cols, keys, i);
        if (own) { // the CPU's acc: 0 + the own chunk as fc_cpu_add_own adds it
            float o = 0.0f;
            if (d.geo.skip_own)
                o += fc_cu_own(d, start + i);
            v = v + o;
        }
        est[i] = v;
    }
}

__global__ void sk_heavy(fc_cu_dec d, const float *est, const int64_t *idx, const int64_t *num)
{
    if (fc_cu_any_rejected(d))
        return; // fc_cu_own_dense made everything NaN
    fc_cu_at_picks out(d);
    const int64_t total = *num, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < total; j += stride)
        out.put(idx[j], 1.0f * est[idx[j]]);
    out.done();
}

// The owner's picks into the fetch buffer, as uint32 chunk indices.
__global__ void sk_keep_picks(const int64_t *idx, const int64_t *num, uint32_t *picks)
{
    const int64_t total = *num, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < total; j += stride)
        picks[j] = (uint32_t)idx[j];
}

// decompress(): out += alpha * est at the heavy hitters of the one payload's own table (the
// CPU's decode_add reads the body itself: no aggregate, whose 0 + t would turn a -0 into +0); a
// rejected payload makes every element NaN.
__global__ void sk_add_poison(fc_cu_dec d, int64_t n)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    if (d.bad[0] == 0)
        return;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        fc_cu_add_canon((float *)d.out + i, fc_cu_poison());
}

__global__ void sk_add_heavy(fc_cu_dec d, const float *est, const int64_t *idx, const int64_t *num)
{
    if (d.bad[0] != 0)
        return;
    const int64_t total = *num, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < total; j += stride)
        fc_cu_add_canon((float *)d.out + idx[j], d.alpha * est[idx[j]]);
}

struct sk_dec_parts {
    float *agg, *est;
    fc_cu_selection sel;
};

// The decode's parts, its config sized to the own chunk (the table it sums).
static int carve_decode(const fc_cuda_decode_args *a, fc_cu_arena &ar, sk_cfg *c, sk_dec_parts *p, fc_err *err)
{
    int64_t start, n;
    fc_cu_span(a->h.geo, a->h.geo.rank, &start, &n);
    const int rc = config(&a->h.m, n, c, err);
    if (rc != FC_OK)
        return rc;
    const fc_cu_sel_space sp = {n, n > 0 ? n : 1, 1, -1};
    p->agg = ar.take<float>((int64_t)c->rows * c->cols);
    p->est = ar.take<float>(n);
    return fc_cu_sel_carve(ar, sp, &p->sel, err);
}

static int decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, const sk_cfg &c, sk_dec_parts &p, cudaStream_t s,
                  fc_err *err)
{
    int rc = FC_OK;
    int64_t start, n;
    fc_cu_span(a->h.geo, a->h.geo.rank, &start, &n);
    {
        const int senders = n > 0 ? a->h.geo.world - (a->h.geo.skip_own ? 1 : 0) : 0;
        // a second round follows (the unit's kmax > 0: only then is there a fetch buffer): the
        // owner only picks, none of an empty chunk, and writes no output yet, as the CPU's decode
        const int pick = a->h.x.fetch != NULL;
        const int64_t cells = (int64_t)c.rows * c.cols;
        const fc_rng shared = fc_cu_call_rng(a->h);
        fc_cu_src est;
        memset(&est, 0, sizeof(est));
        est.grad = p.est;
        est.gdt = FC_CU_F32;
        if (d->add) { // decompress(): with second_round the CPU adds nothing (values come from round 2)
            if (n == 0)
                return FC_OK;
            sk_add_poison<<<fc_cu_blocks(n, SK_THREADS * 4), SK_THREADS, 0, s>>>(*d, n);
            FC_CHECK_LAUNCH(err, error);
            if (c.second)
                return FC_OK;
            sk_estimates<<<fc_cu_blocks(n, SK_THREADS * SK_EST_PER), SK_THREADS, 0, s>>>(
                *d, c, shared, (const float *)(a->recv + FC_HEADER_BYTES), 0, p.est);
            FC_CHECK_LAUNCH(err, error);
            FC_TRY(fc_cu_select_topk(p.sel, est, c.kr, s, err));
            sk_add_heavy<<<fc_cu_blocks(n, SK_THREADS * 4), SK_THREADS, 0, s>>>(*d, p.est, p.sel.idx, p.sel.num);
            FC_CHECK_LAUNCH(err, error);
            return FC_OK;
        }
        if (!pick)
            FC_TRY(fc_cu_own_dense(*d, s, err));
        if (n == 0 || (!pick && senders == 0))
            return FC_OK;
        sk_aggregate<<<fc_cu_blocks(cells, SK_THREADS * 4), SK_THREADS, 0, s>>>(*d, cells, p.agg); // zeros: none
        FC_CHECK_LAUNCH(err, error);
        sk_estimates<<<fc_cu_blocks(n, SK_THREADS * SK_EST_PER), SK_THREADS, 0, s>>>(*d, c, shared, p.agg, pick, p.est);
        FC_CHECK_LAUNCH(err, error);
        FC_TRY(fc_cu_select_topk(p.sel, est, c.kr, s, err));
        if (pick) {
            sk_keep_picks<<<fc_cu_blocks(n, SK_THREADS * 4), SK_THREADS, 0, s>>>(p.sel.idx, p.sel.num,
                                                                               fc_cu_fetch_picks_at(a->h.x.fetch));
            FC_CHECK_LAUNCH(err, error);
        } else {
            sk_heavy<<<fc_cu_blocks(n, SK_THREADS * 4), SK_THREADS, 0, s>>>(*d, p.est, p.sel.idx, p.sel.num);
            FC_CHECK_LAUNCH(err, error);
        }
    }
error:
    return rc;
}

// single_without_residual: its single payload is the table alone
extern const fc_cu_method fc_cu_sketch =
    fc_cu_carving<sk_cfg, sk_enc_parts, carve_encode, encode, sk_dec_parts, carve_decode, decode>::entry(FC_ID_SKETCH, 1);
