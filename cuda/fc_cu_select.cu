// fc_cu_select.cu: the selections of the sparse methods, over a unit's chunks at once: top-k by
// magnitude, the threshold test, and the set bits of bitmaps. Indices come out ascending, as the
// CPU's (fc_select.c, m_thresholdv.c, fc_sparse.c). The threshold and bitmap compactions are
// CUB's (fc_cu_cub.cu); top-k is a radix select of our own, in tiles of SEL_TILE elements:
//   1. sel_top_digit: a histogram of each chunk's keys by their top 11 bits (one read of g'); the
//      last block of a chunk finds the bin d1 of the k-th largest key;
//   2. sel_split: every tile sorts its elements into the surely kept (top digit above d1) and the
//      candidates (top digit d1), two ordered lists in the tile's slot (the second read of g',
//      the last: top-k's encode writes the residual of everything else here), and counts the
//      candidates by their next 10 bits; the last block finds that digit, d2;
//   3. sel_low_digit: the candidates sharing d2, by their low 10 bits: the k-th largest key;
//   4. sel_cut: per tile, the candidates above it and equal to it; the last block finds the cut
//      among the ties (the lowest indices win) and every tile's place in the chunk's list;
//   5. sel_place: every tile writes its kept indices in order (and, for top-k's encode, the
//      index region and the values).
// No memset, no CUB and no one-thread kernel: a chunk's step that needs all of its blocks done
// is the chunk's last block's (a ticket), and histograms are per block in shared memory, added
// by warps (sel_count_bin).
#include "fc_cu_sparse.cuh"

#define SEL_THREADS 256
#define SEL_WARPS (SEL_THREADS / 32)
#define SEL_TILE 4096 // elements of a tile: SEL_ROUNDS rounds of SEL_THREADS
#define SEL_ROUNDS (SEL_TILE / SEL_THREADS)
#define SEL_BINS 2048    // the top digit of a magnitude key (31 bits): key >> 20
#define SEL_LOW 0xFFFFFu // a candidate's key below its top digit: two digits of 10 bits
#define SEL_NONE 0xFFFFFFFFu // no key (past the tile's end); every magnitude key is below it

// One tile of a chunk: what sel_split put in its slot, and what sel_cut found.
struct fc_cu_sel_tile {
    uint32_t above, cand; // the surely kept and the candidates (the tile's two lists)
    uint32_t gt, ties;    // candidates above the k-th largest key and equal to it
    int64_t off;          // the tile's first kept index in the chunk's list
};

int fc_cu_sel_carve(fc_cu_arena &ar, const fc_cu_sel_space &sp, fc_cu_selection *sel, fc_err *err)
{
    int rc = FC_OK;
    memset(sel, 0, sizeof(*sel));
    sel->sp = sp;
    sel->tiles_per = (sp.per + SEL_TILE - 1) / SEL_TILE;
    sel->ch = ar.take<fc_cu_sel_chunk>(sp.chunks);
    sel->idx = ar.take<int64_t>(sp.N);
    sel->num = ar.take<int64_t>(1);
    sel->hist = ar.take<uint32_t>((int64_t)sp.chunks * SEL_BINS);
    sel->slot = ar.take<uint32_t>(sp.N);
    sel->tiles = ar.take<fc_cu_sel_tile>((int64_t)sp.chunks * sel->tiles_per);
    sel->tick = ar.take<unsigned int>(sp.chunks);
    fc_cu_sel_pred p;
    memset(&p, 0, sizeof(p));
    FC_CHECK_CUDA(fc_cu_select_if(NULL, &sel->temp_bytes, p, NULL, NULL, sp.N > 0 ? sp.N : 1, 0),
                  err, error);
    sel->temp = ar.take_bytes(sel->temp_bytes);
error:
    return rc;
}

// ---- the chunk table

// Chunk c of the space: its span, and whether it takes part.
__host__ __device__ __forceinline__ void sel_span(const fc_cu_sel_space &sp, int c, int64_t *start, int64_t *n,
                                                  int *on)
{
    int64_t a = sp.per * (int64_t)c, b = a + sp.per;
    a = a > sp.N ? sp.N : a;
    b = b > sp.N ? sp.N : b;
    *start = a;
    *n = b - a;
    *on = *n > 0 && c != sp.skip;
}

