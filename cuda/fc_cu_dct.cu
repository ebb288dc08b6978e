// fc_cu_dct.cu: kernels of `dct` (m_dct.c). One thread per block of `block` elements, every sent
// chunk at once, calls fc_dct.h's rules in the CPU's order (g' loaded with the last block's zero
// padding, the forward transform, the pick, the clamp), so the indices and values are the CPU's;
// the positions are coded one thread per group of 8 (8 blocks' ranks, or 8 plain indices where
// fc_dct_rank.h's rule says so) and the values go through the sparsifiers'
// value codec (fc_cu_sparse_common.cu). Receivers sum the senders' coefficients per block in rank
// order (the coefficient domain: m_dct.c's aggregate) and invert each block once (decode_agg),
// all in one thread per block: the sum never leaves the thread, so no aggregate buffer.
#include "fc_cu_sparse.cuh"
#include "common/fc_dct.h"

// A thread holds two blocks of floats in local memory (the transform's in-place pair).
#define DCT_THREADS 128
// The block sizes the key table allows: 8 << j for j < DCT_SIZES (8 .. FC_DCT_MAX_BLOCK).
#define DCT_SIZES 6
static_assert(8 << (DCT_SIZES - 1) == FC_DCT_MAX_BLOCK, "a table for every block size");

struct dct_cfg {
    int B, k, wbits;
    int rbits; // bits of a block's rank; 0: plain indices (fc_dct_ranked)
    fc_cu_vc vc;
};

static int config(const fc_cuda_method_cfg *m, int world, dct_cfg *c, fc_err *err)
{
    memset(c, 0, sizeof(*c));
    const fc_dct_cfg *d = fc_cu_cfg_of<fc_dct_cfg>(m);
    // dct_check's and the key table's rules, checked again: a block beyond the kernels' arrays
    // would write past them
    if (d->block < 8 || d->block > FC_DCT_MAX_BLOCK || (d->block & (d->block - 1)) != 0 || d->k < 1 ||
        d->k > d->block)
        return fc_fail(err, FC_ERR_VALUE, "dct: block=%lld must be a power of two in [8, %d] and k=%lld in "
                       "[1, block]", (long long)d->block, FC_DCT_MAX_BLOCK, (long long)d->k);
    c->B = (int)d->block;
    c->k = (int)d->k;
    c->wbits = fc_dct_index_bits(c->B);
    c->rbits = fc_dct_ranked(c->B, c->k) ? fc_dct_rank_bits(c->B, c->k) : 0;
    return fc_cu_vc_read(&d->vc, world, &c->vc, err);
}

// ---- the transform's factors

// fc_dct_table for one block size, passed to the kernels by value (about 1 KiB, well within a
// launch's parameter space) and copied to shared memory there.
struct dct_tab {
    float f[FC_DCT_MAX_BLOCK + 1];
};

struct dct_tabs {
    dct_tab t[DCT_SIZES];
};

static dct_tabs make_tabs()
{
    dct_tabs a;
    memset(&a, 0, sizeof(a));
    for (int j = 0; j < DCT_SIZES; j++)
        fc_dct_table(8 << j, a.t[j].f);
    return a;
}

// Computed once per process, on the host: fc_dct_table is + - * / in double only, each rounded
// once on host and device alike (its comment; no product in it feeds a sum, so not even a host
// pass that contracted would fuse one), so these are the CPU method's floats; on one device
// thread the table would take longer than the transform of a large unit (a double division per
// Taylor term, thousands in a row), on every call.
static const dct_tab &table_of(int B)
{
    static const dct_tabs all = make_tabs(); // thread-safe initialisation (C++11)
    return all.t[fc_dct_index_bits(B) - 3];
}

// The factors into the block's shared copy, before any thread of the block returns.
__device__ __forceinline__ void dct_share(const dct_tab &tab, int B, float *s)
{
    for (int i = threadIdx.x; i < fc_dct_table_len(B); i += blockDim.x)
        s[i] = tab.f[i];
    __syncthreads();
}

// What a chunk of n keeps: nb blocks, K = nb * k coefficients, the values after ib bytes of
// indices (fc_dct.h's rules, as m_dct.c's layout).
struct dct_span {
    int64_t nb, K, ib;
};

__host__ __device__ __forceinline__ dct_span dct_span_of(const dct_cfg &c, int64_t n)
{
    dct_span s;
    s.nb = fc_dct_blocks(n, c.B);
    s.K = fc_dct_kept(n, c.B, c.k);
    s.ib = fc_dct_index_bytes_w(s.nb, c.k, c.wbits, c.rbits); // = fc_dct_index_bytes(s.nb, c.B, c.k)
    return s;
}

