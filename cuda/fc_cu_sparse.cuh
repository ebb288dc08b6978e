// fc_cu_sparse.cuh: what the sparse, aggregate and stateful methods' kernels share: a call's
// device scratch carved into arrays, the selections (fc_cu_select.cu over CUB, fc_cu_cub.cu),
// the sparsifiers' index coding and value codecs, and the residual passes of a sparse encode.
#ifndef FC_CU_SPARSE_CUH
#define FC_CU_SPARSE_CUH

#include "fc_cu_dense.cuh"
#include "common/fc_sparse_rules.h"

// ---- scratch: one torch tensor per State (csrc/python/state_cuda.c), carved per call. Every method
// carves the same way twice: once with base NULL to size it (scratch_bytes), once to use it.

struct fc_cu_arena {
    uint8_t *base; // NULL: sizing only
    int64_t used, cap;

    template <class T> T *take(int64_t count)
    {
        const int64_t at = (used + 255) / 256 * 256;
        used = at + (count > 0 ? count : 1) * (int64_t)sizeof(T);
        return base != NULL ? (T *)(base + at) : NULL;
    }
    // Room for CUB's temporary storage, whose size CUB reports.
    void *take_bytes(size_t bytes) { return take<uint8_t>((int64_t)bytes); }
};

static inline fc_cu_arena fc_cu_arena_of(const fc_cuda_extra &x)
{
    fc_cu_arena a = {(uint8_t *)x.scratch, 0, x.scratch_bytes};
    return a;
}

// After carving: a real call must fit what scratch_bytes() sized.
static inline int fc_cu_arena_check(const fc_cu_arena &a, fc_err *err)
{
    if (a.base != NULL && a.used > a.cap)
        return fc_fail(err, FC_ERR_STATE, "internal: the call needs %lld bytes of CUDA scratch, "
                       "%lld were provided", (long long)a.used, (long long)a.cap);
    return FC_OK;
}

// A method's parts of one call: `carve` reads its config into *c and carves *p from ar. Each
// method writes that once per direction, and both uses below call it, so what scratch_bytes()
// sized and what the call takes are one code.
template <class A, class C, class P>
using fc_cu_carve_fn = int (*)(const A *a, fc_cu_arena &ar, C *c, P *p, fc_err *err);

// The call's parts carved from its scratch, checked against what that holds.
template <class A, class C, class P>
static int fc_cu_carve_in(const A *a, fc_cu_carve_fn<A, C, P> carve, C *c, P *p, fc_err *err)
{
    fc_cu_arena ar = fc_cu_arena_of(a->h.x);
    const int rc = carve(a, ar, c, p, err);
    return rc != FC_OK ? rc : fc_cu_arena_check(ar, err);
}

// The table entry of a method that carves its parts of a call from the call's scratch (the
// sparse, aggregate and stateful ones), from its config type C, its two carves (the decode's
// reads C too) and its work on what they carved: encode and decode carve, check and run, and
// scratch measures the carves.
template <class C, class EP, fc_cu_carve_fn<fc_cuda_encode_args, C, EP> carve_enc,
          int (*run_enc)(const fc_cuda_encode_args *, const fc_cu_enc *, const C &, EP &, cudaStream_t, fc_err *),
          class DP, fc_cu_carve_fn<fc_cuda_decode_args, C, DP> carve_dec,
          int (*run_dec)(const fc_cuda_decode_args *, const fc_cu_dec *, const C &, DP &, cudaStream_t, fc_err *)>
struct fc_cu_carving {
    static int encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
    {
        C c = C(); // zeros: a config read that failed leaves nothing undefined
        EP p = EP();
        const int rc = fc_cu_carve_in(a, carve_enc, &c, &p, err);
        return rc != FC_OK ? rc : run_enc(a, e, c, p, s, err);
    }

    static int decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
    {
        C c = C();
        DP p = DP();
        const int rc = fc_cu_carve_in(a, carve_dec, &c, &p, err);
        return rc != FC_OK ? rc : run_dec(a, d, c, p, s, err);
    }