__global__ void sel_init(fc_cu_sel_space sp, uint32_t thr, fc_cu_sel_chunk *ch)
{
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < sp.chunks; c += gridDim.x * blockDim.x) {
        fc_cu_sel_chunk h;
        memset(&h, 0, sizeof(h));
        sel_span(sp, c, &h.start, &h.n, &h.on);
        h.thr = thr;
        h.cut = -1;
        ch[c] = h;
    }
}

__global__ void sel_count(fc_cu_sel_chunk *ch, int chunks, const int64_t *idx, const int64_t *num)
{
    const int64_t total = *num;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += gridDim.x * blockDim.x) {
        // counted selections: chunk c's kept indices are those of idx in [start, start + n)
        const int64_t a = fc_cu_lower_bound(idx, total, ch[c].start);
        const int64_t b = fc_cu_lower_bound(idx, total, ch[c].start + ch[c].n);
        ch[c].off = a;
        ch[c].k = ch[c].on ? b - a : 0;
    }
}

// ---- top-k: the block-wide pieces

// One bin of a shared histogram more for every lane with `valid`, the whole warp calling: the
// lanes that share the first valid lane's bin add together, the rest alone. Gradients crowd into
// a few bins (and zeros into one), so most of a warp's adds are one.
__device__ __forceinline__ void sel_count_bin(uint32_t *h, uint32_t bin, bool valid)
{
    const unsigned act = __ballot_sync(0xffffffffu, valid);
    const int lane = threadIdx.x & 31;
    if (act != 0) {
        const int lead = __ffs((int)act) - 1;
        const uint32_t lb = __shfl_sync(0xffffffffu, bin, lead);
        const unsigned same = __ballot_sync(0xffffffffu, valid && bin == lb);
        if (lane == lead)
            atomicAdd(&h[lb], (uint32_t)__popc(same));
        valid = valid && bin != lb;
    }
    if (valid)
        atomicAdd(&h[bin], 1u);
}

// The exclusive prefix of v over the block's threads in order, *total their sum; every thread
// calls it (its shared memory is free again on return).
__device__ int64_t sel_scan(int64_t v, int64_t *total)
{
    __shared__ int64_t warp_sum[SEL_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        const int64_t t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o)
            incl += t;
    }
    if (lane == 31)
        warp_sum[warp] = incl;
    __syncthreads();
    int64_t before = 0, all = 0;
    for (int w = 0; w < SEL_WARPS; w++) {
        before += w < warp ? warp_sum[w] : 0;
        all += warp_sum[w];
    }
    __syncthreads();
    *total = all;
    return before + incl - v;
}

// The bin of a shared histogram h of `bins` (a multiple of SEL_THREADS) where the want-th largest
// key lies (1 <= want <= its count), and how many keys lie above that bin; every thread gets both.
__device__ void sel_find(const uint32_t *h, int bins, int64_t want, uint32_t *bin, int64_t *above)
{
    __shared__ uint32_t found_bin;
    __shared__ int64_t found_above;
    const int per = bins / SEL_THREADS, hi = bins - (int)threadIdx.x * per; // thread 0: the top bins
    int64_t mine = 0, total;
    for (int b = hi - per; b < hi; b++)
        mine += h[b];
    const int64_t excl = sel_scan(mine, &total);
    if (excl < want && want <= excl + mine) { // one thread
        int64_t w = want - excl;
        int b = hi - 1;
        for (; w > (int64_t)h[b]; b--)
            w -= h[b];
        found_bin = (uint32_t)b;
        found_above = want - w;
    }
    __syncthreads();
    *bin = found_bin;
    *above = found_above;
    __syncthreads();
}

// Whether this block is the last of its chunk's gridDim.x to finish (the blocks' global writes
// before it are visible to it); every thread calls it.
__device__ bool sel_last_block(unsigned int *tick)
{
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(tick, 1u) == gridDim.x - 1;
    __syncthreads();
    return last != 0;
}

// What another block of this kernel wrote, read past the L1 cache.
__device__ __forceinline__ uint32_t sel_load(const uint32_t *p)
{
    return *(const volatile uint32_t *)p;
}

// The shared histogram h of `bins` added into the chunk's global one.
__device__ __forceinline__ void sel_flush(const uint32_t *h, int bins, uint32_t *g)
{
    __syncthreads();
    for (int b = threadIdx.x; b < bins; b += blockDim.x)
        if (h[b] != 0)
            atomicAdd(&g[b], h[b]);
}

