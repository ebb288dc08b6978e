// fc_cu_randomk.cu: kernels of `randomk` (m_randomk.c): the k coordinates of a chunk from the
// stream every rank shares, by the CPU's selection sampling cut into segments that run side by
// side (csrc/common/fc_randk_par.h: the same picks, in five steps), the values through the value codec;
// receivers sum the senders' decoded values per coordinate in rank order (the compressed domain)
// and scatter the sum once, scaled by n / k, onto the own chunk. The two walks of exact values
// (steps 3 and 4) are a warp's each: the events of a segment are resolved 32 at a time, and a
// segment whose window failed is simulated by the warp, a Philox call per lane (a chunk's last
// few thousand elements fail as a rule: there every trajectory of the window converges, each
// step an event), so no thread replays elements one by one.
#include "fc_cu_sparse.cuh"
#include "common/fc_randk_par.h"

#define RK_THREADS 128
#define RK_SPREAD 6.0 // windows of 6 standard deviations: a window misses rarely, never wrongly
#define RK_FULL 0xffffffffu

struct rk_cfg {
    fc_cu_krule kr;
    int scale;
    fc_cu_vc vc;
};

static int config(const fc_cuda_method_cfg *m, int world, rk_cfg *c, fc_err *err)
{
    memset(c, 0, sizeof(*c));
    const fc_randomk_cfg *k = fc_cu_cfg_of<fc_randomk_cfg>(m);
    c->scale = k->scale != 0;
    return fc_cu_sparsifier_read(k, world, &c->kr, &c->vc, err);
}

// The chunks whose coordinates are drawn: every sent one (encode), or the own one (decode,
// chunks = 1); each with room for the segments of the longest chunk.
struct rk_space {
    fc_cuda_geom geo;
    int decode, chunks;
    fc_cu_krule kr;
    fc_rng base; // key and (unit, step); chunk: the id of chunk 0 (compress()'s `chunk`, else 0),
                 // plus the chunk's index per chunk: the shared stream (no rank)
    int64_t s1, s2;
    fc_rk_seg *segs1, *segs2;
    fc_rk_event *ev1, *ev2;
    int64_t *x1, *x2;
    int64_t *idx; // the picks as unit (encode) or chunk (decode) indices, chunk after chunk
    unsigned int *left; // 0 after a correct walk (checked by nobody but tests and sanitizers)
};

struct rk_chunk {
    int on;
    int c;
    int64_t start, n, k, off;
    fc_rng g;
};

__host__ __device__ __forceinline__ rk_chunk rk_chunk_at(const rk_space &sp, int y)
{
    rk_chunk h;
    h.c = sp.decode ? sp.geo.rank : y;
    fc_cu_span(sp.geo, h.c, &h.start, &h.n);
    h.on = sp.decode ? h.n > 0 : fc_cu_sent(sp.geo, h.c, h.n);
    h.k = h.on ? fc_rule_sparse_k(h.n, sp.kr.k, sp.kr.ratio) : 0;
    h.off = 0;
    if (!sp.decode && sp.geo.per > 0) { // the picks of the sent chunks before, back to back: every
        // chunk but the last non-empty one is full
        const int64_t last = fc_chunk_nonempty(sp.geo.numel, sp.geo.per) - 1;
        int64_t full = h.c < last ? h.c : last;
        full -= sp.geo.skip_own && sp.geo.rank < full;
        h.off = full * fc_rule_sparse_k(sp.geo.per, sp.kr.k, sp.kr.ratio);
        if (h.c > last && !(sp.geo.skip_own && sp.geo.rank == last))
            h.off += fc_rule_sparse_k(sp.geo.numel - last * sp.geo.per, sp.kr.k, sp.kr.ratio);
    }
    h.g = sp.base;
    h.g.chunk = sp.base.chunk + (uint32_t)h.c;
    return h;
}