    // What the call's scratch must hold (fc_cu_method.scratch): the bytes the carves take from
    // an arena of no memory.
    static int scratch(const fc_cuda_encode_args *enc, const fc_cuda_decode_args *dec, int64_t *bytes, fc_err *err)
    {
        fc_cu_arena ar = {NULL, 0, 0};
        C c = C();
        EP ep = EP();
        DP dp = DP();
        const int rc = enc != NULL ? carve_enc(enc, ar, &c, &ep, err) : carve_dec(dec, ar, &c, &dp, err);
        if (rc == FC_OK)
            *bytes = ar.used;
        return rc;
    }

    static constexpr fc_cu_method entry(int id, int single_without_residual)
    {
        return fc_cu_method{id, encode, decode, scratch, single_without_residual};
    }
};

// The chunk of global index i, for chunks of `per` (inv = 1.0 / per): a double product and a
// correction, instead of a 64-bit division per element.
__device__ __forceinline__ int fc_cu_chunk_of(int64_t i, int64_t per, double inv)
{
    int64_t c = (int64_t)((double)i * inv);
    c -= c * per > i;
    c += (c + 1) * per <= i;
    return (int)c;
}

// ---- selections over an index space [0, N) cut into chunks of `per` (a unit's chunks, or the
// slots of received payloads). One predicate type serves every use, so CUB's DeviceSelect is
// instantiated once (fc_cu_cub.cu).

enum { FC_SEL_ABOVE = 0, FC_SEL_BITS = 2 };

// What a selection knows of one chunk (device memory, fc_cu_select.cu fills it).
struct fc_cu_sel_chunk {
    int64_t start, n; // span in the index space
    int64_t k;        // indices kept (top-k: the rule's; threshold and bitmap: counted)
    int64_t off;      // where the chunk's kept indices start in the output
    uint32_t thr;     // ABOVE: key > thr is kept; top-k: the k-th largest key once found
    int on;           // 0: the chunk takes no part
    int64_t cut;      // ABOVE: key == thr is kept at indices <= cut; top-k: the same, cut
                      // chunk-local
    const uint8_t *bits; // BITS: the chunk's bitmap, bit i - start for index i
    // top-k's radix select (fc_cu_select.cu): `all` keeps every element (k >= n); else the
    // digits of the k-th largest key found so far, and `want`, its rank (1-based, from the top)
    // among the keys that share them; `ties`: the keys equal to the k-th largest
    int all;
    uint32_t d1, d2;
    int64_t want, ties;
};

struct fc_cu_sel_pred {
    int mode;
    fc_cu_src src; // ABOVE: key of i = abs bits of src.x(i)
    int64_t per;
    double inv_per;
    const fc_cu_sel_chunk *ch;

    __device__ __forceinline__ bool operator()(int64_t i) const
    {
        const int c = fc_cu_chunk_of(i, per, inv_per);
        const fc_cu_sel_chunk &h = ch[c];
        if (!h.on)
            return false;
        if (mode == FC_SEL_BITS) {
            const int64_t j = i - h.start;
            return (h.bits[j >> 3] >> (j & 7)) & 1u;
        }
        const uint32_t key = fc_abs_bits(src.x(i));
        return key > h.thr || (key == h.thr && i <= h.cut);
    }
};

// cub::DeviceSelect::If over [0, n): the i with pred(i), ascending, into out; their count into
// *num (device). temp NULL: *temp_bytes gets the size needed (fc_cu_cub.cu).
cudaError_t fc_cu_select_if(void *temp, size_t *temp_bytes, const fc_cu_sel_pred &pred, int64_t *out,
                            int64_t *num, int64_t n, cudaStream_t s);
// cub::DeviceRadixSort::SortPairs by key bits [0, end_bit), stable: equal keys keep their
// values' order (fc_cu_cub.cu).
cudaError_t fc_cu_sort_pairs(void *temp, size_t *temp_bytes, const uint32_t *kin, uint32_t *kout,
                             const float *vin, float *vout, int64_t n, int end_bit, cudaStream_t s);

