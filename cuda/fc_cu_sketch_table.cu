// fc_cu_sketch_table.cu: sketch's tables (m_sketch.c's encode) on the GPU without a sort. The CPU
// adds each bucket's terms sign * x_i in index order; a bucket's sum is a serial chain, so the
// device must hand every bucket its terms in index order. A stable partition does that in two
// levels, each a counting sort whose order comes from the element order (no comparison of
// indices, no float reordered):
//   skt_count   per tile of 2048 elements, how many terms fall in each group of 32 buckets of
//               each row (hashes only: no gradient read)
//   skt_scan    per group, the tiles' counts into offsets (where each tile's terms go)
//   skt_scatter per tile: g' read once, every row's terms ranked within the tile by group
//               (stable: warp ballots, then warps in order) and written to their group's run,
//               with the bucket within the group
//   skt_walk    per group: its run in chunks of 2048, each ranked by bucket the same way into
//               shared memory while a walker warp (a lane per bucket) adds the previous chunk's
//               terms in order: the chain of each bucket sees its terms in index order
// Four launches per pass of up to SKT_ROWS rows, every chunk of the unit at once; the sort it
// replaces took about six per row (a pairs kernel, CUB's radix sort, a bucket kernel whose
// threads walked their runs with a dependent global load per term).
#include "fc_cu_sketch.cuh"

#define SKT_THREADS 256
#define SKT_WARPS (SKT_THREADS / 32)
#define SKT_TILE 2048 // elements a block ranks at a time: 8 a thread
#define SKT_PER (SKT_TILE / SKT_THREADS)
#define SKT_GROUP 32  // buckets per group: a walker lane each
#define SKT_MAX_GROUPS (SKT_MAX_COLS / SKT_GROUP)
#define SKT_BINS SKT_MAX_GROUPS // keys of a ranking: groups of a row, or buckets of a group

// One pass: rows [j0, j0 + rows) of every sent chunk.
struct skt_pass {
    fc_cuda_geom geo;
    int j0, rows;
    int gc;      // groups per row (of the widest table): the stride of the count columns
    int64_t tpc; // tiles per chunk (of the longest): the stride of a column's counts
};

// Column (c, row jj of the pass, group g) of the counts.
__host__ __device__ __forceinline__ int64_t skt_col(const skt_pass &t, int c, int jj, int g)
{
    return ((int64_t)c * t.rows + jj) * t.gc + g;
}

// Where chunk c's terms start in the pass's arrays: rows x the sent elements before it (the
// chunks are contiguous; the own chunk kept exact is not sent).
__host__ __device__ __forceinline__ int64_t skt_obase(const skt_pass &t, int c)
{
    int64_t start, n, os, on;
    fc_cu_span(t.geo, c, &start, &n);
    if (t.geo.skip_own && t.geo.rank < c) {
        fc_cu_span(t.geo, t.geo.rank, &os, &on);
        start -= on;
    }
    return start * t.rows;
}

// Bits that hold every key up to v.
__device__ __forceinline__ int skt_bits(unsigned v)
{
    int b = 1;
    while (b < 32 && (v >> b) != 0)
        b++;
    return b;
}

// The stable rank of this lane's key among a row of the warp's 32 items (lane order) after the
// rows before: cnt[key] (the warp's running counts) + the lanes below with the same key, found
// by one ballot per key bit; the highest such lane then advances cnt[key].
__device__ __forceinline__ unsigned skt_warp_rank(unsigned key, int bits, unsigned *cnt)
{
    const unsigned lane = threadIdx.x & 31;
    unsigned peers = FC_CU_FULL;
    for (int b = 0; b < bits; b++) {
        const unsigned v = __ballot_sync(FC_CU_FULL, (key >> b) & 1u);
        peers &= ((key >> b) & 1u) ? v : ~v;
    }
    const unsigned r = cnt[key] + (unsigned)__popc(peers & ((1u << lane) - 1u));
    __syncwarp();
    if ((peers >> lane) == 1u)
        cnt[key] += (unsigned)__popc(peers);
    __syncwarp();
    return r;
}