__global__ void rk_level1(rk_space sp)
{
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
        *sp.left = 0; // counted from step 3 on
    const rk_chunk h = rk_chunk_at(sp, blockIdx.y);
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (h.on && j < fc_rk_segs1(h.n))
        fc_rk_level1(&h.g, h.n, h.k, j, RK_SPREAD, sp.segs1 + blockIdx.y * sp.s1,
                     sp.ev1 + blockIdx.y * sp.s1 * FC_RK_CAP1);
}

__global__ void rk_level2(rk_space sp)
{
    const rk_chunk h = rk_chunk_at(sp, blockIdx.y);
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (h.on && t < fc_rk_segs2(h.n))
        fc_rk_level2(h.n, h.k, t, RK_SPREAD, sp.segs1 + blockIdx.y * sp.s1, sp.ev1 + blockIdx.y * sp.s1 * FC_RK_CAP1,
                     sp.segs2 + blockIdx.y * sp.s2, sp.ev2 + blockIdx.y * sp.s2 * FC_RK_CAP2);
}

// ---- the walks of exact values, a warp each

// The events of one batch (lane j holds the batch's event j; a lane without one holds key
// UINT64_MAX) for entry x with `extra` of them fired before: the new extra, every lane's. An
// event fires as in fc_rk_eval; the lowest lane that fires with the extra known so far does fire
// (the lanes before it do not, with that same extra), so each round settles one.
__device__ __forceinline__ int64_t rk_fire(int64_t x, int64_t extra, uint64_t key, int64_t before)
{
    const int lane = threadIdx.x & 31;
    int from = 0;
    for (;;) {
        const bool f = lane >= from && key < ((uint64_t)(x - before - extra) << 32);
        const unsigned m = __ballot_sync(RK_FULL, f);
        if (m == 0)
            return extra;
        from = __ffs((int)m); // the lane after the one that fired
        extra++;
    }
}

// fc_rk_eval by a warp: a usable segment's exit for entry x.
__device__ int64_t rk_warp_eval(const fc_rk_seg &s, const fc_rk_event *ev, int64_t x)
{
    const int lane = threadIdx.x & 31;
    int64_t extra = 0;
    for (int e0 = 0; e0 < s.nev; e0 += 32) {
        const int e = e0 + lane;
        const uint64_t key = e < s.nev ? ev[e].key : UINT64_MAX;
        const int64_t before = e < s.nev ? ev[e].before : 0;
        extra = rk_fire(x, extra, key, before);
    }
    return x - s.dlo - extra;
}

// fc_rk_run's need left after elements [lo, hi) (lo a multiple of 4) from need x, by a warp: a
// Philox call per lane draws 128 elements a round; a take is an event of before 0 whose key is
// the draw times the elements left, resolved 32 elements at a time in order.
__device__ int64_t rk_warp_run(const fc_rng *g, int64_t n, int64_t lo, int64_t hi, int64_t x)
{
    const int lane = threadIdx.x & 31;
    for (int64_t q0 = lo; q0 < hi && x > 0; q0 += 128) {
        const fc_u32x4 r = fc_rng_draw4(g, (uint32_t)((q0 >> 2) + lane));
        for (int b = 0; b < 4; b++) { // elements q0 + 32 b + lane: word lane & 3 of lane 8 b + lane / 4
            const int from = 8 * b + (lane >> 2), w = lane & 3;
            const uint32_t v0 = __shfl_sync(RK_FULL, r.v[0], from), v1 = __shfl_sync(RK_FULL, r.v[1], from);
            const uint32_t v2 = __shfl_sync(RK_FULL, r.v[2], from), v3 = __shfl_sync(RK_FULL, r.v[3], from);
            const uint32_t v = w == 0 ? v0 : w == 1 ? v1 : w == 2 ? v2 : v3;
            const int64_t q = q0 + 32 * b + lane;
            const uint64_t key = q < hi ? (uint64_t)v * (uint64_t)(n - q) : UINT64_MAX;
            x -= rk_fire(x, 0, key, 0); // fc_rule_randk_take's test, need x - takes so far
        }
    }
    return x;
}