// The chunks of a selection: chunk c of `chunks` spans [c * per, ...) of N and takes part
// unless it is empty or is `skip` (-1: none).
struct fc_cu_sel_space {
    int64_t N, per;
    int chunks, skip;
};

// The selection space of an encode: every chunk of the unit, the own one skipped unless it is
// compressed too.
static inline fc_cu_sel_space fc_cu_sel_space_of(const fc_cuda_geom &g)
{
    return fc_cu_sel_space{g.numel, g.per > 0 ? g.per : 1, g.world, g.skip_own ? g.rank : -1};
}

// A selection: the chunk table, the output and CUB's temporary storage, carved from the arena;
// top-k's parts too (its radix select works tile by tile, fc_cu_select.cu).
struct fc_cu_sel_tile; // top-k: one tile's counts and output offset
struct fc_cu_selection {
    fc_cu_sel_space sp;
    fc_cu_sel_chunk *ch; // device, sp.chunks entries
    int64_t *idx;        // device, up to N: the kept indices (global), chunk by chunk, ascending
    int64_t *num;        // device: how many
    uint32_t *hist;      // device: top-k's histograms, one per chunk
    uint32_t *slot;      // device, N: top-k's lists per tile (the surely kept, the candidates)
    fc_cu_sel_tile *tiles; // device: top-k's tiles, chunk by chunk (tiles_per each)
    unsigned int *tick;  // device, per chunk: top-k's count of blocks done (the last one picks)
    int64_t tiles_per;   // top-k: tiles of the longest chunk
    void *temp;          // CUB's
    size_t temp_bytes;
};

// How many coordinates a chunk of n keeps: fc_rule_sparse_k(n, k, ratio) (sketch's k is
// fc_rule_sparse_k(n, k, 1.0)).
struct fc_cu_krule {
    int64_t k;
    double ratio;
};

// What every sent chunk of a unit keeps under kr, in all (topk's and randomk's gathered values).
static inline int64_t fc_cu_kept_total(const fc_cuda_geom &g, const fc_cu_krule &kr)
{
    int64_t total = 0;
    for (int c = 0; c < g.world; c++) {
        int64_t start, n;
        fc_cu_span(g, c, &start, &n);
        total += fc_cu_sent(g, c, n) ? fc_rule_sparse_k(n, kr.k, kr.ratio) : 0;
    }
    return total;
}

// Carves a selection over sp from the arena (sizing when the arena has no base).
int fc_cu_sel_carve(fc_cu_arena &ar, const fc_cu_sel_space &sp, fc_cu_selection *sel, fc_err *err);
// Top-k of each chunk by magnitude (fc_select.c's rule: NaN largest, ties to the lowest
// indices), kept indices ascending. Keys are src.x's magnitudes; src is read twice (a histogram
// of the keys' top digit, then the split into the surely kept and the candidates), the rest works
// on the candidates alone (fc_cu_select.cu).
int fc_cu_select_topk(const fc_cu_selection &sel, const fc_cu_src &src, const fc_cu_krule &kr,
               cudaStream_t s, fc_err *err);
// Every i with |src.x(i)| > v (fc_rule_thrv_keep), per chunk counted into k and off.
int fc_cu_select_threshold(const fc_cu_selection &sel, const fc_cu_src &src, float v, cudaStream_t s,
                    fc_err *err);
// The same selection again after the caller turned chunks off (ch[c].on = 0): their indices
// leave the list, their k become 0, the others' offsets follow.
int fc_cu_reselect_threshold(const fc_cu_selection &sel, const fc_cu_src &src, cudaStream_t s,
                             fc_err *err);
// The set bits of the chunks whose table entry the caller filled (start, n, on, bits), per
// chunk counted into k and off.
int fc_cu_select_bits(const fc_cu_selection &sel, cudaStream_t s, fc_err *err);

