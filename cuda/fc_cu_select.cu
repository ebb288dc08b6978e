// fc_cu_select.cu: the selections of the sparse methods, over a unit's chunks at once: top-k by
// magnitude (a radix select of the k-th largest magnitude, then one ordered compaction), the
// threshold test, and the set bits of bitmaps. Indices come out ascending, as the CPU's
// (fc_select.c, m_thresholdv.c, fc_sparse.c); the compactions are CUB's (fc_cu_cub.cu).
#include "fc_cu_sparse.cuh"

// A magnitude key has 31 bits (the sign is cleared): three digits, high to low.
#define SEL_BINS 2048
#define SEL_TOP_SHIFT 20
static const int digit_shift[3] = {SEL_TOP_SHIFT, 10, 0};
static const int digit_width[3] = {11, 10, 10};

#define SEL_THREADS 256

int fc_cu_sel_carve(fc_cu_arena &ar, const fc_cu_sel_space &sp, fc_cu_selection *sel, fc_err *err)
{
    int rc = FC_OK;
    memset(sel, 0, sizeof(*sel));
    sel->sp = sp;
    sel->ch = ar.take<fc_cu_sel_chunk>(sp.chunks);
    sel->idx = ar.take<int64_t>(sp.N);
    sel->num = ar.take<int64_t>(1);
    sel->hist = ar.take<uint32_t>((int64_t)sp.chunks * SEL_BINS);
    fc_cu_sel_pred p;
    memset(&p, 0, sizeof(p));
    FC_CHECK_CUDA(fc_cu_select_if(NULL, &sel->temp_bytes, p, NULL, NULL, sp.N > 0 ? sp.N : 1, 0),
                  err, error);
    sel->temp = ar.take_bytes(sel->temp_bytes);
error:
    return rc;
}

// ---- the chunk table

__global__ void sel_init(fc_cu_sel_space sp, fc_cu_krule kr, int topk, uint32_t thr,
                         fc_cu_sel_chunk *ch)
{
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < sp.chunks; c += gridDim.x * blockDim.x) {
        fc_cu_sel_chunk h;
        memset(&h, 0, sizeof(h));
        int64_t a = sp.per * (int64_t)c, b = a + sp.per;
        a = a > sp.N ? sp.N : a;
        b = b > sp.N ? sp.N : b;
        h.start = a;
        h.n = b - a;
        h.on = h.n > 0 && c != sp.skip;
        h.thr = thr;
        h.cut = -1;
        if (topk && h.on) {
            h.k = fc_rule_sparse_k(h.n, kr.k, kr.ratio);
            h.want = h.k;
            if (h.k >= h.n) { // everything: keys > 0, and every key 0
                h.thr = 0;
                h.cut = INT64_MAX;
                h.done = 1;
            }
        }
        ch[c] = h;
    }
}

// Offsets of each chunk's kept indices (topk: from k) and of its candidates, in chunk order.
__global__ void sel_offsets(fc_cu_sel_chunk *ch, int chunks, int candidates)
{
    int64_t at = 0;
    for (int c = 0; c < chunks; c++) {
        if (candidates) {
            ch[c].cand_off = at;
            at += ch[c].on && !ch[c].done ? ch[c].cand_n : 0;
        } else {
            ch[c].off = at;
            at += ch[c].k;
        }
    }
}