// ---- encode. The scratch keeps `slot` picks per chunk (a full chunk's K), chunk c at c * slot.

// One thread per block of each sent chunk (grid y): t = g' (0 past the chunk), its transform, the
// k coefficients picked, ascending, and clamped (a codec's own saturation is not counted on the
// device: docs/methods.md), as m_dct.c's encode.
__global__ void __launch_bounds__(DCT_THREADS) dct_forward(fc_cu_enc e, dct_cfg c, dct_tab tab, int64_t slot,
                                                           uint32_t *idx, float *vals)
{
    __shared__ float f[FC_DCT_MAX_BLOCK + 1];
    dct_share(tab, c.B, f);
    const int ci = blockIdx.y;
    int64_t start, n;
    if (fc_cu_enc_body(e, ci, &start, &n) == NULL)
        return;
    float t[FC_DCT_MAX_BLOCK], u[FC_DCT_MAX_BLOCK];
    const int64_t nb = fc_dct_blocks(n, c.B), stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += stride) {
        const int64_t at = b * c.B, len = n - at < c.B ? n - at : c.B;
        for (int i = 0; i < c.B; i++)
            t[i] = i < len ? e.src.x(start + at + i) : 0.0f;
        fc_dct_forward(t, u, c.B, f);
        uint32_t *ix = idx + ci * slot + b * c.k;
        fc_dct_pick(t, c.B, c.k, ix);
        int64_t sat = 0;
        for (int j = 0; j < c.k; j++)
            vals[ci * slot + b * c.k + j] = fc_dct_clamp(t[ix[j]], &sat);
    }
}

// The positions of each sent chunk, one thread per group of 8 (8 blocks' ranks in c.rbits bytes,
// or 8 plain indices in c.wbits; either written whole: no two threads share a byte), past the
// last block or index zero as the CPU's last group; the padding to 4 bytes zeroed, as the CPU's
// memset leaves it.
__global__ void dct_pack(fc_cu_enc e, dct_cfg c, int64_t slot, const uint32_t *idx)
{
    const int ci = blockIdx.y;
    int64_t start, n;
    uint8_t *body = fc_cu_enc_body(e, ci, &start, &n);
    if (body == NULL)
        return;
    const dct_span sp = dct_span_of(c, n);
    const int64_t items = c.rbits ? sp.nb : sp.K, width = c.rbits ? c.rbits : c.wbits;
    const int64_t groups = (items + 7) / 8, stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int64_t g = t0; g < groups; g += stride) {
        if (c.rbits) {
            fc_u128 ranks[8];
            for (int j = 0; j < 8; j++)
                ranks[j] = 8 * g + j < sp.nb ? fc_dct_rank(idx + ci * slot + (8 * g + j) * c.k, c.k) : fc_u128{0u, 0u};
            fc_dct_pack_ranks8(ranks, c.rbits, body + g * c.rbits);
        } else {
            uint32_t codes[8];
            for (int j = 0; j < 8; j++)
                codes[j] = 8 * g + j < sp.K ? idx[ci * slot + 8 * g + j] : 0u;
            fc_pack8(codes, c.wbits, body + g * c.wbits);
        }
    }
    if (t0 == 0)
        for (int64_t b = fc_pack_bytes(items, (int)width); b < sp.ib; b++)
            body[b] = 0;
}

// The value codec's job per chunk: its K values after its indices, the payload's sub-stream.
__global__ void dct_jobs(fc_cu_enc e, dct_cfg c, int64_t slot, const float *vals, fc_cu_vc_job *jobs)
{
    for (int ci = threadIdx.x; ci < e.geo.world; ci += blockDim.x) {
        int64_t start, n;
        uint8_t *body = fc_cu_enc_body(e, ci, &start, &n);
        const dct_span sp = dct_span_of(c, n);
        fc_cu_vc_job j;
        j.vals = vals + ci * slot;
        j.k = body != NULL ? sp.K : 0;
        j.out = body != NULL ? body + sp.ib : NULL;
        j.rng = fc_cu_vc_rng(e.rng, ci, e.geo.rank);
        jobs[ci] = j;
    }
}