// Where rank r's payload lies in a receive buffer: uniform slots (fixed sizes), or offsets
// found on the device (data-dependent sizes).
struct fc_cu_payloads {
    const uint8_t *recv;
    fc_cuda_geom geo;
    int64_t slot;
    const int64_t *off; // device, per rank, or NULL
    __device__ __forceinline__ const uint8_t *at(int r) const
    {
        return recv + (off != NULL ? off[r] : fc_cu_recv_off(geo, r, slot));
    }
};

// ---- the value codecs of `quantize` (fc_sparse.c): a dense method at its defaults applied to
// the k kept values of a chunk, which lie in an fp32 array; the block codecs are cuda-dense's
// (fc_cu_codecs.cuh), on an array instead of a chunk of g'. Their bytes follow the indices.

struct fc_cu_vc {
    fc_vc_shape shape;
    fc_cu_fp16_code fp16; // fp16 pre-divides by the world size, as the dense method

    __host__ __device__ int64_t bytes(int64_t k) const
    {
        int64_t v, m;
        fc_rule_vc_layout(&shape, k, &v, &m);
        return v + m;
    }
    __host__ __device__ fc_cu_int8_codec int8() const { return fc_cu_int8_codec{shape.block, shape.stochastic}; }
    __host__ __device__ fc_cu_qsgd_codec qsgd() const
    {
        return fc_cu_qsgd_codec{shape.block, (int32_t)shape.levels_or_bits,
                                fc_qsgd_width(shape.levels_or_bits)};
    }
    __host__ __device__ fc_cu_nc_codec nc() const { return fc_cu_nc_codec{shape.block}; }
    __host__ __device__ fc_cu_intn_codec intn() const
    {
        return fc_cu_intn_codec{shape.block, (int)shape.levels_or_bits, shape.stochastic,
                                shape.minmax ? FC_INTN_MINMAX : FC_INTN_ABSMAX};
    }

    // alpha * D(body)[j] for a body of k values: exactly what the CPU's decode_add adds;
    // *bad set for a code the encoder cannot write.
    __device__ __forceinline__ float term(const uint8_t *b, int64_t k, int64_t j, float alpha,
                                          int *bad) const
    {
        switch (shape.quantize) {
        case FC_VC_NONE:
            return alpha * ((const float *)b)[j];
        case FC_VC_FP16:
            return fp16.term(b, j, alpha);
        case FC_VC_INT8:
            return int8().at(k).term(b, j, alpha, bad);
        case FC_VC_QSGD:
            return qsgd().at(k).term(b, j, alpha, bad);
        case FC_VC_NC:
            return nc().at(k).term(b, j, alpha, bad);
        default:
            return intn().at(k).term(b, j, alpha, bad);
        }
    }
};

// The value codec of a sparsifier's config into *v, as its check() resolved it (fc_vcodec_init),
// checked again: a code the kernels do not know would write garbage no receiver could tell.
static inline int fc_cu_vc_read(const fc_vcodec *c, int world, fc_cu_vc *v, fc_err *err)
{
    memset(v, 0, sizeof(*v));
    v->shape = c->shape;
    v->fp16 = fc_cu_make_fp16(world);
    if (v->shape.quantize < FC_VC_NONE || v->shape.quantize > FC_VC_INTN)
        return fc_fail(err, FC_ERR_VALUE, "quantize code %d is not a value codec", v->shape.quantize);
    if (v->shape.quantize >= FC_VC_INT8)
        return fc_cu_check_block("quantize", "block size", v->shape.block, err);
    return FC_OK;
}

// What topk's and randomk's configs (fc_cfg.h) share: k or the ratio, and the value codec.
template <class K>
static inline int fc_cu_sparsifier_read(const K *k, int world, fc_cu_krule *kr, fc_cu_vc *vc, fc_err *err)
{
    kr->k = k->k;
    kr->ratio = k->ratio;
    return fc_cu_vc_read(&k->vc, world, vc, err);
}

