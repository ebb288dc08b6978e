// fc_cu_parts.cu: a parts method on CUDA (adaptive, csrc/methods/m_adaptive.c): each span of a
// chunk (fc_cuda_part, walked on the host from the unit's parts table) goes through its rung's own
// single-payload kernels (this library's compress()/decompress() on a one-chunk geometry of the
// span, so its bytes are the rung's CPU bytes), and the small kernels here do what the driver's
// do around one method: the chunk's NaN/Inf count and flag, its header and padding, the
// alignment gaps, the unit's ||e||^2, a sampled call's error statistics (its chunks decoded
// again); on the receiving side the header checks, the rank-order sum with the own chunk and the
// output rules.
//
// Cost per call (counted in tests/cuda/test_cuda_call_counts.py), P the spans of the call's chunks:
// an encode is a memset and a count launch, per span a rung compress() (1 launch for the dense
// rungs, 6 for dct), a device-to-device copy and a memset where an alignment gap precedes it, and a
// header launch per sent chunk (error feedback: a memset and a launch for the residual norm; a
// sampled call: each sent chunk decoded again as below, and a sum launch each); a decode is two
// memsets, a header check, two launches for the own chunk, per sender and span a staging launch and
// a rung decompress() (1 to 3 launches), and the output pass. Each rung call times itself (two event
// records). One fused dispatch kernel (a switch on each span's rung inside the dense codecs'
// one-pass encode and fused decode) would be the fast version, one launch a call; this one runs the
// rung kernels as they are, so its bytes are theirs by construction.
#include "common/fc_counters.h"
#include "fc_cu_ctx.cuh"

extern "C" const fc_cuda_api *fc_cuda_get_api(int abi); // compress()/decompress() of the rungs

static inline int64_t elem_bytes(int dt)
{
    return dt == FC_CU_F32 ? 4 : 2;
}

static inline int64_t up256(int64_t v)
{
    return (v + 255) / 256 * 256;
}

// The one-chunk geometry of a span of n elements whose body is `bytes` (compress()'s).
static fc_cuda_geom span_geo(int world, int rank, int64_t n, int64_t bytes)
{
    fc_cuda_geom g;
    memset(&g, 0, sizeof(g));
    g.numel = g.per = n;
    g.world = world;
    g.rank = rank;
    g.pay_full = g.pay_last = fc_align_up(FC_HEADER_BYTES + bytes);
    g.body_full = g.body_last = bytes;
    return g;
}

// ---- kernels

// A chunk's header (flagged where its NaN/Inf pass) and the zero padding after its body.
__global__ void parts_header(uint8_t *p, fc_header_key key, int64_t n, int64_t body, int64_t size,
                             const unsigned int *flag, int zero)
{
    if (threadIdx.x == 0) {
        fc_header h;
        fc_header_make(&h, &key, (uint64_t)n, (uint64_t)body, fc_chunk_passes(*flag, zero) ? FC_HDR_NONFINITE : 0u);
        memcpy(p, &h, sizeof(h));
    }
    for (int64_t i = FC_HEADER_BYTES + body + threadIdx.x; i < size; i += blockDim.x)
        p[i] = 0;
}

// The unit's ||e||^2 (counters' residual_norm) over the sent chunks' new residuals.
__global__ void parts_unit_sq(fc_cuda_geom geo, const void *res, int rdt, double *unit_sq)
{
    const int c = blockIdx.y;
    int64_t start, n;
    fc_cu_span(geo, c, &start, &n);
    if (!fc_cu_sent(geo, c, n))
        return;
    double ee = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const double e = fc_cu_load(res, rdt, start + i);
        ee += e * e;
    }
    ee = fc_cu_warp_sum(ee);
    if ((threadIdx.x & 31) == 0 && ee != 0)
        atomicAdd(unit_sq, ee);
}