// The residual of each block, as the CPU's update_residual: the body's decode with alpha = -1
// added to g' (m_dct.c's decode_add: the coefficients decoded into zeros, 0 + -D, scattered into
// a zeroed block, inverted), fc_cu_residual's per-element rule.
// ||e||^2 and the sampled chunk's statistics summed per warp.
__global__ void __launch_bounds__(DCT_THREADS) dct_residual(fc_cu_enc e, dct_cfg c, dct_tab tab, int64_t slot,
                                                            const uint32_t *idx)
{
    __shared__ float f[FC_DCT_MAX_BLOCK + 1];
    dct_share(tab, c.B, f);
    const int ci = blockIdx.y;
    int64_t start, n;
    const uint8_t *body = fc_cu_enc_body(e, ci, &start, &n);
    if (body == NULL)
        return;
    const int ef = e.res != NULL; // always replaced: the old residual went out inside g'
    const int sample = fc_cu_sampled(e, ci);
    if (!ef && !sample)
        return;
    const dct_span sp = dct_span_of(c, n);
    const float alpha = -1.0f;
    float t[FC_DCT_MAX_BLOCK], u[FC_DCT_MAX_BLOCK];
    fc_cu_esum sum;
    int64_t sat = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < sp.nb; b += stride) {
        const int64_t at = b * c.B, len = n - at < c.B ? n - at : c.B;
        for (int i = 0; i < c.B; i++)
            t[i] = 0.0f;
        for (int j = 0; j < c.k; j++) {
            const int64_t jj = b * c.k + j;
            int bad = 0;
            t[idx[ci * slot + jj]] = 0.0f + c.vc.term(body + sp.ib, sp.K, jj, alpha, &bad);
        }
        fc_dct_inverse(t, u, c.B, f);
        for (int64_t i = 0; i < len; i++) {
            const float x = e.src.x(start + at + i);
            int64_t s = 0;
            const float r = fc_cu_residual(x, t[i], &s);
            if (ef) {
                fc_cu_store_res(e.res, e.rdt, start + at + i, r, &s);
                sat += s;
            }
            sum.add(x, r);
        }
    }
    sum.flush(e.ws, ef ? e.unit_slot : -1, sample);
    fc_cu_count(&e.ws->saturated, sat);
}

struct dct_enc_parts {
    int64_t slot;
    uint32_t *idx;
    float *vals;
    fc_cu_vc_job *jobs;
};

static int carve_encode(const fc_cuda_encode_args *a, fc_cu_arena &ar, dct_cfg *c, dct_enc_parts *p, fc_err *err)
{
    const int rc = config(&a->h.m, a->h.geo.world, c, err);
    if (rc != FC_OK)
        return rc;
    p->slot = fc_dct_kept(a->h.geo.per, c->B, c->k);
    p->idx = ar.take<uint32_t>(p->slot * a->h.geo.world);
    p->vals = ar.take<float>(p->slot * a->h.geo.world);
    p->jobs = ar.take<fc_cu_vc_job>(a->h.geo.world);
    return FC_OK;
}

// The decode sums within each thread: it carves nothing, and only reads the config.
static int carve_decode(const fc_cuda_decode_args *a, fc_cu_arena &, dct_cfg *c, int *, fc_err *err)
{
    return config(&a->h.m, a->h.geo.world, c, err);
}

static int encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, const dct_cfg &c, dct_enc_parts &p, cudaStream_t s,
                  fc_err *err)
{
    int rc = FC_OK;
    {
        const dct_tab &tab = table_of(c.B);
        const int W = a->h.geo.world;
        const dim3 blocks = fc_cu_grid(fc_dct_blocks(a->h.geo.per, c.B), DCT_THREADS, W);
        dct_forward<<<blocks, DCT_THREADS, 0, s>>>(*e, c, tab, p.slot, p.idx, p.vals);
        FC_CHECK_LAUNCH(err, error);
        const int64_t items = c.rbits ? fc_dct_blocks(a->h.geo.per, c.B) : p.slot; // ranks, or indices
        dct_pack<<<fc_cu_grid((items + 7) / 8, FC_CU_THREADS, W), FC_CU_THREADS, 0, s>>>(*e, c, p.slot, p.idx);
        FC_CHECK_LAUNCH(err, error);
        dct_jobs<<<1, 256, 0, s>>>(*e, c, p.slot, p.vals, p.jobs);
        FC_CHECK_LAUNCH(err, error);
        FC_TRY(fc_cu_vc_encode(c.vc, p.jobs, W, p.slot, s, err));
        if (e->res != NULL || e->sample) {
            dct_residual<<<blocks, DCT_THREADS, 0, s>>>(*e, c, tab, p.slot, p.idx);
            FC_CHECK_LAUNCH(err, error);
        }
    }
error:
    return rc;
}

// ---- decode

__device__ __forceinline__ const uint8_t *dct_body(const fc_cu_dec &d, int r)
{
    return d.recv + fc_cu_recv_off(d.geo, r, d.slot) + FC_HEADER_BYTES;
}