// One chunk's values for the value codec: k fp32 values in, the codec's bytes out, the
// sub-stream of its payload (fc_sparse.c's sub_chunk: chunk id ^ 0x5bd1e995).
struct fc_cu_vc_job {
    const float *vals;
    int64_t k;
    uint8_t *out;
    fc_rng rng;
};

// Encodes jobs[0..count) (device; a job of k = 0 writes nothing); kmax bounds their k, for the
// grid (fc_cu_sparse_common.cu).
int fc_cu_vc_encode(const fc_cu_vc &vc, const fc_cu_vc_job *jobs, int count, int64_t kmax,
                    cudaStream_t s, fc_err *err);

// The sub-stream of the value codec of chunk `chunk`'s payload from `rank`.
__host__ __device__ __forceinline__ fc_rng fc_cu_vc_rng(fc_rng base, int chunk, int rank)
{
    fc_rng r = fc_cu_chunk_rng(base, chunk, rank);
    r.chunk ^= 0x5bd1e995u;
    return r;
}

// Where chunk c's payload lies in a send buffer: the geometry's slots (fixed sizes), or offsets
// found on the device (data-dependent sizes).
struct fc_cu_outs {
    uint8_t *send;
    fc_cuda_geom geo;
    const int64_t *off; // device, per chunk, or NULL
    __device__ __forceinline__ uint8_t *at(int c) const
    {
        return send + (off != NULL ? off[c] : fc_cu_send_off(geo, c));
    }
};

// What top-k's encode has the selection write on its way (fc_cu_topk.cu): each chunk's index
// region and kept values, the value codec's jobs, and the residual of every element surely not
// kept (the rest is fc_cu_sel_topk_residual's, once the values are coded).
struct fc_cu_sel_emit {
    fc_cu_enc e;        // the encode: src, residual, counters, the sender's stream (e.rng)
    fc_cu_outs outs;    // the payloads
    int64_t at;         // the index region's offset in a body
    float *vals;        // out: x at the kept indices, as idx
    fc_cu_vc_job *jobs; // out: per chunk, the value codec's job
    int residual;       // the encode keeps a residual or samples the error statistics
};
int fc_cu_select_topk_emit(const fc_cu_selection &sel, const fc_cu_krule &kr, const fc_cu_sel_emit &em,
                           cudaStream_t s, fc_err *err);
// After the value codec wrote the values (vc): the residual at the kept indices (x plus the
// decode with alpha = -1) and at the candidates not kept (x), with their terms of the sums.
int fc_cu_sel_topk_residual(const fc_cu_selection &sel, const fc_cu_sel_emit &em, const fc_cu_vc &vc,
                            cudaStream_t s, fc_err *err);

// ---- index coding (fc_sparse.c): k ascending coordinates of [0, n) as a bitmap, 16- or 32-bit
// indices, padded to 4 bytes. Every byte of the region is written.

// Writes the index region of each chunk of a selection: chunk c's region at
// outs.at(c) + 32 + at; its indices are idx[off .. off + k) minus its start.
int fc_cu_index_encode(const fc_cu_selection &sel, const fc_cu_outs &outs, int64_t at,
                       cudaStream_t s, fc_err *err);

// ---- the encode of index payloads (topk, thresholdv) after their selection: x gathered at the
// kept indices (vals), the indices written, the values through the codec or, with `sign`,
// thresholdv's sign bits, and the residual (ev: the decode with alpha = -1 at the kept
// indices, scratch for it). jobs: chunks entries;
// kmax bounds a chunk's k (the grid); total bounds the kept indices of all chunks.
struct fc_cu_sp_values {
    fc_cu_vc vc;
    int sign;     // thresholdv "values": "sign": one bit per kept element, decoding to +-v
    float sign_v; // v
};

int fc_cu_sp_encode(const fc_cu_selection &sel, const fc_cu_enc &e, const fc_cu_outs &outs, int64_t at,
                    const fc_cu_sp_values &vals_as, float *vals, float *ev, fc_cu_vc_job *jobs,
                    int64_t kmax, int64_t total, cudaStream_t s, fc_err *err);