// The last block: the chunk's global histogram into shared h, and its first `clear` bins zeroed
// for the next step's.
__device__ __forceinline__ void sel_gather(uint32_t *h, int bins, uint32_t *g, int clear)
{
    for (int b = threadIdx.x; b < bins; b += blockDim.x)
        h[b] = sel_load(&g[b]);
    __syncthreads();
    for (int b = threadIdx.x; b < clear; b += blockDim.x)
        g[b] = 0;
}

// Tile t of a chunk of n: where it starts (chunk-local) and how long it is.
__device__ __forceinline__ int64_t sel_tile_len(int64_t n, int64_t t)
{
    const int64_t left = n - t * SEL_TILE;
    return left < SEL_TILE ? left : SEL_TILE;
}

// Whether candidate entry e of tile t (its index in the tile << 20 | its key's low 20 bits) is
// kept: above the k-th largest key, or equal to it at an index up to the cut.
__device__ __forceinline__ bool sel_cand_kept(const fc_cu_sel_chunk &h, uint32_t e, int64_t t)
{
    const uint32_t low = e & SEL_LOW, thr = h.thr & SEL_LOW;
    return low > thr || (low == thr && t * SEL_TILE + (e >> 20) <= h.cut);
}

// ---- top-k: the steps

// The chunk table (k by the rule, each chunk's place in the list of kept indices), the first
// histogram and the tickets zeroed, and for an encode the value codec's jobs.
__global__ void topk_init(fc_cu_selection sel, fc_cu_krule kr, int emit, fc_cu_sel_emit em)
{
    const fc_cu_sel_space sp = sel.sp;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int64_t w = t0; w < (int64_t)sp.chunks * SEL_BINS; w += stride)
        sel.hist[w] = 0;
    const int64_t kfull = fc_rule_sparse_k(sp.per, kr.k, kr.ratio);
    const int64_t last = (sp.N + sp.per - 1) / sp.per - 1; // the last non-empty chunk
    for (int64_t c = t0; c <= sp.chunks; c += stride) {
        // the kept indices of the chunks before c: all full but the last non-empty one
        int64_t full = c < last ? c : last;
        full -= sp.skip >= 0 && sp.skip < full;
        int64_t off = full * kfull;
        if (c > last && last >= 0 && sp.skip != last)
            off += fc_rule_sparse_k(sp.N - last * sp.per, kr.k, kr.ratio);
        if (c == sp.chunks) {
            *sel.num = off;
            continue;
        }
        fc_cu_sel_chunk h;
        memset(&h, 0, sizeof(h));
        sel_span(sp, (int)c, &h.start, &h.n, &h.on);
        h.k = h.on ? fc_rule_sparse_k(h.n, kr.k, kr.ratio) : 0;
        h.off = off;
        h.all = h.k >= h.n;
        h.cut = h.all ? INT64_MAX : -1;
        h.want = h.k;
        sel.ch[c] = h;
        sel.tick[c] = 0;
        if (emit) {
            fc_cu_vc_job j;
            j.vals = em.vals + off;
            j.k = h.k;
            j.out = h.on ? em.outs.at((int)c) + FC_HEADER_BYTES + em.at + fc_rule_index_bytes(h.n, h.k) : NULL;
            j.rng = fc_cu_vc_rng(em.e.rng, (int)c, em.e.geo.rank);
            em.jobs[c] = j;
        }
    }
}

// 1. The chunk's keys by their top digit; the last block finds d1, the bin of the k-th largest.
__global__ void __launch_bounds__(SEL_THREADS) sel_top_digit(fc_cu_selection sel, fc_cu_src src)
{
    __shared__ uint32_t h[SEL_BINS];
    const int c = blockIdx.y;
    const fc_cu_sel_chunk hc = sel.ch[c];
    if (!hc.on || hc.all)
        return; // the whole block: an `all` chunk keeps everything
    for (int b = threadIdx.x; b < SEL_BINS; b += blockDim.x)
        h[b] = 0;
    __syncthreads();
    const int64_t tiles = (hc.n + SEL_TILE - 1) / SEL_TILE;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int64_t base = t * SEL_TILE, len = sel_tile_len(hc.n, t);
        uint32_t key[SEL_ROUNDS];
#pragma unroll
        for (int r = 0; r < SEL_ROUNDS; r++) { // every load first: all of them in flight
            const int64_t j = r * SEL_THREADS + threadIdx.x;
            key[r] = j < len ? fc_abs_bits(src.x(hc.start + base + j)) : SEL_NONE;
        }
#pragma unroll
        for (int r = 0; r < SEL_ROUNDS; r++) {
            if (r * SEL_THREADS >= len)
                break; // block-uniform: a short tile (a small chunk's) ends early
            sel_count_bin(h, key[r] >> 20, key[r] != SEL_NONE);
        }
    }
    uint32_t *g = sel.hist + (int64_t)c * SEL_BINS;
    sel_flush(h, SEL_BINS, g);
    if (!sel_last_block(&sel.tick[c]))
        return;
    sel_gather(h, SEL_BINS, g, SEL_BINS / 2);
    uint32_t d1;
    int64_t above;
    sel_find(h, SEL_BINS, hc.k, &d1, &above);
    if (threadIdx.x == 0) {
        sel.ch[c].d1 = d1;
        sel.ch[c].want = hc.k - above;
        sel.tick[c] = 0;
    }
}