// Counted selections: chunk c's kept indices are those of idx in [start, start + n).
__device__ __forceinline__ int64_t sel_lower_bound(const int64_t *idx, int64_t count, int64_t v)
{
    int64_t lo = 0, hi = count;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (idx[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

__global__ void sel_count(fc_cu_sel_chunk *ch, int chunks, const int64_t *idx, const int64_t *num)
{
    const int64_t total = *num;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += gridDim.x * blockDim.x) {
        const int64_t a = sel_lower_bound(idx, total, ch[c].start);
        const int64_t b = sel_lower_bound(idx, total, ch[c].start + ch[c].n);
        ch[c].off = a;
        ch[c].k = ch[c].on ? b - a : 0;
    }
}

// ---- top-k: histograms of one digit, the bin holding the k-th largest, the ties' cut

// Pass 1: every element of each chunk still searching, by its top digit.
__global__ void sel_hist_top(fc_cu_src src, const fc_cu_sel_chunk *ch, uint32_t *hist)
{
    __shared__ uint32_t h[SEL_BINS];
    const fc_cu_sel_chunk hc = ch[blockIdx.y];
    if (!hc.on || hc.done)
        return; // the whole block
    for (int b = threadIdx.x; b < SEL_BINS; b += blockDim.x)
        h[b] = 0;
    __syncthreads();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < hc.n; i += stride)
        atomicAdd(&h[fc_abs_bits(src.x(hc.start + i)) >> SEL_TOP_SHIFT], 1u);
    __syncthreads();
    uint32_t *g = hist + (int64_t)blockIdx.y * SEL_BINS;
    for (int b = threadIdx.x; b < SEL_BINS; b += blockDim.x)
        if (h[b] != 0)
            atomicAdd(&g[b], h[b]);
}

// Passes 2 and 3: the chunk's candidates (the top digit matched) whose key >> (shift + width)
// equals the prefix found so far, by the digit at `shift`.
__global__ void sel_hist_cand(fc_cu_src src, const fc_cu_sel_chunk *ch, const int64_t *cand,
                              int shift, int width, uint32_t *hist)
{
    __shared__ uint32_t h[SEL_BINS];
    const fc_cu_sel_chunk hc = ch[blockIdx.y];
    if (!hc.on || hc.done)
        return;
    const int bins = 1 << width;
    for (int b = threadIdx.x; b < bins; b += blockDim.x)
        h[b] = 0;
    __syncthreads();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < hc.cand_n; j += stride) {
        const uint32_t key = fc_abs_bits(src.x(cand[hc.cand_off + j]));
        if ((key >> (shift + width)) == hc.thr)
            atomicAdd(&h[(key >> shift) & (uint32_t)(bins - 1)], 1u);
    }
    __syncthreads();
    uint32_t *g = hist + (int64_t)blockIdx.y * SEL_BINS;
    for (int b = threadIdx.x; b < bins; b += blockDim.x)
        if (h[b] != 0)
            atomicAdd(&g[b], h[b]);
}

// One block per chunk: the bin (from the top) where the want-th largest lies. The prefix grows
// by the digit, want becomes the rank inside the bin; after the first digit the bin's count is
// the number of candidates, after the last it is the number of ties (keys equal to thr).
__global__ void sel_pick(fc_cu_sel_chunk *ch, uint32_t *hist, int width, int pass)
{
    __shared__ uint32_t sh[SEL_BINS];
    fc_cu_sel_chunk h = ch[blockIdx.x];
    if (!h.on || h.done)
        return;
    const int bins = 1 << width;
    uint32_t *g = hist + (int64_t)blockIdx.x * SEL_BINS;
    for (int b = threadIdx.x; b < bins; b += blockDim.x) {
        sh[b] = g[b];
        g[b] = 0; // zeroed for the next pass
    }
    __syncthreads();
    if (threadIdx.x >= 32)
        return;
    const int lane = threadIdx.x, per = bins / 32;
    const int hi = bins - lane * per, lo = hi - per; // lane 0 owns the top bins
    unsigned long long mine = 0;
    for (int b = lo; b < hi; b++)
        mine += sh[b];
    unsigned long long incl = mine;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o)
            incl += t;
    }
    const unsigned long long excl = incl - mine, want = (unsigned long long)h.want;
    const unsigned owner = __ballot_sync(0xffffffffu, excl < want && want <= incl);
    if (owner == 0 || lane != __ffs(owner) - 1)
        return; // cannot happen: the chunk's count is its n >= k
    unsigned long long w = want - excl;
    int bin = hi - 1;
    for (; bin > lo && w > sh[bin]; bin--)
        w -= sh[bin];
    h.thr = (h.thr << width) | (uint32_t)bin;
    h.want = (int64_t)w;
    if (pass == 0)
        h.cand_n = sh[bin];
    if (pass == 2)
        h.ties = sh[bin];
    ch[blockIdx.x] = h;
}