// fc_rk_step1 by a warp.
__device__ __forceinline__ int64_t rk_warp_step1(const fc_rng *g, int64_t n, int64_t j, const fc_rk_seg &s,
                                                 const fc_rk_event *ev, int64_t x)
{
    if (fc_rk_usable(&s, x))
        return rk_warp_eval(s, ev, x);
    const int64_t lo = j * FC_RK_L1, hi = lo + FC_RK_L1 < n ? lo + FC_RK_L1 : n;
    return rk_warp_run(g, n, lo, hi, x);
}

// A segment's header broadcast from the lane that loaded it.
__device__ __forceinline__ fc_rk_seg rk_seg_from(const fc_rk_seg &mine, int lane)
{
    fc_rk_seg s;
    s.a = __shfl_sync(RK_FULL, mine.a, lane);
    s.b = __shfl_sync(RK_FULL, mine.b, lane);
    s.dlo = __shfl_sync(RK_FULL, mine.dlo, lane);
    s.nev = __shfl_sync(RK_FULL, mine.nev, lane);
    s.over = __shfl_sync(RK_FULL, mine.over, lane);
    return s;
}

// 3. fc_rk_top by a warp per chunk: the headers of 32 level-2 segments at a time, and their
// first 32 events, staged in shared memory (the walk waits on no load per segment).
__global__ void __launch_bounds__(32) rk_top(rk_space sp)
{
    __shared__ uint64_t skey[32][32];
    __shared__ int64_t sbefore[32][32];
    const int y = blockIdx.x, lane = threadIdx.x;
    const rk_chunk h = rk_chunk_at(sp, y);
    if (!h.on)
        return;
    const fc_rk_seg *segs1 = sp.segs1 + y * sp.s1, *segs2 = sp.segs2 + y * sp.s2;
    const fc_rk_event *ev1 = sp.ev1 + y * sp.s1 * FC_RK_CAP1, *ev2 = sp.ev2 + y * sp.s2 * FC_RK_CAP2;
    const int64_t s1 = fc_rk_segs1(h.n), s2 = fc_rk_segs2(h.n);
    int64_t x = h.k;
    for (int64_t t0 = 0; t0 < s2; t0 += 32) {
        fc_rk_seg mine;
        memset(&mine, 0, sizeof(mine));
        if (t0 + lane < s2)
            mine = segs2[t0 + lane];
        for (int q = 0; q < 32 && t0 + q < s2; q++) { // lane: event `lane` of each segment
            const int nev = __shfl_sync(RK_FULL, mine.nev, q);
            if (lane < nev) {
                skey[q][lane] = ev2[(t0 + q) * FC_RK_CAP2 + lane].key;
                sbefore[q][lane] = ev2[(t0 + q) * FC_RK_CAP2 + lane].before;
            }
        }
        __syncwarp();
        for (int q = 0; q < 32 && t0 + q < s2; q++) {
            const int64_t t = t0 + q;
            const fc_rk_seg s = rk_seg_from(mine, q);
            if (lane == 0)
                sp.x2[y * sp.s2 + t] = x;
            if (fc_rk_usable(&s, x)) {
                int64_t extra = rk_fire(x, 0, lane < s.nev ? skey[q][lane] : UINT64_MAX, lane < s.nev ? sbefore[q][lane] : 0);
                for (int e0 = 32; e0 < s.nev; e0 += 32) { // past the staged ones
                    const int e = e0 + lane;
                    extra = rk_fire(x, extra, e < s.nev ? ev2[t * FC_RK_CAP2 + e].key : UINT64_MAX,
                                    e < s.nev ? ev2[t * FC_RK_CAP2 + e].before : 0);
                }
                x = x - s.dlo - extra;
                continue;
            }
            // walked through its level-1 segments: their entries are written here, and step 4
            // finds the level-2 entry marked done (-1 - x) and leaves them
            if (lane == 0)
                sp.x2[y * sp.s2 + t] = -1 - x;
            for (int64_t j = t * FC_RK_G; j < (t + 1) * FC_RK_G && j < s1; j++) {
                if (lane == 0)
                    sp.x1[y * sp.s1 + j] = x;
                x = rk_warp_step1(&h.g, h.n, j, segs1[j], ev1 + j * FC_RK_CAP1, x);
            }
        }
        __syncwarp(); // the stage again
    }
    if (lane == 0 && x != 0)
        atomicAdd(sp.left, 1u);
}