// check_headers' rule (fc_header_verdict) with the body the parts table gives the own chunk:
// verdict[r] per sender, *passed where an accepted payload is flagged NONFINITE, the first
// rejection kept in the workspace for counters() to raise.
__global__ void parts_check(fc_cuda_geom geo, const uint8_t *recv, int64_t slot, int senders, fc_header_key key,
                            int64_t n, int64_t body, unsigned int *verdict, unsigned int *passed, fc_cuda_ws *ws)
{
    for (int r = threadIdx.x; r < senders; r += blockDim.x) {
        if (geo.skip_own && r == geo.rank)
            continue;
        fc_header h;
        memcpy(&h, recv + fc_cu_recv_off(geo, r, slot), sizeof(h));
        const unsigned int code = fc_header_verdict(&h, &key, (uint64_t)n, (uint64_t)body, 0, slot);
        verdict[r] = code;
        if (code == 0 && (h.flags & FC_HDR_NONFINITE))
            *passed = 1;
        if (code != 0 && atomicCAS(&ws->payload_error, 0u, code) == 0u) {
            ws->payload_error_rank = r;
            ws->payload_error_unit = h.unit;
            ws->payload_error_step = h.step;
        }
    }
}

// One span's body as a payload of its rung: the rung's header (made on the host), or a zeroed
// one where the sender's payload was rejected, so the rung's decoder writes NaN there.
__global__ void parts_stage(uint8_t *dst, const uint8_t *body, int64_t bytes, fc_header h, const unsigned int *verdict)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        if (*verdict != 0)
            memset(&h, 0, sizeof(h));
        memcpy(dst, &h, sizeof(h));
    }
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += stride)
        dst[FC_HEADER_BYTES + i] = body[i];
}

// The own chunk kept exact: its NaN/Inf counted in nonfinite_in (own_nonfinite's rule) and,
// with `add`, its values added to acc in their turn of the rank order (fc_cu_own).
__global__ void parts_own(fc_cu_dec d, float *acc, int add)
{
    int64_t start, n;
    fc_cu_span(d.geo, d.geo.rank, &start, &n);
    int64_t bad = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (add)
            acc[i] += fc_cu_own(d, start + i);
        else
            bad += !(fc_abs_bits(fc_cu_load(d.grad, d.gdt, start + i)) < FC_INF_BITS);
    }
    fc_cu_count(&d.ws->nonfinite_in, bad);
}

// out = acc / W under the receiver's output rules (fc_cu_decode_out's: a NaN/Inf passes where a
// flagged or rejected payload or the own element brought one), FSDP's padded tail zeroed.
__global__ void parts_out(fc_cu_dec d, const float *acc, const unsigned int *verdict, const unsigned int *passed)
{
    int64_t start, n;
    fc_cu_span(d.geo, d.geo.rank, &start, &n);
    int pass = *passed != 0;
    for (int r = 0; r < d.geo.world; r++)
        pass |= verdict[r] != 0;
    const int own_pass = fc_cu_own_pass(d);
    const float w = (float)d.geo.world;
    int64_t nonfinite = 0, sat = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < d.out_numel; i += stride) {
        if (fc_cu_out_tail(d.out, d.odt, i, n))
            continue;
        const float own = own_pass ? fc_cu_load(d.grad, d.gdt, start + i) : 0.0f;
        fc_cu_store_out(d.out, d.odt, i, acc[i] / w, fc_output_passes(pass, own_pass, own), &nonfinite, &sat);
    }
    fc_cu_count(&d.ws->nonfinite_out, nonfinite);
    fc_cu_count(&d.ws->saturated, sat);
}

// A sampled call's sums over chunk c (sums[0..3]) from its payload decoded into dec: with error
// feedback ||e||^2, ||x||^2 and x.e of the new residual e, x taken as D + e (the residual is e =
// x - D where finite, and g' itself is gone: its old residual was replaced); without, ||x - D||^2,
// ||x||^2, ||D||^2 and x.D of g' read again from the gradient, as the CPU's sample_error.
__global__ void parts_sample_sums(fc_cuda_geom geo, int c, fc_cu_src src, const float *dec, double *sums)
{
    int64_t start, n;
    fc_cu_span(geo, c, &start, &n);
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const double d = dec[i];
        if (src.res != NULL) {
            const double e = fc_cu_load(src.res, src.rdt, start + i), x = d + e;
            s0 += e * e;
            s1 += x * x;
            s2 += x * e;
        } else {
            const double x = src.x(start + i);
            s0 += (x - d) * (x - d);
            s1 += x * x;
            s2 += d * d;
            s3 += x * d;
        }
    }
    s0 = fc_cu_warp_sum(s0), s1 = fc_cu_warp_sum(s1), s2 = fc_cu_warp_sum(s2), s3 = fc_cu_warp_sum(s3);
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(&sums[0], s0);
        atomicAdd(&sums[1], s1);
        atomicAdd(&sums[2], s2);
        atomicAdd(&sums[3], s3);
    }
}