// 2. Each tile's elements into its two ordered lists in the slot: from the tile's start the
// surely kept (their index in the tile), from its end the candidates (index << 20 | the key's
// low 20 bits); the candidates by their middle digit, whose bin the last block finds (d2). An
// encode's residual of every other element is written here, as fc_cu_res_dense would.
__global__ void __launch_bounds__(SEL_THREADS, 4) sel_split(fc_cu_selection sel, fc_cu_src src, int emit,
                                                          fc_cu_sel_emit em)
{
    __shared__ uint32_t h[SEL_BINS / 2];
    __shared__ uint32_t at[2][SEL_ROUNDS * SEL_WARPS]; // per list, per (round, warp) in tile order
    __shared__ uint32_t count[2];
    const int c = blockIdx.y;
    const fc_cu_sel_chunk hc = sel.ch[c];
    if (!hc.on)
        return;
    for (int b = threadIdx.x; b < SEL_BINS / 2; b += blockDim.x)
        h[b] = 0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned below_me = (1u << lane) - 1u;
    const int ef = emit && em.e.res != NULL, sample = emit && fc_cu_sampled(em.e, c);
    const int residual = emit && em.residual && (ef || sample);
    fc_cu_esum sum;
    int64_t sat = 0;
    const int64_t tiles = (hc.n + SEL_TILE - 1) / SEL_TILE;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int64_t base = t * SEL_TILE, len = sel_tile_len(hc.n, t);
        float x[SEL_ROUNDS];
        uint32_t kept = 0, cand = 0; // bit r: this thread's element of round r is in that list
#pragma unroll
        for (int r = 0; r < SEL_ROUNDS; r++) {
            const int64_t j = r * SEL_THREADS + threadIdx.x;
            x[r] = j < len ? src.x(hc.start + base + j) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < SEL_ROUNDS; r++) {
            if (r * SEL_THREADS >= len) { // block-uniform: past a short tile's end, empty rounds
                if (lane == 0)
                    at[0][r * SEL_WARPS + warp] = at[1][r * SEL_WARPS + warp] = 0;
                continue;
            }
            const bool valid = r * SEL_THREADS + (int)threadIdx.x < len;
            const uint32_t d = fc_abs_bits(x[r]) >> 20;
            const bool k = valid && (hc.all || d > hc.d1), cd = valid && !hc.all && d == hc.d1;
            const unsigned kb = __ballot_sync(0xffffffffu, k), cb = __ballot_sync(0xffffffffu, cd);
            if (lane == 0) {
                at[0][r * SEL_WARPS + warp] = (uint32_t)__popc(kb);
                at[1][r * SEL_WARPS + warp] = (uint32_t)__popc(cb);
            }
            kept |= (uint32_t)k << r;
            cand |= (uint32_t)cd << r;
        }
        __syncthreads();
        if (warp < 2) { // the exclusive prefixes of each list's counts, a warp per list
            uint32_t *a = at[warp];
            const int per = SEL_ROUNDS * SEL_WARPS / 32;
            uint32_t mine = 0;
            for (int q = 0; q < per; q++)
                mine += a[lane * per + q];
            uint32_t incl = mine;
            for (int o = 1; o < 32; o <<= 1) {
                const uint32_t v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o)
                    incl += v;
            }
            uint32_t run = incl - mine;
            for (int q = 0; q < per; q++) {
                const uint32_t v = a[lane * per + q];
                a[lane * per + q] = run;
                run += v;
            }
            if (lane == 31)
                count[warp] = incl;
        }
        __syncthreads();
        const uint32_t nk = count[0], nc = count[1];
        uint32_t *slot = sel.slot + hc.start + base;