// 4. fc_rk_mid by a warp per level-2 segment: its level-1 segments' exact entries (unless step 3
// walked them already).
__global__ void __launch_bounds__(RK_THREADS) rk_mid(rk_space sp)
{
    const rk_chunk h = rk_chunk_at(sp, blockIdx.y);
    const int64_t t = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (!h.on || t >= fc_rk_segs2(h.n))
        return; // the whole warp
    const fc_rk_seg *segs1 = sp.segs1 + blockIdx.y * sp.s1;
    const fc_rk_event *ev1 = sp.ev1 + blockIdx.y * sp.s1 * FC_RK_CAP1;
    const int64_t s1 = fc_rk_segs1(h.n), j1 = (t + 1) * FC_RK_G < s1 ? (t + 1) * FC_RK_G : s1;
    int64_t x = sp.x2[blockIdx.y * sp.s2 + t];
    if (x < 0)
        return; // step 3 walked this one (the whole warp)
    for (int64_t j0 = t * FC_RK_G; j0 < j1; j0 += 32) {
        fc_rk_seg mine;
        memset(&mine, 0, sizeof(mine));
        if (j0 + lane < j1)
            mine = segs1[j0 + lane];
        for (int q = 0; q < 32 && j0 + q < j1; q++) {
            const int64_t j = j0 + q;
            if (lane == 0)
                sp.x1[blockIdx.y * sp.s1 + j] = x;
            x = rk_warp_step1(&h.g, h.n, j, rk_seg_from(mine, q), ev1 + j * FC_RK_CAP1, x);
        }
    }
}

__global__ void rk_emit(rk_space sp)
{
    const rk_chunk h = rk_chunk_at(sp, blockIdx.y);
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (h.on && j < fc_rk_segs1(h.n))
        fc_rk_emit(&h.g, h.n, h.k, j, sp.x1 + blockIdx.y * sp.s1, sp.idx + h.off, sp.decode ? 0 : h.start);
}

static void carve_space(fc_cu_arena &ar, const fc_cuda_geom &geo, int decode, const fc_cu_krule &kr, int64_t total,
                        rk_space *sp)
{
    memset(sp, 0, sizeof(*sp));
    sp->geo = geo;
    sp->decode = decode;
    sp->chunks = decode ? 1 : geo.world;
    sp->kr = kr;
    sp->s1 = fc_rk_segs1(geo.per);
    sp->s2 = fc_rk_segs2(geo.per);
    sp->segs1 = ar.take<fc_rk_seg>(sp->chunks * sp->s1);
    sp->segs2 = ar.take<fc_rk_seg>(sp->chunks * sp->s2);
    sp->ev1 = ar.take<fc_rk_event>(sp->chunks * sp->s1 * FC_RK_CAP1);
    sp->ev2 = ar.take<fc_rk_event>(sp->chunks * sp->s2 * FC_RK_CAP2);
    sp->x1 = ar.take<int64_t>(sp->chunks * sp->s1);
    sp->x2 = ar.take<int64_t>(sp->chunks * sp->s2);
    sp->idx = ar.take<int64_t>(total);
    sp->left = ar.take<unsigned int>(1);
}