// The call's sample (the CPU encode's rule: the first sent chunk that passes no NaN/Inf) made one
// of the error statistics, from its sums.
__global__ void parts_sample_finish(fc_cuda_geom geo, const unsigned int *flags, int zero, int ef, const double *sums,
                                    fc_cuda_ws *ws)
{
    int pick = -1;
    for (int c = 0; c < geo.world; c++) {
        int64_t start, n;
        fc_cu_span(geo, c, &start, &n);
        if (fc_cu_sent(geo, c, n) && fc_sample_picks(pick >= 0, fc_chunk_passes(flags[c], zero)))
            pick = c;
    }
    if (pick < 0)
        return;
    const double *s = sums + 4 * pick;
    if (!fc_sample_counts(ef, s[0], s[1]))
        return;
    ws->err_sq += s[0];
    ws->ref_sq += s[1];
    ws->cos_sum += ef ? fc_sample_cos_of_residual(s[0], s[1], s[2]) : fc_sample_cos(s[1], s[2], s[3]);
    ws->samples++;
}

// ---- the call's scratch: the rungs' own (first: 256-aligned as they want it), a span's payload,
// the flags or verdicts, and a decode's fp32 sum of the own chunk

typedef struct {
    int64_t sub, stage, flags, acc, sums, total;
} parts_room;

// The arguments of span p's compress() (into `stage`) from the encode's a.
static fc_cuda_encode_args sub_encode(const fc_cuda_encode_args *a, const fc_cuda_part *p, uint8_t *stage,
                                      void *scratch, int64_t scratch_bytes)
{
    fc_cuda_encode_args s = *a;
    int64_t start, n;
    fc_cu_span(a->h.geo, p->chunk, &start, &n);
    const int64_t at = start + p->lo;
    s.h.m = p->m;
    s.h.varsize = 0;
    s.h.geo = span_geo(a->h.geo.world, a->h.geo.rank, p->n, p->bytes);
    s.h.grad = a->h.grad != NULL ? (const uint8_t *)a->h.grad + at * elem_bytes(a->h.grad_dtype) : NULL;
    s.h.chunk_base = a->h.chunk_base + (uint32_t)p->chunk; // the chunk's streams, as the CPU's
    s.h.seed ^= p->mix;                                    // sub_chunk: key0 ^= mix
    memset(&s.h.x, 0, sizeof(s.h.x));
    s.h.x.scratch = scratch;
    s.h.x.scratch_bytes = scratch_bytes;
    s.residual = a->residual != NULL ? (uint8_t *)a->residual + at * elem_bytes(a->res_dtype) : NULL;
    s.send = stage;
    s.sample = 0;
    return s;
}

// The arguments of span p's decompress() (its payload staged in `stage`, added into out) from the
// decode's a; out is fp32. The rungs' decoders draw no random numbers, so the sender's rank (a
// one-chunk decompress() has rank 0) changes nothing.
static fc_cuda_decode_args sub_decode(const fc_cuda_decode_args *a, const fc_cuda_part *p, const uint8_t *stage,
                                      float *out, float alpha, void *scratch, int64_t scratch_bytes)
{
    fc_cuda_decode_args s = *a;
    s.h.m = p->m;
    s.h.varsize = 0;
    s.h.geo = span_geo(a->h.geo.world, 0, p->n, p->bytes);
    s.h.grad = NULL;
    s.h.chunk_base = a->h.chunk_base + (uint32_t)p->chunk;
    s.h.seed ^= p->mix;
    memset(&s.h.x, 0, sizeof(s.h.x));
    s.h.x.scratch = scratch;
    s.h.x.scratch_bytes = scratch_bytes;
    s.recv = stage;
    s.slot = s.h.geo.pay_full;
    s.h.x.packed_bytes = s.slot;
    s.out = out;
    s.out_dtype = FC_CU_F32;
    s.out_numel = p->n;
    s.alpha = alpha;
    return s;
}