#pragma unroll
        for (int r = 0; r < SEL_ROUNDS; r++) {
            if (r * SEL_THREADS >= len)
                break; // block-uniform, as above
            const uint32_t j = r * SEL_THREADS + threadIdx.x;
            const bool k = (kept >> r) & 1u, cd = (cand >> r) & 1u;
            const unsigned kb = __ballot_sync(0xffffffffu, k), cb = __ballot_sync(0xffffffffu, cd);
            const uint32_t key = fc_abs_bits(x[r]);
            if (k)
                slot[at[0][r * SEL_WARPS + warp] + __popc(kb & below_me)] = j;
            if (cd)
                slot[len - nc + at[1][r * SEL_WARPS + warp] + __popc(cb & below_me)] = j << 20 | (key & SEL_LOW);
            sel_count_bin(h, (key >> 10) & 1023u, cd);
            if (residual && !k && !cd && (int64_t)j < len) { // not kept: e = x (fc_cu_res_dense's)
                int64_t s = 0;
                const float e = fc_cu_residual(x[r], -0.0f, &s); // x + -0 = x
                if (ef) {
                    fc_cu_store_res(em.e.res, em.e.rdt, hc.start + base + j, e, &s);
                    sat += s;
                }
                sum.add(x[r], e);
            }
        }
        if (threadIdx.x == 0) {
            fc_cu_sel_tile *tile = &sel.tiles[(int64_t)c * sel.tiles_per + t];
            tile->above = nk;
            tile->cand = nc;
        }
        __syncthreads(); // `at` and `count` again for the next tile
    }
    if (residual) {
        sum.flush(em.e.ws, ef ? em.e.unit_slot : -1, sample);
        fc_cu_count(&em.e.ws->saturated, sat);
    }
    uint32_t *g = sel.hist + (int64_t)c * SEL_BINS;
    sel_flush(h, SEL_BINS / 2, g);
    if (!sel_last_block(&sel.tick[c]))
        return;
    if (!hc.all) {
        sel_gather(h, SEL_BINS / 2, g, SEL_BINS / 2);
        uint32_t d2;
        int64_t above;
        sel_find(h, SEL_BINS / 2, hc.want, &d2, &above);
        if (threadIdx.x == 0) {
            sel.ch[c].d2 = d2;
            sel.ch[c].want = hc.want - above;
        }
    }
    if (threadIdx.x == 0)
        sel.tick[c] = 0;
}

// 3. The candidates of the middle digit d2 by their low digit: the last block finds the k-th
// largest key (thr), its rank among the keys equal to it, and how many there are.
__global__ void __launch_bounds__(SEL_THREADS) sel_low_digit(fc_cu_selection sel)
{
    __shared__ uint32_t h[SEL_BINS / 2];
    const int c = blockIdx.y;
    const fc_cu_sel_chunk hc = sel.ch[c];
    if (!hc.on || hc.all)
        return;
    for (int b = threadIdx.x; b < SEL_BINS / 2; b += blockDim.x)
        h[b] = 0;
    __syncthreads();
    const int64_t tiles = (hc.n + SEL_TILE - 1) / SEL_TILE;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        const fc_cu_sel_tile tile = sel.tiles[(int64_t)c * sel.tiles_per + t];
        const uint32_t *list = sel.slot + hc.start + t * SEL_TILE + sel_tile_len(hc.n, t) - tile.cand;
        for (uint32_t j0 = 0; j0 < tile.cand; j0 += SEL_THREADS) {
            const uint32_t j = j0 + threadIdx.x;
            const uint32_t e = j < tile.cand ? list[j] & SEL_LOW : SEL_NONE;
            sel_count_bin(h, e & 1023u, e != SEL_NONE && (e >> 10) == hc.d2);
        }
    }
    uint32_t *g = sel.hist + (int64_t)c * SEL_BINS;
    sel_flush(h, SEL_BINS / 2, g);
    if (!sel_last_block(&sel.tick[c]))
        return;
    sel_gather(h, SEL_BINS / 2, g, 0);
    uint32_t d3;
    int64_t above;
    sel_find(h, SEL_BINS / 2, hc.want, &d3, &above);
    if (threadIdx.x == 0) {
        sel.ch[c].thr = hc.d1 << 20 | hc.d2 << 10 | d3;
        sel.ch[c].want = hc.want - above;
        sel.ch[c].ties = h[d3];
        sel.tick[c] = 0;
    }
}