// The five steps of fc_randk_par.h over every chunk of the space.
static int draw(const rk_space &sp, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    const dim3 g1(fc_cu_blocks(sp.s1, RK_THREADS), (unsigned)sp.chunks);
    const dim3 g2(fc_cu_blocks(sp.s2, RK_THREADS), (unsigned)sp.chunks);
    rk_level1<<<g1, RK_THREADS, 0, s>>>(sp);
    FC_CHECK_LAUNCH(err, error);
    rk_level2<<<g2, RK_THREADS, 0, s>>>(sp);
    FC_CHECK_LAUNCH(err, error);
    rk_top<<<(unsigned)sp.chunks, 32, 0, s>>>(sp);
    FC_CHECK_LAUNCH(err, error);
    rk_mid<<<dim3(fc_cu_blocks(sp.s2 * 32, RK_THREADS), (unsigned)sp.chunks), RK_THREADS, 0, s>>>(sp);
    FC_CHECK_LAUNCH(err, error);
    rk_emit<<<g1, RK_THREADS, 0, s>>>(sp);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

// n / k as the CPU's randk_factor: (float)((double)n / (double)k), or 1 without `scale`.
__host__ __device__ __forceinline__ float rk_factor(int scale, int64_t n, int64_t k)
{
    return scale ? (float)((double)n / (double)k) : 1.0f;
}

// ---- encode

// g' at the picks (vals: the residual's x) and what the codec gets of it (enc: saturated where
// the scaled decode would not be finite, fc_rule_randk_value, as m_randomk.c's encode).
__global__ void rk_gather(rk_space sp, fc_cu_src src, int scale, int64_t total, float *vals, float *enc)
{
    const double inv = 1.0 / (double)(sp.geo.per > 0 ? sp.geo.per : 1);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < total; j += stride) {
        const rk_chunk h = rk_chunk_at(sp, fc_cu_chunk_of(sp.idx[j], sp.geo.per, inv));
        int64_t sat = 0; // a codec's own saturation: not counted on the device (docs/methods.md)
        vals[j] = src.x(sp.idx[j]);
        enc[j] = fc_rule_randk_value(vals[j], rk_factor(scale, h.n, h.k), &sat);
    }
}

__global__ void rk_jobs(rk_space sp, uint8_t *send, float *vals, fc_rng base, fc_cu_vc_job *jobs)
{
    for (int y = threadIdx.x; y < sp.chunks; y += blockDim.x) {
        const rk_chunk h = rk_chunk_at(sp, y);
        fc_cu_vc_job j;
        j.vals = vals + h.off;
        j.k = h.k;
        j.out = h.on ? send + fc_cu_send_off(sp.geo, h.c) + FC_HEADER_BYTES : NULL;
        j.rng = fc_cu_vc_rng(base, h.c, sp.geo.rank);
        jobs[y] = j;
    }
}

// The decode at the picks with alpha = -1: a * (0 + D), a = -1 * n / k, the CPU's decode_add
// (the values decoded into zeros with alpha 1, then scattered with alpha * factor).
__global__ void rk_corrections(rk_space sp, const uint8_t *send, int scale, fc_cu_vc vc, float *ev,
                               int64_t total)
{
    const double inv = 1.0 / (double)(sp.geo.per > 0 ? sp.geo.per : 1);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < total; j += stride) {
        const rk_chunk h = rk_chunk_at(sp, fc_cu_chunk_of(sp.idx[j], sp.geo.per, inv));
        const float a = -1.0f * rk_factor(scale, h.n, h.k);
        int bad = 0;
        const float d = 0.0f + vc.term(send + fc_cu_send_off(sp.geo, h.c) + FC_HEADER_BYTES, h.k, j - h.off, 1.0f, &bad);
        ev[j] = a * d;
    }
}