// Index j of a body's packed indices (its group unpacked, fc_pack.h): plain coding only.
__device__ __forceinline__ uint32_t dct_index(const uint8_t *body, int wbits, int64_t j)
{
    uint32_t codes[8];
    fc_unpack8(body + j / 8 * wbits, wbits, codes);
    return codes[j & 7];
}

// A block's positions one at a time, in whichever order its coding gives them cheapest: a rank
// unranks largest first (fc_dct_unrank_next: no array of k positions per thread), plain indices
// come in order. next() returns the position of coefficient b k + j (j its return through *j).
struct dct_positions {
    const uint8_t *body;
    int64_t b;
    int B, k, wbits, rbits;
    fc_u128 r;
    int c, left;

    __device__ __forceinline__ dct_positions(const uint8_t *body_, const dct_cfg &cfg, int64_t b_)
        : body(body_), b(b_), B(cfg.B), k(cfg.k), wbits(cfg.wbits), rbits(cfg.rbits), r{0u, 0u}, c(cfg.B - 1), left(cfg.k)
    {
        if (rbits)
            r = fc_dct_rank_at(body, rbits, b);
    }

    __device__ __forceinline__ uint32_t next(int *j)
    {
        --left;
        if (rbits) {
            *j = left;
            return fc_dct_unrank_next(&r, &c, left + 1);
        }
        *j = k - 1 - left;
        return dct_index(body, wbits, b * k + *j);
    }
};

// What the CPU's read_body refuses before it adds anything (PayloadError there, the payload's
// rejection here: its sum is poisoned): a block's rank not below C(B, k) (read_ranks) or plain
// indices not ascending within a block (read_indices; each fits its block by its width), and
// value codes no encoder writes. Grid y: the senders' ranks.
__global__ void dct_check(fc_cu_dec d, dct_cfg c, int64_t K, uint32_t unit, uint32_t step)
{
    const int r = blockIdx.y;
    if ((d.geo.skip_own && r == d.geo.rank) || d.bad[r] != 0) // the own chunk, or a rejected header
        return;
    const uint8_t *body = dct_body(d, r);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < K; j += stride) {
        if (c.rbits) {
            if (j % c.k == 0 && !fc_dct_rank_ok(fc_dct_rank_at(body, c.rbits, j / c.k), c.B, c.k))
                fc_cu_reject(d.ws, d.ws->bad, r, FC_PAYLOAD_INDEX, unit, step);
        } else if (j % c.k != 0 && dct_index(body, c.wbits, j) <= dct_index(body, c.wbits, j - 1)) {
            fc_cu_reject(d.ws, d.ws->bad, r, FC_PAYLOAD_INDEX, unit, step);
        }
        int bad = 0;
        (void)c.vc.term(body + fc_dct_index_bytes_w(K / c.k, c.k, c.wbits, c.rbits), K, j, 1.0f, &bad);
        if (bad)
            fc_cu_reject(d.ws, d.ws->bad, r, FC_PAYLOAD_CODES, unit, step);
    }
}

// The collective's decode, one thread per block of the own chunk: the senders' coefficients
// summed from zero in rank order (aggregate: 0 + D of each value added at its index), inverted
// (decode_agg, which the CPU runs only with a sender; its scaling by alpha = 1 is exact), added
// to the CPU's accumulator (0 + own, fc_cu_own_first), out = acc / W under fc_cu_store_out's
// rules; NaN everywhere when a payload was rejected; FSDP's padded tail zeroed.
__global__ void __launch_bounds__(DCT_THREADS) dct_decode_blocks(fc_cu_dec d, dct_cfg c, dct_tab tab, int senders)
{
    __shared__ float f[FC_DCT_MAX_BLOCK + 1];
    dct_share(tab, c.B, f);
    int64_t start, n;
    fc_cu_span(d.geo, d.geo.rank, &start, &n);
    const dct_span sp = dct_span_of(c, n);
    const int poison = fc_cu_any_rejected(d), passed = fc_cu_sum_passes(d), own_pass = fc_cu_own_pass(d);
    const float w = (float)d.geo.world;
    float t[FC_DCT_MAX_BLOCK], u[FC_DCT_MAX_BLOCK];
    int64_t nonfinite = 0, sat = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int64_t b = t0; b < sp.nb; b += stride) {
        const int64_t at = b * c.B, len = n - at < c.B ? n - at : c.B;
        const int sum = !poison && senders > 0;
        if (sum) {
            for (int i = 0; i < c.B; i++)
                t[i] = 0.0f;
            for (int r = 0; r < d.geo.world; r++) {
                if (d.geo.skip_own && r == d.geo.rank)
                    continue;
                const uint8_t *body = dct_body(d, r);
                dct_positions pos(body, c, b); // each position once: the order of the adds is free
                for (int q = 0; q < c.k; q++) {
                    int j;
                    const uint32_t at_j = pos.next(&j);
                    int bad = 0;
                    t[at_j] += 0.0f + c.vc.term(body + sp.ib, sp.K, b * c.k + j, 1.0f, &bad);
                }
            }
            fc_dct_inverse(t, u, c.B, f);
        }
        for (int64_t i = 0; i < len; i++) {
            const float own = fc_cu_own_first(d, start + at + i);
            float acc = own;
            if (poison)
                acc = fc_cu_poison();
            else if (sum)
                acc += t[i];
            fc_cu_store_out(d.out, d.odt, at + i, acc / w, fc_output_passes(passed, own_pass, own), &nonfinite, &sat);
        }
    }
    for (int64_t i = n + t0; i < d.out_numel; i += stride)
        (void)fc_cu_out_tail(d.out, d.odt, i, n);
    fc_cu_count(&d.ws->nonfinite_out, nonfinite);
    fc_cu_count(&d.ws->saturated, sat);
}