// 4. Per tile, the candidates above the k-th largest key and equal to it; the last block finds
// the cut (the want-th of the ties in index order, unless every tie is kept) and each tile's
// place among the chunk's kept indices.
__global__ void __launch_bounds__(SEL_THREADS) sel_cut(fc_cu_selection sel)
{
    __shared__ int64_t found_tile, found_rank, found_cut;
    const int c = blockIdx.y;
    fc_cu_sel_chunk hc = sel.ch[c];
    if (!hc.on)
        return;
    fc_cu_sel_tile *tiles = sel.tiles + (int64_t)c * sel.tiles_per;
    const int64_t ntiles = (hc.n + SEL_TILE - 1) / SEL_TILE;
    const uint32_t thr = hc.thr & SEL_LOW;
    for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
        const uint32_t nc = tiles[t].cand;
        const uint32_t *list = sel.slot + hc.start + t * SEL_TILE + sel_tile_len(hc.n, t) - nc;
        int64_t gt = 0, eq = 0, total;
        for (uint32_t j = threadIdx.x; j < nc; j += SEL_THREADS) {
            const uint32_t low = list[j] & SEL_LOW;
            gt += low > thr;
            eq += low == thr;
        }
        sel_scan(gt, &total);
        gt = total;
        sel_scan(eq, &total);
        if (threadIdx.x == 0) {
            tiles[t].gt = (uint32_t)gt;
            tiles[t].ties = (uint32_t)total;
        }
    }
    if (!sel_last_block(&sel.tick[c]))
        return;
    if (threadIdx.x == 0) {
        found_tile = ntiles; // every tie kept: the cut lies past the chunk
        found_rank = 0;
        found_cut = INT64_MAX;
    }
    __syncthreads();
    int64_t run = 0, total;
    if (!hc.all && hc.want < hc.ties) { // the tile of the want-th tie, then its place there
        for (int64_t t0 = 0; t0 < ntiles; t0 += SEL_THREADS) {
            const int64_t t = t0 + threadIdx.x;
            const int64_t v = t < ntiles ? sel_load(&tiles[t].ties) : 0;
            const int64_t ex = run + sel_scan(v, &total);
            if (ex < hc.want && hc.want <= ex + v) {
                found_tile = t;
                found_rank = hc.want - ex;
            }
            run += total;
            if (run >= hc.want)
                break; // block-uniform: run is every thread's
        }
        __syncthreads();
        const int64_t t = found_tile;
        const uint32_t nc = tiles[t].cand;
        const uint32_t *list = sel.slot + hc.start + t * SEL_TILE + sel_tile_len(hc.n, t) - nc;
        run = 0;
        for (uint32_t j0 = 0; j0 < nc; j0 += SEL_THREADS) {
            const uint32_t j = j0 + threadIdx.x;
            const uint32_t e = j < nc ? list[j] : SEL_NONE;
            const bool tie = e != SEL_NONE && (e & SEL_LOW) == thr;
            const int64_t ex = run + sel_scan(tie, &total);
            if (tie && ex + 1 == found_rank)
                found_cut = t * SEL_TILE + (e >> 20);
            run += total;
            if (run >= found_rank)
                break;
        }
        __syncthreads();
    }
    const int64_t cut_tile = found_tile, cut_rank = found_rank;
    run = 0;
    for (int64_t t0 = 0; t0 < ntiles; t0 += SEL_THREADS) { // each tile's place in the chunk's list
        const int64_t t = t0 + threadIdx.x;
        int64_t v = 0;
        if (t < ntiles) {
            const int64_t ties = sel_load(&tiles[t].ties);
            v = tiles[t].above + sel_load(&tiles[t].gt) + (t < cut_tile ? ties : t == cut_tile ? cut_rank : 0);
        }
        const int64_t ex = run + sel_scan(v, &total);
        if (t < ntiles)
            tiles[t].off = ex;
        run += total;
    }
    if (threadIdx.x == 0) {
        sel.ch[c].cut = found_cut;
        sel.tick[c] = 0;
    }
}