// A sampled encode's decode of its own payloads (into fp32, alpha 1): the encode's head.
static fc_cuda_decode_args decode_of(const fc_cuda_encode_args *a)
{
    fc_cuda_decode_args d;
    memset(&d, 0, sizeof(d));
    d.h = a->h;
    d.out_dtype = FC_CU_F32;
    d.alpha = 1.0f;
    return d;
}

static int room(const fc_cuda_encode_args *enc, const fc_cuda_decode_args *dec, parts_room *r, fc_err *err)
{
    const fc_cuda_head &h = enc != NULL ? enc->h : dec->h;
    int64_t sub = 0, stage = 0, own = 0, most = 0; // own: a decode's chunk; most: the longest chunk
    for (int64_t i = 0; i < h.x.n_parts; i++) {
        const fc_cuda_part *p = &h.x.parts[i];
        const fc_cu_method *m = fc_cu_method_by_id(p->m.id);
        if (m == NULL)
            return fc_fail(err, FC_ERR_TYPE, "internal: a part's method id %d has no CUDA kernels", p->m.id);
        int64_t need = 0, back = 0; // the rung's scratch: to encode, to decode
        if (m->scratch != NULL) {
            int rc = FC_OK;
            if (enc != NULL) {
                const fc_cuda_encode_args s = sub_encode(enc, p, NULL, NULL, 0);
                rc = m->scratch(&s, NULL, &need, err);
            }
            if (rc == FC_OK && (dec != NULL || enc->sample)) { // a sampled encode decodes too
                const fc_cuda_decode_args from = enc != NULL ? decode_of(enc) : *dec;
                const fc_cuda_decode_args s = sub_decode(&from, p, NULL, NULL, 1.0f, NULL, 0);
                rc = m->scratch(NULL, &s, &back, err);
            }
            if (rc != FC_OK)
                return rc;
        }
        need = back > need ? back : need;
        sub = need > sub ? need : sub;
        const int64_t pay = fc_align_up(FC_HEADER_BYTES + p->bytes);
        stage = pay > stage ? pay : stage;
        own += p->n;
    }
    for (int c = 0; c < h.geo.world; c++) {
        int64_t start, n;
        fc_cu_span(h.geo, c, &start, &n);
        most = n > most ? n : most;
    }
    // a sampled encode decodes each sent chunk again into acc, its sums per chunk after it
    const int sample = enc != NULL && enc->sample;
    r->sub = 0;
    r->stage = up256(sub);
    r->flags = r->stage + up256(stage);
    r->acc = r->flags + up256(4 * ((int64_t)h.geo.world + 1));
    r->sums = r->acc + (dec != NULL ? up256(4 * own) : sample ? up256(4 * most) : 0);
    r->total = r->sums + (sample ? up256(32 * (int64_t)h.geo.world + 8) : 0);
    return FC_OK;
}

int fc_cu_parts_scratch(const fc_cuda_encode_args *enc, const fc_cuda_decode_args *dec, int64_t *bytes, fc_err *err)
{
    parts_room r;
    int rc = room(enc, dec, &r, err);
    *bytes = rc == FC_OK ? r.total : 0;
    return rc;
}

static int carve(const fc_cuda_encode_args *enc, const fc_cuda_decode_args *dec, parts_room *r, uint8_t **base,
                 fc_err *err)
{
    const fc_cuda_extra &x = enc != NULL ? enc->h.x : dec->h.x;
    int rc = room(enc, dec, r, err);
    if (rc == FC_OK && (x.scratch == NULL || x.scratch_bytes < r->total))
        rc = fc_fail(err, FC_ERR_STATE, "internal: the parts call needs %lld bytes of CUDA scratch, %lld "
                     "were provided", (long long)r->total, (long long)x.scratch_bytes);
    *base = (uint8_t *)x.scratch;
    return rc;
}

// ---- the entries (fc_cu_driver.cu hands a call with a parts list here)