struct rk_enc_parts {
    rk_space sp;
    float *vals, *enc, *ev;
    fc_cu_vc_job *jobs;
    int64_t total;
};

static int carve_encode(const fc_cuda_encode_args *a, fc_cu_arena &ar, rk_cfg *c, rk_enc_parts *p, fc_err *err)
{
    const int rc = config(&a->h.m, a->h.geo.world, c, err);
    if (rc != FC_OK)
        return rc;
    p->total = fc_cu_kept_total(a->h.geo, c->kr);
    carve_space(ar, a->h.geo, 0, c->kr, p->total, &p->sp);
    p->vals = ar.take<float>(p->total);
    p->enc = ar.take<float>(p->total);
    p->ev = ar.take<float>(p->total);
    p->jobs = ar.take<fc_cu_vc_job>(a->h.geo.world);
    return FC_OK;
}

// The decode's: the own chunk's k picks, drawn as every sender drew them.
static int carve_decode(const fc_cuda_decode_args *a, fc_cu_arena &ar, rk_cfg *c, rk_space *sp, fc_err *err)
{
    int64_t start, n;
    const int rc = config(&a->h.m, a->h.geo.world, c, err);
    if (rc != FC_OK)
        return rc;
    fc_cu_span(a->h.geo, a->h.geo.rank, &start, &n);
    carve_space(ar, a->h.geo, 1, c->kr, fc_rule_sparse_k(n, c->kr.k, c->kr.ratio), sp);
    return FC_OK;
}

static int encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, const rk_cfg &c, rk_enc_parts &p, cudaStream_t s,
                  fc_err *err)
{
    int rc = FC_OK;
    p.sp.base = fc_cu_call_rng(a->h);
    {
        const unsigned gb = fc_cu_blocks(p.total, FC_CU_THREADS * 4);
        FC_TRY(draw(p.sp, s, err));
        rk_gather<<<gb, FC_CU_THREADS, 0, s>>>(p.sp, e->src, c.scale, p.total, p.vals, p.enc);
        FC_CHECK_LAUNCH(err, error);
        rk_jobs<<<1, 256, 0, s>>>(p.sp, a->send, p.enc, e->rng, p.jobs);
        FC_CHECK_LAUNCH(err, error);
        FC_TRY(fc_cu_vc_encode(c.vc, p.jobs, a->h.geo.world, fc_rule_sparse_k(a->h.geo.per, c.kr.k, c.kr.ratio), s, err));
        if (e->res != NULL || e->sample) {
            rk_corrections<<<gb, FC_CU_THREADS, 0, s>>>(p.sp, a->send, c.scale, c.vc, p.ev, p.total);
            FC_CHECK_LAUNCH(err, error);
            FC_TRY(fc_cu_res_dense(*e, p.sp.idx, NULL, p.total, s, err));
            FC_TRY(fc_cu_res_fix(*e, p.sp.idx, p.vals, p.ev, NULL, p.total, s, err));
        }
    }
error:
    return rc;
}

// ---- decode: every sender's values checked, summed per coordinate in rank order, scattered

__device__ __forceinline__ const uint8_t *rk_values(const fc_cu_dec &d, int r)
{
    return d.recv + fc_cu_recv_off(d.geo, r, d.slot) + FC_HEADER_BYTES;
}

__global__ void rk_check(fc_cu_dec d, fc_cu_vc vc, int64_t k, uint32_t unit, uint32_t step)
{
    const int r = blockIdx.y;
    if ((d.geo.skip_own && r == d.geo.rank) || d.bad[r] != 0)
        return;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < k; j += stride) {
        int bad = 0;
        (void)vc.term(rk_values(d, r), k, j, 1.0f, &bad);
        if (bad)
            fc_cu_reject(d.ws, d.ws->bad, r, FC_PAYLOAD_CODES, unit, step);
    }
}