// One block per chunk, after the last digit: the cut among the ties (keys equal to thr, in
// index order in the candidates): the want-th one. Every tie when all of them are kept.
__global__ void sel_cut(fc_cu_src src, fc_cu_sel_chunk *ch, const int64_t *cand)
{
    __shared__ int warp_count[SEL_THREADS / 32];
    __shared__ int64_t base;
    fc_cu_sel_chunk h = ch[blockIdx.x];
    if (!h.on || h.done)
        return;
    if ((int64_t)h.ties == h.want) {
        if (threadIdx.x == 0) {
            ch[blockIdx.x].cut = INT64_MAX;
            ch[blockIdx.x].done = 1;
        }
        return;
    }
    if (threadIdx.x == 0)
        base = 0;
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t t = 0; t < h.cand_n; t += blockDim.x) {
        const int64_t j = t + threadIdx.x;
        const int64_t i = j < h.cand_n ? cand[h.cand_off + j] : -1;
        const bool tie = i >= 0 && fc_abs_bits(src.x(i)) == h.thr;
        const unsigned ballot = __ballot_sync(0xffffffffu, tie);
        if (lane == 0)
            warp_count[warp] = __popc(ballot);
        __syncthreads();
        int64_t before = base;
        for (int w = 0; w < warp; w++)
            before += warp_count[w];
        before += __popc(ballot & ((1u << lane) - 1u));
        if (tie && before + 1 == h.want) {
            ch[blockIdx.x].cut = i;
            ch[blockIdx.x].done = 1;
        }
        __syncthreads();
        if (threadIdx.x == blockDim.x - 1) {
            int64_t all = base;
            for (int w = 0; w < (int)(blockDim.x >> 5); w++)
                all += warp_count[w];
            base = all;
        }
        __syncthreads();
        if (base >= h.want)
            break; // block-uniform: base is shared and read after the barrier
    }
}

static int select_all(const fc_cu_selection &sel, const fc_cu_sel_pred &p, cudaStream_t s,
                      fc_err *err)
{
    int rc = FC_OK;
    size_t bytes = sel.temp_bytes;
    FC_CHECK_CUDA(fc_cu_select_if(sel.temp, &bytes, p, sel.idx, sel.num, sel.sp.N, s), err, error);
error:
    return rc;
}

static fc_cu_sel_pred make_pred(const fc_cu_selection &sel, int mode, const fc_cu_src &src)
{
    fc_cu_sel_pred p;
    memset(&p, 0, sizeof(p));
    p.mode = mode;
    p.src = src;
    p.per = sel.sp.per > 0 ? sel.sp.per : 1;
    p.inv_per = 1.0 / (double)p.per;
    p.ch = sel.ch;
    return p;
}