// Warp 0 only: the first place of each of nb keys in the block's items (loc[b], loc[nb] the
// total) ordered by (key, warp, the warp's order), and wc[w][b] turned from warp w's count of
// key b into the first place of its items of key b.
__device__ __forceinline__ void skt_places(unsigned (*wc)[SKT_BINS], int nb, unsigned *loc)
{
    const int lane = threadIdx.x & 31, per = (nb + 31) / 32;
    unsigned sum = 0;
    for (int x = 0; x < per; x++) {
        const int b = lane * per + x;
        if (b < nb)
            for (int w = 0; w < SKT_WARPS; w++)
                sum += wc[w][b];
    }
    unsigned incl = sum;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned v = __shfl_up_sync(FC_CU_FULL, incl, o);
        if (lane >= o)
            incl += v;
    }
    unsigned run = incl - sum;
    for (int x = 0; x < per; x++) {
        const int b = lane * per + x;
        if (b < nb) {
            loc[b] = run;
            for (int w = 0; w < SKT_WARPS; w++) {
                const unsigned c = wc[w][b];
                wc[w][b] = run;
                run += c;
            }
        }
    }
    if (lane == 31)
        loc[nb] = incl;
}

// A sent chunk's span, its table width and its groups; false for a chunk that is not sent.
__device__ __forceinline__ bool skt_chunk(const skt_pass &t, const sk_cfg &cfg, int c, int64_t *start, int64_t *n,
                                          uint32_t *w, int *groups)
{
    fc_cu_span(t.geo, c, start, n);
    if (!fc_cu_sent(t.geo, c, *n))
        return false;
    *w = (uint32_t)sk_width(cfg, *n);
    *groups = (int)((*w + SKT_GROUP - 1) / SKT_GROUP);
    return true;
}

// A per-tile kernel's chunk (blockIdx.y): its span, table width, groups and tiles.
struct skt_span {
    int64_t start, n, tiles;
    uint32_t w;
    int groups;
};

// The opening of a per-tile kernel: chunk c's span and the like into *s, and its row keys into
// keys; false (for the whole block) where the chunk is not sent or the block has no tile of it.
__device__ __forceinline__ bool skt_block(const skt_pass &t, const sk_cfg &cfg, fc_rng shared, int c, uint32_t *keys,
                                          skt_span *s)
{
    if (!skt_chunk(t, cfg, c, &s->start, &s->n, &s->w, &s->groups))
        return false;
    s->tiles = (s->n + SKT_TILE - 1) / SKT_TILE;
    if ((int64_t)blockIdx.x >= s->tiles)
        return false;
    sk_keys(shared, c, cfg.rows, keys);
    return true;
}

// Per tile of chunk blockIdx.y: the terms of each (row, group), into the counts' columns.
__global__ void __launch_bounds__(SKT_THREADS) skt_count(skt_pass t, sk_cfg cfg, fc_rng shared, uint32_t *cnt)
{
    __shared__ uint32_t keys[SK_MAX_ROWS];
    __shared__ unsigned hist[SKT_ROWS * SKT_MAX_GROUPS];
    const int c = blockIdx.y;
    skt_span ch;
    if (!skt_block(t, cfg, shared, c, keys, &ch))
        return;
    const int nb = t.rows * t.gc;
    for (int64_t tl = blockIdx.x; tl < ch.tiles; tl += gridDim.x) {
        for (int b = threadIdx.x; b < nb; b += SKT_THREADS)
            hist[b] = 0;
        __syncthreads();
        for (int q = threadIdx.x; q < SKT_TILE && tl * SKT_TILE + q < ch.n; q += SKT_THREADS) {
            const uint64_t i = (uint64_t)(tl * SKT_TILE + q);
            for (int jj = 0; jj < t.rows; jj++) {
                const uint32_t col = fc_sketch_col(fc_sketch_hash(i, keys[t.j0 + jj]), ch.w);
                atomicAdd(&hist[jj * t.gc + (int)(col / SKT_GROUP)], 1u);
            }
        }
        __syncthreads();
        for (int b = threadIdx.x; b < nb; b += SKT_THREADS)
            cnt[(skt_col(t, c, 0, 0) + b) * t.tpc + tl] = hist[b];
        __syncthreads();
    }
}