// decompress(): out += D of the one payload (rank 0's slot) with alpha, m_dct.c's decode_add:
// each block's coefficients decoded with alpha into zeros (0 + alpha D), scattered into a zeroed
// block, inverted, added; a rejected payload makes every element NaN.
__global__ void __launch_bounds__(DCT_THREADS) dct_add(fc_cu_dec d, dct_cfg c, dct_tab tab, int64_t n)
{
    __shared__ float f[FC_DCT_MAX_BLOCK + 1];
    dct_share(tab, c.B, f);
    const dct_span sp = dct_span_of(c, n);
    const uint8_t *body = dct_body(d, 0);
    float *out = (float *)d.out;
    float t[FC_DCT_MAX_BLOCK], u[FC_DCT_MAX_BLOCK];
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < sp.nb; b += stride) {
        const int64_t at = b * c.B, len = n - at < c.B ? n - at : c.B;
        if (d.bad[0] != 0) {
            for (int64_t i = 0; i < len; i++)
                fc_cu_add_canon(out + at + i, fc_cu_poison());
            continue;
        }
        for (int i = 0; i < c.B; i++)
            t[i] = 0.0f;
        dct_positions pos(body, c, b);
        for (int q = 0; q < c.k; q++) {
            int j;
            const uint32_t at_j = pos.next(&j);
            int bad = 0;
            t[at_j] = 0.0f + c.vc.term(body + sp.ib, sp.K, b * c.k + j, d.alpha, &bad);
        }
        fc_dct_inverse(t, u, c.B, f);
        for (int64_t i = 0; i < len; i++)
            fc_cu_add_canon(out + at + i, t[i]);
    }
}

static int decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, const dct_cfg &c, int &, cudaStream_t s,
                  fc_err *err)
{
    int rc = FC_OK;
    int64_t start, n;
    fc_cu_span(a->h.geo, a->h.geo.rank, &start, &n);
    {
        const dct_tab &tab = table_of(c.B);
        const int64_t nb = fc_dct_blocks(n, c.B), K = fc_dct_kept(n, c.B, c.k);
        const int senders = n > 0 ? a->h.geo.world - (a->h.geo.skip_own ? 1 : 0) : 0;
        const unsigned rows = d->add ? 1u : (unsigned)a->h.geo.world; // decompress(): one payload
        if (K > 0 && (d->add || senders > 0)) {
            dct_check<<<dim3(fc_cu_blocks(K, FC_CU_THREADS * 4), rows), FC_CU_THREADS, 0, s>>>(*d, c, K, a->h.unit,
                                                                                            a->h.step);
            FC_CHECK_LAUNCH(err, error);
        }
        if (d->add) {
            if (nb > 0) {
                dct_add<<<fc_cu_blocks(nb, DCT_THREADS), DCT_THREADS, 0, s>>>(*d, c, tab, n);
                FC_CHECK_LAUNCH(err, error);
            }
            return FC_OK;
        }
        const int64_t work = nb > d->out_numel - n ? nb : d->out_numel - n; // blocks, or the tail's elements
        dct_decode_blocks<<<fc_cu_blocks(work, DCT_THREADS), DCT_THREADS, 0, s>>>(*d, c, tab, senders);
        FC_CHECK_LAUNCH(err, error);
    }
error:
    return rc;
}

extern const fc_cu_method fc_cu_dct =
    fc_cu_carving<dct_cfg, dct_enc_parts, carve_encode, encode, int, carve_decode, decode>::entry(FC_ID_DCT, 0);