// A sampled encode's error statistics: which chunk is the sample is known on the device only
// (its NaN/Inf count), so every sent chunk is decoded again (its spans staged and decoded by their
// rungs into acc) and summed, and the last kernel takes the picked chunk's sums.
static int sample(fc_cuda_ctx *ctx, const fc_cuda_encode_args *a, const parts_room *r, uint8_t *base,
                  const unsigned int *flags, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    const fc_cuda_api *api = fc_cuda_get_api(FC_CUDA_ABI);
    const fc_cuda_geom &geo = a->h.geo;
    const fc_cuda_decode_args from = decode_of(a);
    float *dec = (float *)(base + r->acc);
    double *sums = (double *)(base + r->sums);
    const unsigned int *ok = (const unsigned int *)(sums + 4 * geo.world); // a verdict of 0
    fc_cu_src src;
    memset(&src, 0, sizeof(src));
    src.grad = a->h.grad;
    src.res = a->residual; // the new one: with error feedback the sums read e
    src.gdt = a->h.grad_dtype;
    src.rdt = a->res_dtype;
    src.zero_nonfinite = a->h.nonfinite_zero;
    FC_CHECK_CUDA(cudaMemsetAsync(sums, 0, 32 * (size_t)geo.world + 8, s), err, error);
    {
        int64_t off = 0;
        for (int64_t i = 0; i < a->h.x.n_parts;) {
            const int c = a->h.x.parts[i].chunk;
            const uint8_t *pay = a->send + off;
            int64_t start, n, end = 0;
            fc_cu_span(geo, c, &start, &n);
            FC_CHECK_CUDA(cudaMemsetAsync(dec, 0, sizeof(float) * (size_t)n, s), err, error);
            for (; i < a->h.x.n_parts && a->h.x.parts[i].chunk == c; i++) {
                const fc_cuda_part *p = &a->h.x.parts[i];
                const fc_cuda_decode_args sub = sub_decode(&from, p, base + r->stage, dec + p->lo, 1.0f, base + r->sub,
                                                           r->stage - r->sub);
                fc_header h;
                const fc_header_key key = fc_cu_header_key(sub.h, p->m.id);
                fc_header_make(&h, &key, (uint64_t)p->n, (uint64_t)p->bytes, 0u);
                parts_stage<<<fc_cu_grid(p->bytes, FC_CU_THREADS * 4, 1).x, FC_CU_THREADS, 0, s>>>(
                    base + r->stage, pay + FC_HEADER_BYTES + p->at, p->bytes, h, ok);
                FC_CHECK_LAUNCH(err, error);
                FC_TRY(api->decompress(ctx, &sub, err));
                end = p->at + p->bytes;
            }
            parts_sample_sums<<<fc_cu_grid(n, FC_CU_THREADS * 8, 1), FC_CU_THREADS, 0, s>>>(geo, c, src, dec, sums + 4 * c);
            FC_CHECK_LAUNCH(err, error);
            off += fc_align_up(FC_HEADER_BYTES + end);
        }
    }
    parts_sample_finish<<<1, 1, 0, s>>>(geo, flags, a->h.nonfinite_zero, a->residual != NULL, sums, a->h.ws);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

// The encode of every sent chunk (single: compress()'s one payload, *written its padded size).
int fc_cu_parts_encode(fc_cuda_ctx *ctx, const fc_cuda_encode_args *a, int single, int64_t *written, fc_err *err)
{
    int rc = FC_OK;
    const fc_cuda_api *api = fc_cuda_get_api(FC_CUDA_ABI);
    const fc_cuda_geom &geo = a->h.geo;
    const int W = geo.world;
    const int ef = a->residual != NULL && !single;
    parts_room r;
    uint8_t *base = NULL;
    fc_cu_frame f;
    fc_cu_frame_init(&f, a->h);
    if (written != NULL)
        *written = 0;
    if (geo.numel == 0)
        return FC_OK;
    if (ef && a->h.unit >= FC_CUDA_MAX_UNITS)
        return fc_fail(err, FC_ERR_VALUE, "error feedback on CUDA counts the residual norm of at most %d units "
                       "per State, and this is unit %u: put the parameters in fewer, larger units, or set "
                       "error_feedback to False", FC_CUDA_MAX_UNITS, a->h.unit);
    FC_TRY(fc_cu_frame_enter(&f, err)); // the rungs' scratch sizes are the device's (CUB)
    FC_TRY(carve(a, NULL, &r, &base, err));
    {
        const cudaStream_t s = f.s;
        unsigned int *flags = (unsigned int *)(base + r.flags);
        fc_cu_src src;
        memset(&src, 0, sizeof(src));
        src.grad = a->h.grad;
        src.res = a->residual;
        src.gdt = a->h.grad_dtype;
        src.rdt = a->res_dtype;
        src.zero_nonfinite = a->h.nonfinite_zero;
        src.decay = a->ef_decay;
        FC_CHECK_CUDA(cudaMemsetAsync(flags, 0, sizeof(unsigned int) * (size_t)W, s), err, error);
        // the chunks' header flags (the saturated sums of g + e: the rungs' encodes count them)
        count_nonfinite<<<fc_cu_grid(geo.per, FC_CU_THREADS * 8, W), FC_CU_THREADS, 0, s>>>(
            geo, src, single ? 0 : COUNT_BAD, flags, a->h.ws);
        FC_CHECK_LAUNCH(err, error);
        if (ef)
            FC_CHECK_CUDA(cudaMemsetAsync(&a->h.ws->unit_sq[a->h.unit], 0, sizeof(double), s), err, error);
        const fc_header_key key = fc_cu_header_key(a->h, a->h.m.id);
        int64_t off = 0; // the chunk's payload in send: the sent chunks before it, back to back
        for (int64_t i = 0; i < a->h.x.n_parts;) {
            const int c = a->h.x.parts[i].chunk;
            uint8_t *pay = a->send + off;
            int64_t end = 0; // the body so far
            for (; i < a->h.x.n_parts && a->h.x.parts[i].chunk == c; i++) {
                const fc_cuda_part *p = &a->h.x.parts[i];
                if (p->at > end) // the alignment gap: zeros, as the CPU's
                    FC_CHECK_CUDA(cudaMemsetAsync(pay + FC_HEADER_BYTES + end, 0, (size_t)(p->at - end), s), err, error);
                const fc_cuda_encode_args sub = sub_encode(a, p, base + r.stage, base + r.sub, r.stage - r.sub);
                int64_t w = 0;
                FC_TRY(api->compress(ctx, &sub, &w, err));
                FC_CHECK_CUDA(cudaMemcpyAsync(pay + FC_HEADER_BYTES + p->at, base + r.stage + FC_HEADER_BYTES,
                                              (size_t)p->bytes, cudaMemcpyDeviceToDevice, s), err, error);
                end = p->at + p->bytes;
            }
            int64_t start, n;
            fc_cu_span(geo, c, &start, &n);
            const int64_t size = fc_align_up(FC_HEADER_BYTES + end);
            parts_header<<<1, 32, 0, s>>>(pay, key, n, end, size, flags + c, a->h.nonfinite_zero);
            FC_CHECK_LAUNCH(err, error);
            off += size;
            if (written != NULL)
                *written = size;
        }
        if (a->sample && !single)
            FC_TRY(sample(ctx, a, &r, base, flags, s, err));
        if (ef) {
            parts_unit_sq<<<fc_cu_grid(geo.per, FC_CU_THREADS * 8, W), FC_CU_THREADS, 0, s>>>(
                geo, a->residual, a->res_dtype, &a->h.ws->unit_sq[a->h.unit]);
            FC_CHECK_LAUNCH(err, error);
        }
    }
    fc_cu_frame_done(ctx, &f);
error:
    return fc_cu_frame_leave(&f, rc);
}

// The decode of the own chunk: the senders' payloads (single: decompress()'s one, added into
// a.out times a.alpha) checked, each span staged as its rung's payload and decoded by the rung in
// its add mode, in rank order with the own chunk kept exact, then / W under the output rules.
int fc_cu_parts_decode(fc_cuda_ctx *ctx, const fc_cuda_decode_args *a, int single, fc_err *err)
{
    int rc = FC_OK;
    const fc_cuda_api *api = fc_cuda_get_api(FC_CUDA_ABI);
    const fc_cuda_geom &geo = a->h.geo;
    const int W = geo.world;
    parts_room r;
    uint8_t *base = NULL;
    fc_cu_frame f;
    fc_cu_frame_init(&f, a->h);
    if (a->out_numel == 0)
        return FC_OK;
    if (single && (a->out_dtype != FC_CU_F32 || geo.rank != 0 || geo.numel != a->out_numel || a->slot < FC_HEADER_BYTES))
        return fc_fail(err, FC_ERR_STATE, "internal: decompress() takes a one-chunk geometry, an fp32 output "
                       "of its length and a slot of at least a header");
    FC_TRY(fc_cu_frame_enter(&f, err));
    FC_TRY(carve(NULL, a, &r, &base, err));
    {
        const cudaStream_t s = f.s;
        const fc_cuda_extra &x = a->h.x;
        int64_t start, n;
        fc_cu_span(geo, geo.rank, &start, &n);
        const int64_t body = x.n_parts > 0 ? x.parts[x.n_parts - 1].at + x.parts[x.n_parts - 1].bytes : 0;
        unsigned int *verdict = (unsigned int *)(base + r.flags), *passed = verdict + W;
        float *acc = single ? (float *)a->out : (float *)(base + r.acc);
        fc_cu_dec d;
        memset(&d, 0, sizeof(d));
        d.geo = geo;
        d.grad = a->h.grad;
        d.gdt = a->h.grad_dtype;
        d.out = a->out;
        d.odt = a->out_dtype;
        d.out_numel = a->out_numel;
        d.ws = a->h.ws;
        d.zero_nonfinite = a->h.nonfinite_zero;
        FC_CHECK_CUDA(cudaMemsetAsync(verdict, 0, sizeof(unsigned int) * (size_t)(W + 1), s), err, error);
        if (n > 0 && a->slot > 0) {
            const int threads = W < 256 ? 32 * ((W + 31) / 32) : 256;
            parts_check<<<1, threads, 0, s>>>(geo, a->recv, a->slot, single ? 1 : W, fc_cu_header_key(a->h, a->h.m.id),
                                              n, body, verdict, passed, a->h.ws);
            FC_CHECK_LAUNCH(err, error);
        }
        if (!single && n > 0) {
            FC_CHECK_CUDA(cudaMemsetAsync(acc, 0, sizeof(float) * (size_t)n, s), err, error);
            if (geo.skip_own) { // its NaN/Inf counted, as own_nonfinite does for the other methods
                parts_own<<<fc_cu_grid(n, FC_CU_THREADS * 8, 1), FC_CU_THREADS, 0, s>>>(d, acc, 0);
                FC_CHECK_LAUNCH(err, error);
            }
        }
        for (int src = 0; n > 0 && src < (single ? 1 : W); src++) {
            if (!single && geo.skip_own && src == geo.rank) { // the own chunk in its turn
                parts_own<<<fc_cu_grid(n, FC_CU_THREADS * 8, 1), FC_CU_THREADS, 0, s>>>(d, acc, 1);
                FC_CHECK_LAUNCH(err, error);
                continue;
            }
            const uint8_t *pay = a->recv + fc_cu_recv_off(geo, src, a->slot);
            for (int64_t i = 0; i < x.n_parts; i++) {
                const fc_cuda_part *p = &x.parts[i];
                const fc_cuda_decode_args sub = sub_decode(a, p, base + r.stage, acc + p->lo, single ? a->alpha : 1.0f,
                                                           base + r.sub, r.stage - r.sub);
                fc_header h;
                const fc_header_key key = fc_cu_header_key(sub.h, p->m.id);
                fc_header_make(&h, &key, (uint64_t)p->n, (uint64_t)p->bytes, 0u);
                parts_stage<<<fc_cu_grid(p->bytes, FC_CU_THREADS * 4, 1).x, FC_CU_THREADS, 0, s>>>(
                    base + r.stage, pay + FC_HEADER_BYTES + p->at, p->bytes, h, verdict + src);
                FC_CHECK_LAUNCH(err, error);
                FC_TRY(api->decompress(ctx, &sub, err));
            }
        }
        if (!single) {
            parts_out<<<fc_cu_grid(a->out_numel, FC_CU_THREADS * 4, 1), FC_CU_THREADS, 0, s>>>(d, acc, verdict, passed);
            FC_CHECK_LAUNCH(err, error);
        }
    }
    fc_cu_frame_done(ctx, &f);
error:
    return fc_cu_frame_leave(&f, rc);
}