// A warp per column: its tiles' counts into exclusive offsets (in place), the total into tot.
__global__ void skt_scan(skt_pass t, sk_cfg cfg, uint32_t *cnt, uint32_t *tot)
{
    const int lane = threadIdx.x & 31;
    const int64_t cols = (int64_t)t.geo.world * t.rows * t.gc, warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t col = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; col < cols; col += warps) {
        int64_t start, n;
        uint32_t w;
        int groups;
        const bool on = skt_chunk(t, cfg, (int)(col / ((int64_t)t.rows * t.gc)), &start, &n, &w, &groups);
        const int64_t tiles = on ? (n + SKT_TILE - 1) / SKT_TILE : 0;
        uint32_t *v = cnt + col * t.tpc;
        uint32_t run = 0;
        for (int64_t b0 = 0; b0 < tiles; b0 += 32 * 8) {
            uint32_t x[8], sum = 0;
            for (int k = 0; k < 8; k++) {
                const int64_t at = b0 + lane * 8 + k;
                x[k] = at < tiles ? v[at] : 0u;
                sum += x[k];
            }
            uint32_t incl = sum;
            for (int o = 1; o < 32; o <<= 1) {
                const uint32_t y = __shfl_up_sync(FC_CU_FULL, incl, o);
                if (lane >= o)
                    incl += y;
            }
            uint32_t r = run + incl - sum;
            for (int k = 0; k < 8; k++) {
                const int64_t at = b0 + lane * 8 + k;
                if (at < tiles)
                    v[at] = r;
                r += x[k];
            }
            run += __shfl_sync(FC_CU_FULL, incl, 31);
        }
        if (lane == 0)
            tot[col] = run;
    }
}