// One received index payload, as its decode reads it (device; the method fills it).
struct fc_cu_sp_desc {
    int64_t off;     // the payload's start in the receive buffer
    int64_t k;       // coordinates it carries
    int width;       // indices: 0 a bitmap, 2 or 4 bytes each; FC_CU_SP_NONE: a `none` payload
                     // in the method's place (every value, in the gradient's dtype, at at_vals)
    int64_t at_idx;  // body offsets of the indices and of the values
    int64_t at_vals;
};

enum { FC_CU_SP_NONE = -1 };

struct fc_cu_sp_decoder {
    fc_cu_selection sel;  // the set bits of one payload's bitmap at a time
    float *acc;           // the own chunk's fp32 sum
    fc_cu_sp_desc *desc;  // per rank
};

// The decoder's parts for g's own chunk (its length in *n), carved from ar.
int fc_cu_sp_carve(fc_cu_arena &ar, const fc_cuda_geom &g, fc_cu_sp_decoder *dec, int64_t *n, fc_err *err);

// What a decode through the decoder above carves: its parts and the own chunk's length.
struct fc_cu_sp_parts {
    fc_cu_sp_decoder dec;
    int64_t n;
};

// The carve of a sparsifier whose decode is the decoder above (topk, thresholdv), with its
// config read by `config`.
template <class C, int (*config)(const fc_cuda_method_cfg *, int, C *, fc_err *)>
static int fc_cu_sp_carve_decode(const fc_cuda_decode_args *a, fc_cu_arena &ar, C *c, fc_cu_sp_parts *p,
                                 fc_err *err)
{
    const int rc = config(&a->h.m, a->h.geo.world, c, err);
    return rc != FC_OK ? rc : fc_cu_sp_carve(ar, a->h.geo, &p->dec, &p->n, err);
}
// Every sender's payload (desc, filled) checked and added at its indices, in rank order with
// the own chunk in its place, then out = acc / W; in add mode (decompress()) rank 0's payload
// alone, out += alpha * D. A malformed payload is rejected as the CPU decoder would raise, and
// poisons the sum.
int fc_cu_sp_decode(const fc_cu_sp_decoder &dec, const fc_cu_dec &d, const fc_cu_sp_values &vals_as,
                    uint32_t unit, uint32_t step, cudaStream_t s, fc_err *err);

// ---- the residual of a sparse encode: e = x everywhere but at the kept coordinates, where
// e = x + (the method's decode with alpha = -1), both under fc_cu_residual's rules (a chunk
// that passed NaN/Inf included: its residual is replaced too). Two passes: dense (e = x), then
// the kept coordinates; each sums only its own elements into ||e||^2 and the statistics.

// Dense pass over every sent chunk but the kept coordinates idx[0, *num or n) (global,
// ascending; idx NULL: none kept): fc_cu_enc's residual, statistics and chunk flags; a chunk
// flagged FC_CU_ELSEWHERE is left to its own pass (thresholdv's `none` payloads).
int fc_cu_res_dense(const fc_cu_enc &e, const int64_t *idx, const int64_t *num, int64_t n,
                    cudaStream_t s, fc_err *err);
#define FC_CU_ELSEWHERE 0xFFFFFFFFu
// Kept coordinates: at global index idx[j], x = xv[j] and the decode with alpha = -1 is dn[j],
// j < *num (device) or < n when num is NULL.
int fc_cu_res_fix(const fc_cu_enc &e, const int64_t *idx, const float *xv, const float *dn,
                  const int64_t *num, int64_t n, cudaStream_t s, fc_err *err);

// ---- decode of sparse payloads: an fp32 accumulator of the own chunk, scatter-adds in rank
// order, then out = acc / W in out's dtype (FSDP's tail zeroed; fc_cu_store_out's rules: NaN/Inf
// pass only where the sum brought them, fc_output_passes of fc_cu_sum_passes and the own element).