// 5. Every tile's kept indices in order, at its place: the two lists marked in a bitmap of the
// tile, then read out in order. An encode writes the payload's index region (the indices, or
// the bitmap's words as they are) and gathers the kept values of x.
__global__ void __launch_bounds__(SEL_THREADS) sel_place(fc_cu_selection sel, fc_cu_src src, int emit,
                                                          fc_cu_sel_emit em)
{
    __shared__ uint32_t mask[SEL_TILE / 32];
    const int c = blockIdx.y;
    const fc_cu_sel_chunk hc = sel.ch[c];
    if (!hc.on)
        return;
    uint8_t *region = emit ? em.outs.at(c) + FC_HEADER_BYTES + em.at : NULL;
    const int bitmap = fc_rule_use_bitmap(hc.n, hc.k), width = fc_rule_index_width(hc.n);
    const int64_t ntiles = (hc.n + SEL_TILE - 1) / SEL_TILE, words = (hc.n + 31) / 32;
    for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
        const fc_cu_sel_tile tile = sel.tiles[(int64_t)c * sel.tiles_per + t];
        const int64_t base = t * SEL_TILE, len = sel_tile_len(hc.n, t);
        const uint32_t *slot = sel.slot + hc.start + base;
        for (int w = threadIdx.x; w < SEL_TILE / 32; w += blockDim.x)
            mask[w] = 0;
        __syncthreads();
        for (uint32_t j = threadIdx.x; j < tile.above; j += SEL_THREADS)
            atomicOr(&mask[slot[j] >> 5], 1u << (slot[j] & 31));
        for (uint32_t j = threadIdx.x; j < tile.cand; j += SEL_THREADS) {
            const uint32_t e = slot[len - tile.cand + j];
            if (sel_cand_kept(hc, e, t))
                atomicOr(&mask[(e >> 20) >> 5], 1u << ((e >> 20) & 31));
        }
        __syncthreads();
        // thread i reads bits [16 i, 16 i + 16) of the tile: SEL_TILE = 16 * SEL_THREADS
        uint32_t bits = (mask[threadIdx.x >> 1] >> (16 * (threadIdx.x & 1))) & 0xFFFFu;
        int64_t all;
        int64_t pos = hc.off + tile.off + sel_scan(__popc(bits), &all);
        while (bits != 0) {
            const int b = __ffs((int)bits) - 1;
            bits &= bits - 1;
            const int64_t local = base + 16 * threadIdx.x + b;
            sel.idx[pos] = hc.start + local;
            if (emit) {
                em.vals[pos] = src.x(hc.start + local);
                if (!bitmap && width == 2)
                    ((uint16_t *)region)[pos - hc.off] = (uint16_t)local;
                else if (!bitmap)
                    ((uint32_t *)region)[pos - hc.off] = (uint32_t)local;
            }
            pos++;
        }
        if (emit && bitmap) // the tile's words of the chunk's bitmap, every one (zeros too)
            for (int w = threadIdx.x; w < SEL_TILE / 32 && base / 32 + w < words; w += blockDim.x)
                ((uint32_t *)region)[base / 32 + w] = mask[w];
        __syncthreads(); // mask again for the next tile
    }
    if (emit && !bitmap && width == 2 && (hc.k & 1) && blockIdx.x == 0 && threadIdx.x == 0)
        ((uint16_t *)region)[hc.k] = 0; // padding to 4 bytes
}