// Per tile: g' once, then each row's terms stably ranked by group within the tile (element q of
// the tile is warp q / 256's row (q % 256) / 32, lane q % 32: warps, rows and lanes in element
// order), staged in that order and written to their group's run at the tile's offset: each
// group's run of a row ends up in index order, the bucket within the group beside each term.
__global__ void __launch_bounds__(SKT_THREADS) skt_scatter(fc_cu_enc e, skt_pass t, sk_cfg cfg, fc_rng shared,
                                                           const uint32_t *off, const uint32_t *tot, float *terms,
                                                           uint8_t *fine)
{
    __shared__ uint32_t keys[SK_MAX_ROWS];
    __shared__ unsigned wc[SKT_WARPS][SKT_BINS];
    __shared__ unsigned loc[SKT_BINS + 1];
    __shared__ int64_t base[SKT_MAX_GROUPS];
    __shared__ float st[SKT_TILE];
    __shared__ uint16_t sk[SKT_TILE];
    const int c = blockIdx.y;
    skt_span ch;
    if (!skt_block(t, cfg, shared, c, keys, &ch))
        return;
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, bits = skt_bits((unsigned)ch.groups - 1u);
    const int64_t obase = skt_obase(t, c);
    for (int64_t tl = blockIdx.x; tl < ch.tiles; tl += gridDim.x) {
        const int64_t i0 = tl * SKT_TILE;
        float x[SKT_PER];
#pragma unroll
        for (int k = 0; k < SKT_PER; k++) {
            const int64_t i = i0 + wp * (SKT_TILE / SKT_WARPS) + k * 32 + lane;
            x[k] = i < ch.n ? e.src.x(ch.start + i) : 0.0f;
        }
        for (int jj = 0; jj < t.rows; jj++) {
            if (wp == 0) { // where this tile's terms of each group go: the run's start + the tile's offset
                const int per = (ch.groups + 31) / 32;
                const int64_t col0 = skt_col(t, c, jj, 0);
                int64_t sum = 0;
                for (int x2 = 0; x2 < per; x2++) {
                    const int g = lane * per + x2;
                    if (g < ch.groups)
                        sum += tot[col0 + g];
                }
                int64_t incl = sum;
                for (int o = 1; o < 32; o <<= 1) {
                    const int64_t y = __shfl_up_sync(FC_CU_FULL, incl, o);
                    if (lane >= o)
                        incl += y;
                }
                int64_t run = obase + jj * ch.n + incl - sum;
                for (int x2 = 0; x2 < per; x2++) {
                    const int g = lane * per + x2;
                    if (g < ch.groups) {
                        base[g] = run + off[(col0 + g) * t.tpc + tl];
                        run += tot[col0 + g];
                    }
                }
            }
            for (int b = lane; b < ch.groups; b += 32)
                wc[wp][b] = 0;
            __syncwarp();
            const uint32_t key = keys[t.j0 + jj];
            unsigned kk[SKT_PER], rk[SKT_PER];
            float tm[SKT_PER];
#pragma unroll
            for (int k = 0; k < SKT_PER; k++) {
                const int64_t row = i0 + wp * (SKT_TILE / SKT_WARPS) + k * 32, i = row + lane;
                kk[k] = (unsigned)(ch.groups - 1) << 5; // past the end: the last group, after its terms
                tm[k] = 0.0f;
                if (i < ch.n) {
                    const uint32_t h = fc_sketch_hash((uint64_t)i, key);
                    kk[k] = fc_sketch_col(h, ch.w); // group << 5 | bucket in the group
                    tm[k] = fc_sketch_sign(h) * x[k];
                }
                if (row < ch.n) // a row of the warp wholly past the end takes no place
                    rk[k] = skt_warp_rank(kk[k] >> 5, bits, wc[wp]);
            }
            __syncthreads();
            if (wp == 0)
                skt_places(wc, ch.groups, loc);
            __syncthreads();
#pragma unroll
            for (int k = 0; k < SKT_PER; k++) {
                if (i0 + wp * (SKT_TILE / SKT_WARPS) + k * 32 < ch.n) {
                    const unsigned p = wc[wp][kk[k] >> 5] + rk[k];
                    st[p] = tm[k];
                    sk[p] = (uint16_t)kk[k];
                }
            }
            __syncthreads();
            // the tile's terms (those past the end take the last places) out, runs of a group coalesced
            const unsigned valid = (unsigned)(ch.n - i0 < SKT_TILE ? ch.n - i0 : SKT_TILE);
            for (unsigned p = threadIdx.x; p < valid; p += SKT_THREADS) {
                const int g = sk[p] >> 5;
                const int64_t at = base[g] + (p - loc[g]);
                terms[at] = st[p];
                fine[at] = (uint8_t)(sk[p] & 31u);
            }
            __syncthreads();
        }
    }
}

// One chain step of a walker lane: plain (SAT 0) or fc_add_sat's.
template <bool SAT> __device__ __forceinline__ float skt_add(float acc, float v)
{
    int64_t sat = 0; // the codec's own count: not kept on the device
    return SAT ? fc_add_sat(acc, v, &sat) : acc + v;
}

#define SKT_WALK_THREADS (SKT_THREADS + 32) // the ranking warps and the walker