int fc_cu_select_topk(const fc_cu_selection &sel, const fc_cu_src &src, const fc_cu_krule &kr,
               cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    const int W = sel.sp.chunks;
    const dim3 grid(fc_cu_blocks(sel.sp.per, SEL_THREADS * 16), (unsigned)W);
    const dim3 cand_grid(64, (unsigned)W);
    fc_cu_sel_pred p = make_pred(sel, FC_SEL_DIGIT, src);
    if (sel.sp.N == 0)
        return FC_OK;
    FC_CHECK_CUDA(cudaMemsetAsync(sel.hist, 0, sizeof(uint32_t) * SEL_BINS * (size_t)W, s), err, error);
    sel_init<<<fc_cu_blocks(W, SEL_THREADS), SEL_THREADS, 0, s>>>(sel.sp, kr, 1, 0, sel.ch);
    FC_CHECK_LAUNCH(err, error);
    sel_offsets<<<1, 1, 0, s>>>(sel.ch, W, 0);
    FC_CHECK_LAUNCH(err, error);
    sel_hist_top<<<grid, SEL_THREADS, 0, s>>>(src, sel.ch, sel.hist);
    FC_CHECK_LAUNCH(err, error);
    sel_pick<<<W, SEL_THREADS, 0, s>>>(sel.ch, sel.hist, digit_width[0], 0);
    FC_CHECK_LAUNCH(err, error);
    // the candidates: every element whose top digit is the k-th largest's, in index order
    sel_offsets<<<1, 1, 0, s>>>(sel.ch, W, 1);
    FC_CHECK_LAUNCH(err, error);
    p.shift = digit_shift[0];
    FC_TRY(select_all(sel, p, s, err));
    for (int pass = 1; pass < 3; pass++) {
        sel_hist_cand<<<cand_grid, SEL_THREADS, 0, s>>>(src, sel.ch, sel.idx, digit_shift[pass],
                                                        digit_width[pass], sel.hist);
        FC_CHECK_LAUNCH(err, error);
        sel_pick<<<W, SEL_THREADS, 0, s>>>(sel.ch, sel.hist, digit_width[pass], pass);
        FC_CHECK_LAUNCH(err, error);
    }
    sel_cut<<<W, SEL_THREADS, 0, s>>>(src, sel.ch, sel.idx);
    FC_CHECK_LAUNCH(err, error);
    // everything above the k-th largest magnitude, and the ties up to the cut
    p.mode = FC_SEL_ABOVE;
    FC_TRY(select_all(sel, p, s, err));
error:
    return rc;
}

int fc_cu_select_threshold(const fc_cu_selection &sel, const fc_cu_src &src, float v, cudaStream_t s,
                    fc_err *err)
{
    int rc = FC_OK;
    const int W = sel.sp.chunks;
    fc_cu_krule none = {0, 0.0};
    if (sel.sp.N == 0)
        return FC_OK;
    // |x| > v as magnitude bits: key > bits(v) for v >= 0 (fc_rule_thrv_keep)
    sel_init<<<fc_cu_blocks(W, SEL_THREADS), SEL_THREADS, 0, s>>>(sel.sp, none, 0, fc_f32_bits(v), sel.ch);
    FC_CHECK_LAUNCH(err, error);
    FC_TRY(select_all(sel, make_pred(sel, FC_SEL_ABOVE, src), s, err));
    sel_count<<<fc_cu_blocks(W, SEL_THREADS), SEL_THREADS, 0, s>>>(sel.ch, W, sel.idx, sel.num);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

int fc_cu_reselect_threshold(const fc_cu_selection &sel, const fc_cu_src &src, cudaStream_t s,
                             fc_err *err)
{
    int rc = FC_OK;
    const int W = sel.sp.chunks;
    if (sel.sp.N == 0)
        return FC_OK;
    FC_TRY(select_all(sel, make_pred(sel, FC_SEL_ABOVE, src), s, err));
    sel_count<<<fc_cu_blocks(W, SEL_THREADS), SEL_THREADS, 0, s>>>(sel.ch, W, sel.idx, sel.num);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

int fc_cu_select_bits(const fc_cu_selection &sel, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    const int W = sel.sp.chunks;
    fc_cu_src none;
    memset(&none, 0, sizeof(none));
    if (sel.sp.N == 0)
        return FC_OK;
    FC_TRY(select_all(sel, make_pred(sel, FC_SEL_BITS, none), s, err));
    sel_count<<<fc_cu_blocks(W, SEL_THREADS), SEL_THREADS, 0, s>>>(sel.ch, W, sel.idx, sel.num);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}