// own 0: acc = 0 (the CPU's sum starts from zero); own 1: acc += own where the own chunk comes
// in rank order (its exact values, when it is not sent); then out = acc / W.
int fc_cu_acc_own(const fc_cu_dec &d, float *acc, int own, cudaStream_t s, fc_err *err);
// out = (0 + own) / W everywhere, NaN everywhere when a payload was rejected (randomk, sketch).
int fc_cu_own_dense(const fc_cu_dec &d, cudaStream_t s, fc_err *err);
int fc_cu_acc_write(const fc_cu_dec &d, const float *acc, cudaStream_t s, fc_err *err);
// A rejected payload poisons the sum (every element NaN), as the dense decode does.
// Whether a sender's payload was rejected (its header or body): the decode's output is NaN.
__device__ __forceinline__ int fc_cu_any_rejected(const fc_cu_dec &d)
{
    for (int r = 0; r < d.geo.world; r++)
        if (!(d.geo.skip_own && r == d.geo.rank) && d.bad[r] != 0)
            return 1;
    return 0;
}

__device__ __forceinline__ float fc_cu_poison()
{
    return fc_bits_f32(FC_NAN_BITS);
}

// A compressed-domain decode's pass over its picks (randomk, sketch), after fc_cu_own_dense wrote
// (0 + own) / W everywhere: out[i] = ((0 + own) + t) / W at pick i, the counts of what
// fc_cu_own_dense stored there moved to what this stores. One per thread, made after the return
// of a rejected payload's decode (fc_cu_any_rejected: fc_cu_own_dense made everything NaN).
struct fc_cu_at_picks {
    const fc_cu_dec &d;
    int64_t start, n;
    float w;
    int passed, own_pass;
    int64_t was, now, was_sat, now_sat;

    __device__ explicit fc_cu_at_picks(const fc_cu_dec &dec)
        : d(dec), w((float)dec.geo.world), passed(fc_cu_sum_passes(dec)), own_pass(fc_cu_own_pass(dec)), was(0),
          now(0), was_sat(0), now_sat(0)
    {
        fc_cu_span(d.geo, d.geo.rank, &start, &n);
    }

    __device__ void put(int64_t i, float t)
    {
        float acc = fc_cu_own_first(d, start + i);
        const int p = fc_output_passes(passed, own_pass, acc); // acc: 0 + own, its NaN/Inf as own's
        fc_cu_store_out(d.out, d.odt, i, acc / w, p, &was, &was_sat); // what fc_cu_own_dense counted
        acc += t;
        fc_cu_store_out(d.out, d.odt, i, acc / w, p, &now, &now_sat);
    }

    // the counts move by now - was (negative where fewer: the unsigned add wraps, a subtraction)
    __device__ void done()
    {
        fc_cu_count(&d.ws->nonfinite_out, now - was);
        fc_cu_count(&d.ws->saturated, now_sat - was_sat);
    }
};

// Records the first malformed payload (the CPU decoder's PayloadError), as check_headers does.
__device__ __forceinline__ void fc_cu_reject(fc_cuda_ws *ws, unsigned int *bad, int r,
                                             unsigned int code, uint32_t unit, uint32_t step)
{
    if (atomicCAS(&bad[r], 0u, code) == 0u && atomicCAS(&ws->payload_error, 0u, code) == 0u) {
        ws->payload_error_rank = r;
        ws->payload_error_unit = unit;
        ws->payload_error_step = step;
    }
}

// ---- the second round (fc_cu_fetch.cu): an encode keeps its per-chunk non-finite flags in the
// fetch buffer (the decode reuses the workspace's); the owner's decode writes its picks there.
int fc_cu_fetch_keep_flags(uint8_t *fetch, const fc_cuda_ws *ws, int world, cudaStream_t s,
                           fc_err *err);
uint32_t *fc_cu_fetch_picks_at(uint8_t *fetch);

// ---- launch shapes

static inline unsigned fc_cu_blocks(int64_t work, int per_block)
{
    int64_t b = (work + per_block - 1) / per_block;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

#endif