// One pass over a group's run (skt_walk): chunk i is ranked by bucket into st[i & 1] by warps
// 0..7 while warp 8 (a lane per bucket) adds chunk i - 1's terms of its bucket in order into acc
// (plain float sums, or with SAT fc_add_sat's for the lanes `on`).
template <bool SAT>
__device__ __forceinline__ float skt_walk_pass(const float *terms, const uint8_t *fine, int64_t rb, int64_t len,
                                               int nbk, float (*st)[SKT_TILE], unsigned (*wc)[SKT_BINS],
                                               unsigned (*loc)[SKT_GROUP + 1], bool on)
{
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, bits = skt_bits((unsigned)nbk - 1u);
    const int64_t chunks = (len + SKT_TILE - 1) / SKT_TILE;
    float acc = 0.0f;
    unsigned kk[SKT_PER], rk[SKT_PER];
    float tm[SKT_PER];
    for (int64_t i = 0; i <= chunks; i++) {
        const int b = (int)(i & 1);
        if (wp < SKT_WARPS) {
            if (i < chunks) {
                wc[wp][lane] = 0;
                __syncwarp();
#pragma unroll
                for (int k = 0; k < SKT_PER; k++) {
                    const int64_t row = i * SKT_TILE + wp * (SKT_TILE / SKT_WARPS) + k * 32, p = row + lane;
                    tm[k] = p < len ? terms[rb + p] : 0.0f;
                    kk[k] = p < len ? fine[rb + p] : (unsigned)nbk - 1u; // past the end: after the last bucket's
                    if (row < len) // a row of the warp wholly past the end takes no place
                        rk[k] = skt_warp_rank(kk[k], bits, wc[wp]);
                }
            }
        } else if (i > 0 && lane < nbk && (!SAT || on)) { // the walker: chunk i - 1, in order per bucket
            const float *v = st[b ^ 1];
            const int64_t left = len - (i - 1) * SKT_TILE;
            const unsigned valid = (unsigned)(left < SKT_TILE ? left : SKT_TILE), end = loc[b ^ 1][lane + 1];
            unsigned p = loc[b ^ 1][lane];
            const unsigned hi = end < valid ? end : valid; // the last bucket's places past the end: none
            for (; p + 8 <= hi; p += 8) { // the loads ahead of the dependent adds
                float r[8];
#pragma unroll
                for (int u = 0; u < 8; u++)
                    r[u] = v[p + u];
#pragma unroll
                for (int u = 0; u < 8; u++)
                    acc = skt_add<SAT>(acc, r[u]);
            }
            for (; p < hi; p++)
                acc = skt_add<SAT>(acc, v[p]);
        }
        __syncthreads();
        if (i < chunks && wp == 0)
            skt_places(wc, nbk, loc[b]);
        __syncthreads();
        if (i < chunks && wp < SKT_WARPS) {
#pragma unroll
            for (int k = 0; k < SKT_PER; k++)
                if (i * SKT_TILE + wp * (SKT_TILE / SKT_WARPS) + k * 32 < len)
                    st[b][wc[wp][kk[k]] + rk[k]] = tm[k];
        }
        __syncthreads();
    }
    return acc;
}

// Per group (blockIdx.x) of a row of a chunk (blockIdx.y): the 32 buckets' sums into the chunk's
// table, each bucket's terms in index order from 0.0f. The chains run with plain float sums
// first (a step costs an add's latency): that is fc_add_sat's result whenever the chain ends
// finite, as the two agree up to a sum that overflowed to +-Inf (or a NaN/Inf term, which both
// carry), and from there the plain chain stays Inf or NaN. A bucket that ends non-finite is
// summed again with fc_add_sat in a second pass of its block (rare: sums beyond fp32, NaN/Inf).
__global__ void __launch_bounds__(SKT_WALK_THREADS, 1) skt_walk(fc_cu_enc e, skt_pass t, sk_cfg cfg, const uint32_t *tot,
                                                             const float *terms, const uint8_t *fine)
{
    __shared__ float st[2][SKT_TILE];
    __shared__ unsigned wc[SKT_WARPS][SKT_BINS];
    __shared__ unsigned loc[2][SKT_GROUP + 1];
    __shared__ int64_t rb;
    __shared__ int again;
    const int g = blockIdx.x, c = blockIdx.y / t.rows, jj = blockIdx.y - c * t.rows;
    int64_t start, n;
    uint32_t w;
    int groups;
    if (!skt_chunk(t, cfg, c, &start, &n, &w, &groups) || g >= groups)
        return;
    const int64_t col0 = skt_col(t, c, jj, 0);
    if (threadIdx.x == 0) { // the group's run: after the row's earlier groups
        int64_t at = skt_obase(t, c) + jj * n;
        for (int q = 0; q < g; q++)
            at += tot[col0 + q];
        rb = at;
        again = 0;
    }
    __syncthreads();
    const int64_t len = tot[col0 + g];
    const int nbk = (int)(w - (uint32_t)g * SKT_GROUP < SKT_GROUP ? w - (uint32_t)g * SKT_GROUP : SKT_GROUP);
    const bool walker = threadIdx.x >= SKT_THREADS;
    float acc = skt_walk_pass<false>(terms, fine, rb, len, nbk, st, wc, loc, true);
    const bool redo = walker && !(fc_abs_bits(acc) < FC_INF_BITS);
    if (redo)
        again = 1;
    __syncthreads();
    if (again) { // the whole block: the saturating chains of the buckets that need them
        const float a2 = skt_walk_pass<true>(terms, fine, rb, len, nbk, st, wc, loc, redo);
        acc = redo ? a2 : acc;
    }
    const uint32_t bucket = (uint32_t)g * SKT_GROUP + (threadIdx.x & 31);
    if (walker && bucket < w) {
        float *table = (float *)(e.send + fc_cu_send_off(e.geo, c) + FC_HEADER_BYTES);
        table[(int64_t)(t.j0 + jj) * w + bucket] = fc_canon_nan(acc);
    }
}