// At the picks: (0 + own) + a * sum, the sum of the senders' decoded values (from 0, rank
// order), a = 1 * n / k; the output there rewritten, its non-finite count moved with it.
__global__ void rk_picks(fc_cu_dec d, fc_cu_vc vc, const int64_t *idx, int64_t k, float a)
{
    if (fc_cu_any_rejected(d))
        return; // fc_cu_own_dense made everything NaN
    fc_cu_at_picks out(d);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < k; j += stride) {
        const float sum = fc_cu_fold_senders(d.geo, [&](float s, int r) {
            int bad = 0;
            return s + vc.term(rk_values(d, r), k, j, 1.0f, &bad); // fc_vcodec_decode_add into the sum
        });
        out.put(idx[j], a * sum);
    }
    out.done();
}

// decompress(): out += alpha * D of the one payload (rank 0's), the CPU's decode_add: its values
// decoded into zeros (0 + D), scattered at the picks times a = alpha * n / k; a rejected payload
// makes every element NaN.
__global__ void rk_add(fc_cu_dec d, fc_cu_vc vc, const int64_t *idx, int64_t n, int64_t k, float a)
{
    float *out = (float *)d.out;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (d.bad[0] != 0) {
        for (int64_t i = t0; i < n; i += stride)
            fc_cu_add_canon(out + i, fc_cu_poison());
        return;
    }
    for (int64_t j = t0; j < k; j += stride) {
        int bad = 0;
        fc_cu_add_canon(out + idx[j], a * (0.0f + vc.term(rk_values(d, 0), k, j, 1.0f, &bad)));
    }
}

static int decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, const rk_cfg &c, rk_space &sp, cudaStream_t s,
                  fc_err *err)
{
    int rc = FC_OK;
    int64_t start, n;
    fc_cu_span(a->h.geo, a->h.geo.rank, &start, &n);
    {
        const int64_t k = fc_rule_sparse_k(n, c.kr.k, c.kr.ratio);
        const int senders = n > 0 ? a->h.geo.world - (a->h.geo.skip_own ? 1 : 0) : 0;
        sp.base = fc_cu_call_rng(a->h);
        if (d->add) { // decompress(): one payload, no own chunk, no division by W
            if (k > 0) {
                rk_check<<<dim3(fc_cu_blocks(k, FC_CU_THREADS * 4), 1), FC_CU_THREADS, 0, s>>>(*d, c.vc, k, a->h.unit,
                                                                                            a->h.step);
                FC_CHECK_LAUNCH(err, error);
                FC_TRY(draw(sp, s, err));
            }
            rk_add<<<fc_cu_blocks(n, FC_CU_THREADS * 4), FC_CU_THREADS, 0, s>>>(
                *d, c.vc, sp.idx, n, k, d->alpha * rk_factor(c.scale, n, k));
            FC_CHECK_LAUNCH(err, error);
            return FC_OK;
        }
        if (senders > 0 && k > 0) {
            rk_check<<<dim3(fc_cu_blocks(k, FC_CU_THREADS * 4), (unsigned)a->h.geo.world), FC_CU_THREADS, 0, s>>>(
                *d, c.vc, k, a->h.unit, a->h.step);
            FC_CHECK_LAUNCH(err, error);
        }
        FC_TRY(fc_cu_own_dense(*d, s, err));
        if (senders > 0 && k > 0) {
            FC_TRY(draw(sp, s, err));
            rk_picks<<<fc_cu_blocks(k, FC_CU_THREADS), FC_CU_THREADS, 0, s>>>(*d, c.vc, sp.idx, k,
                                                                          1.0f * rk_factor(c.scale, n, k));
            FC_CHECK_LAUNCH(err, error);
        }
    }
error:
    return rc;
}

extern const fc_cu_method fc_cu_randomk =
    fc_cu_carving<rk_cfg, rk_enc_parts, carve_encode, encode, rk_space, carve_decode, decode>::entry(FC_ID_RANDOMK, 0);