// After the value codec: the residual at the kept indices (fc_cu_res_fix's: x plus the decode
// with alpha = -1, as sp_corrections makes it) and at the candidates not kept (x).
__global__ void __launch_bounds__(SEL_THREADS) sel_topk_res(fc_cu_selection sel, fc_cu_sel_emit em, fc_cu_vc vc)
{
    const int c = blockIdx.y;
    const fc_cu_sel_chunk hc = sel.ch[c];
    const fc_cu_enc &e = em.e;
    const int ef = e.res != NULL, sample = fc_cu_sampled(e, c);
    if (!hc.on || (!ef && !sample))
        return;
    const uint8_t *v = em.outs.at(c) + FC_HEADER_BYTES + em.at + fc_rule_index_bytes(hc.n, hc.k);
    fc_cu_esum sum;
    int64_t sat = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < hc.k; j += stride) {
        int bad = 0;
        int64_t s = 0;
        const float x = em.vals[hc.off + j], dn = 0.0f + vc.term(v, hc.k, j, -1.0f, &bad);
        const float r = fc_cu_residual(x, dn, &s);
        if (ef) {
            fc_cu_store_res(e.res, e.rdt, sel.idx[hc.off + j], r, &s);
            sat += s;
        }
        sum.add(x, r);
    }
    const int64_t ntiles = (hc.n + SEL_TILE - 1) / SEL_TILE;
    for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
        const uint32_t nc = sel.tiles[(int64_t)c * sel.tiles_per + t].cand;
        const int64_t base = t * SEL_TILE;
        const uint32_t *list = sel.slot + hc.start + base + sel_tile_len(hc.n, t) - nc;
        for (uint32_t j = threadIdx.x; j < nc; j += SEL_THREADS) {
            if (sel_cand_kept(hc, list[j], t))
                continue;
            const int64_t i = hc.start + base + (list[j] >> 20);
            int64_t s = 0;
            const float x = e.src.x(i), r = fc_cu_residual(x, -0.0f, &s);
            if (ef) {
                fc_cu_store_res(e.res, e.rdt, i, r, &s);
                sat += s;
            }
            sum.add(x, r);
        }
    }
    sum.flush(e.ws, ef ? e.unit_slot : -1, sample);
    fc_cu_count(&e.ws->saturated, sat);
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

// Blocks per chunk of the top-k steps: about four tiles each, some thousands in all.
static unsigned sel_blocks(const fc_cu_selection &sel)
{
    int64_t b = (sel.tiles_per + 3) / 4;
    const int64_t most = 4096 / sel.sp.chunks;
    b = b > most ? most : b;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

// The five steps (emit: top-k's encode, with em).
static int topk_steps(const fc_cu_selection &sel, const fc_cu_src &src, const fc_cu_krule &kr, int emit,
                      const fc_cu_sel_emit &em, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    const dim3 grid(sel_blocks(sel), (unsigned)sel.sp.chunks);
    if (sel.sp.N == 0)
        return FC_OK;
    topk_init<<<fc_cu_blocks((int64_t)sel.sp.chunks * SEL_BINS, SEL_THREADS * 4), SEL_THREADS, 0, s>>>(sel, kr, emit, em);
    FC_CHECK_LAUNCH(err, error);
    sel_top_digit<<<grid, SEL_THREADS, 0, s>>>(sel, src);
    FC_CHECK_LAUNCH(err, error);
    sel_split<<<grid, SEL_THREADS, 0, s>>>(sel, src, emit, em);
    FC_CHECK_LAUNCH(err, error);
    sel_low_digit<<<grid, SEL_THREADS, 0, s>>>(sel);
    FC_CHECK_LAUNCH(err, error);
    sel_cut<<<grid, SEL_THREADS, 0, s>>>(sel);
    FC_CHECK_LAUNCH(err, error);
    sel_place<<<grid, SEL_THREADS, 0, s>>>(sel, src, emit, em);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

int fc_cu_select_topk(const fc_cu_selection &sel, const fc_cu_src &src, const fc_cu_krule &kr,
               cudaStream_t s, fc_err *err)
{
    fc_cu_sel_emit none;
    memset(&none, 0, sizeof(none));
    return topk_steps(sel, src, kr, 0, none, s, err);
}

int fc_cu_select_topk_emit(const fc_cu_selection &sel, const fc_cu_krule &kr, const fc_cu_sel_emit &em,
                           cudaStream_t s, fc_err *err)
{
    return topk_steps(sel, em.e.src, kr, 1, em, s, err);
}

int fc_cu_sel_topk_residual(const fc_cu_selection &sel, const fc_cu_sel_emit &em, const fc_cu_vc &vc,
                            cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    if (sel.sp.N == 0 || !em.residual)
        return FC_OK;
    sel_topk_res<<<dim3(sel_blocks(sel), (unsigned)sel.sp.chunks), SEL_THREADS, 0, s>>>(sel, em, vc);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

int fc_cu_select_threshold(const fc_cu_selection &sel, const fc_cu_src &src, float v, cudaStream_t s,
                    fc_err *err)
{
    int rc = FC_OK;
    const int W = sel.sp.chunks;
    if (sel.sp.N == 0)
        return FC_OK;
    // |x| > v as magnitude bits: key > bits(v) for v >= 0 (fc_rule_thrv_keep)
    sel_init<<<fc_cu_blocks(W, SEL_THREADS), SEL_THREADS, 0, s>>>(sel.sp, fc_f32_bits(v), sel.ch);
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