void sk_table_carve(fc_cu_arena &ar, const fc_cuda_geom &g, const sk_cfg &c, sk_table_parts *p)
{
    const int rows = c.rows < SKT_ROWS ? c.rows : SKT_ROWS;
    const int64_t gc = (c.cols + SKT_GROUP - 1) / SKT_GROUP, tpc = (g.per + SKT_TILE - 1) / SKT_TILE;
    p->terms = ar.take<float>(g.numel * rows);
    p->fine = ar.take<uint8_t>(g.numel * rows);
    p->cnt = ar.take<uint32_t>((int64_t)g.world * rows * gc * (tpc > 0 ? tpc : 1));
    p->tot = ar.take<uint32_t>((int64_t)g.world * rows * gc);
}

int sk_table_build(const fc_cu_enc &e, const sk_cfg &c, fc_rng shared, const sk_table_parts &p, cudaStream_t s,
                   fc_err *err)
{
    int rc = FC_OK;
    skt_pass t;
    t.geo = e.geo;
    t.gc = (int)((c.cols + SKT_GROUP - 1) / SKT_GROUP);
    t.tpc = (e.geo.per + SKT_TILE - 1) / SKT_TILE;
    if (t.tpc < 1 || e.geo.numel <= 0)
        return FC_OK;
    for (t.j0 = 0; t.j0 < c.rows; t.j0 += SKT_ROWS) {
        t.rows = c.rows - t.j0 < SKT_ROWS ? c.rows - t.j0 : SKT_ROWS;
        const dim3 tiles((unsigned)(t.tpc < 65535 ? t.tpc : 65535), (unsigned)e.geo.world);
        const int64_t cols = (int64_t)e.geo.world * t.rows * t.gc;
        skt_count<<<tiles, SKT_THREADS, 0, s>>>(t, c, shared, p.cnt);
        FC_CHECK_LAUNCH(err, error);
        skt_scan<<<fc_cu_blocks(cols, SKT_WARPS), SKT_THREADS, 0, s>>>(t, c, p.cnt, p.tot);
        FC_CHECK_LAUNCH(err, error);
        skt_scatter<<<tiles, SKT_THREADS, 0, s>>>(e, t, c, shared, p.cnt, p.tot, p.terms, p.fine);
        FC_CHECK_LAUNCH(err, error);
        skt_walk<<<dim3((unsigned)t.gc, (unsigned)(e.geo.world * t.rows)), SKT_WALK_THREADS, 0, s>>>(e, t, c, p.tot,
                                                                                                   p.terms, p.fine);
        FC_CHECK_LAUNCH(err, error);
    }
error:
    return rc;
}
