// fc_cu_driver.cu: the method-agnostic CUDA driver of one unit's compressed reduce-scatter:
// non-finite counts, headers, the method's fused kernels, sampled statistics, header checks on
// the receiving side, and the exported function table. The per-chunk rules (geometry, streams,
// header key, NaN/Inf passing, the error sample) are fc_chunk_rules.h's, which the CPU backend
// calls too; what is per call (whether to sample, error feedback) comes decided in the args.
#include <stddef.h>
#include "common/fc_counters.h"
#include "fc_cu_ctx.cuh"

// What fc_gprime_fix finds in g' of each sent chunk (declared with its comment in fc_cu_ctx.cuh).
__global__ void count_nonfinite(fc_cuda_geom geo, fc_cu_src src, int count, unsigned int *bad_per_chunk,
                                fc_cuda_ws *ws)
{
    const int c = blockIdx.y;
    int64_t start, n;
    fc_cu_span(geo, c, &start, &n);
    if (!fc_cu_sent(geo, c, n))
        return;
    int64_t bad = 0, sat = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int64_t k = start + i;
        (void)src.fix(fc_cu_load(src.grad, src.gdt, k),
                      src.res != NULL ? src.decayed(fc_cu_load(src.res, src.rdt, k)) : 0.0f, &bad, &sat);
    }
    const unsigned long long b = fc_cu_warp_sum((unsigned long long)bad);
    if ((threadIdx.x & 31) == 0 && b)
        atomicAdd(&bad_per_chunk[c], (unsigned int)b);
    if ((count & COUNT_BAD) && (threadIdx.x & 31) == 0 && b)
        atomicAdd(&ws->nonfinite_in, b);
    if (count & COUNT_SAT)
        fc_cu_count(&ws->saturated, sat);
}

// The own chunk kept exact (not sent): its NaN/Inf counted in nonfinite_in as the CPU's decode
// counts them (in "pass" mode they go through the sum at their own elements: fc_output_passes,
// where the decoders store them). A fused decode (fc_cu_method.fused_decode) counts them itself.
__global__ void own_nonfinite(fc_cuda_geom geo, const void *grad, int gdt, fc_cuda_ws *ws)
{
    int64_t start, n;
    fc_cu_span(geo, geo.rank, &start, &n);
    int64_t bad = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        bad += !(fc_abs_bits(fc_cu_load(grad, gdt, start + i)) < FC_INF_BITS);
    const unsigned long long b = fc_cu_warp_sum((unsigned long long)bad);
    if ((threadIdx.x & 31) == 0 && b)
        atomicAdd(&ws->nonfinite_in, b);
}

// Header and zero padding of every sent chunk; the body is the method's. A chunk whose count
// (count_nonfinite, earlier on the stream) found NaN/Inf that pass is flagged, as the CPU's
// encode does; the fields are fc_header_make's, the CPU's one definition.
__global__ void write_headers(fc_cuda_geom geo, uint8_t *send, fc_header_key key, int nonfinite_zero,
                              const fc_cuda_ws *ws)
{
    const int c = blockIdx.x;
    int64_t start, n;
    fc_cu_span(geo, c, &start, &n);
    if (!fc_cu_sent(geo, c, n))
        return;
    uint8_t *p = send + fc_cu_send_off(geo, c);
    const int64_t body = fc_cu_body_bytes(geo, n);
    const int64_t size = n == geo.per ? geo.pay_full : geo.pay_last;
    if (threadIdx.x == 0) {
        fc_header h;
        fc_header_make(&h, &key, (uint64_t)n, (uint64_t)body,
                       fc_chunk_passes(ws->bad[c], nonfinite_zero) ? FC_HDR_NONFINITE : 0u);
        memcpy(p, &h, sizeof(h));
    }
    for (int64_t i = FC_HEADER_BYTES + body + threadIdx.x; i < size; i += blockDim.x)
        p[i] = 0;
}

// The call's sampled chunk (fc_sample_picks, the CPU encode's rule), picked here because it
// needs this call's non-finite counts, which only the device has: deciding it on the host
// would cost a sync. Whether the call samples at all is the host's (a->sample).
__global__ void pick_sample(fc_cuda_geom geo, int zero, fc_cuda_ws *ws)
{
    int pick = -1;
    for (int c = 0; c < geo.world; c++) {
        int64_t start, n;
        fc_cu_span(geo, c, &start, &n);
        if (fc_cu_sent(geo, c, n) && fc_sample_picks(pick >= 0, fc_chunk_passes(ws->bad[c], zero)))
            pick = c;
    }
    ws->sample_chunk = pick;
}

// The sampled call's sums become one sample of the error statistics (fc_sample_counts): none
// without a chunk picked.
__global__ void finish_sample(fc_cuda_ws *ws, int ef)
{
    const double ee = ws->call_sum[0], xx = ws->call_sum[1], xe = ws->call_sum[2];
    ws->call_sum[0] = ws->call_sum[1] = ws->call_sum[2] = 0;
    if (ws->sample_chunk < 0 || !fc_sample_counts(ef, ee, xx))
        return;
    ws->err_sq += ee;
    ws->ref_sq += xx;
    ws->cos_sum += fc_sample_cos_of_residual(ee, xx, xe);
    ws->samples++;
}

// Rejects payloads whose header does not match what this rank expects (fc_header_verdict, the
// CPU decode's rule); a rejected slot is never read and makes its outputs NaN, and the first
// rejection is kept in the workspace for the host to raise when it next reads counters. An
// accepted header flagged NONFINITE lets NaN/Inf through the sum (ws->passed).
// `senders`: the ranks whose slots are checked (the world; 1 for decompress()). A fused decode
// (fc_cu_method.fused_decode) checks its headers in its own kernel (fc_cu_check_payloads).
__global__ void check_headers(fc_cuda_geom geo, const uint8_t *recv, int64_t slot, int senders,
                              fc_header_key key, int varsize, fc_cuda_ws *ws)
{
    int64_t start, n;
    fc_cu_span(geo, geo.rank, &start, &n);
    const uint64_t body_expect = (uint64_t)fc_cu_body_bytes(geo, n);
    for (int r = threadIdx.x; r < senders; r += blockDim.x) {
        if (geo.skip_own && r == geo.rank)
            continue;
        fc_header h;
        memcpy(&h, recv + fc_cu_recv_off(geo, r, slot), sizeof(h));
        const unsigned int code = fc_header_verdict(&h, &key, (uint64_t)n, body_expect, varsize, slot);
        ws->bad[r] = code;
        if (code == 0 && (h.flags & FC_HDR_NONFINITE))
            ws->passed = 1; // the sender's NaN/Inf are on the wire: they go through the sum
        if (code != 0 && atomicCAS(&ws->payload_error, 0u, code) == 0u) {
            ws->payload_error_rank = r;
            ws->payload_error_unit = h.unit;
            ws->payload_error_step = h.step;
        }
    }
}

static int check_call(const fc_cu_method *m, int id, const fc_cuda_geom *geo, fc_err *err)
{
    if (m == NULL)
        return fc_fail(err, FC_ERR_TYPE, "method id %d has no CUDA kernels in this build", id);
    if (geo->world < 1 || geo->world > FC_CUDA_MAX_WORLD)
        return fc_fail(err, FC_ERR_VALUE, "world must be in [1, %d], got %d", FC_CUDA_MAX_WORLD,
                       geo->world);
    return FC_OK;
}

// compress()/decompress() get the device scratch a method carves from its caller, sized by the
// same entry the collective's is (fc_cuda_path.c through scratch_bytes): never run without it.
static int check_scratch(const fc_cu_method *m, const fc_cuda_encode_args *enc,
                         const fc_cuda_decode_args *dec, fc_err *err)
{
    int64_t need = 0;
    const fc_cuda_extra *x = enc != NULL ? &enc->h.x : &dec->h.x;
    int rc = m->scratch != NULL ? m->scratch(enc, dec, &need, err) : FC_OK;
    if (rc == FC_OK && need > 0 && (x->scratch == NULL || x->scratch_bytes < need))
        rc = fc_fail(err, FC_ERR_STATE, "internal: the single-payload call needs %lld bytes of CUDA "
                     "scratch, %lld were provided", (long long)need, (long long)x->scratch_bytes);
    return rc;
}

// What every encode kernel reads, from the call's arguments; the caller sets what differs.
static fc_cu_enc enc_of(const fc_cuda_encode_args *a)
{
    fc_cu_enc e;
    memset(&e, 0, sizeof(e));
    e.geo = a->h.geo;
    e.src.grad = a->h.grad;
    e.src.res = a->residual;
    e.src.gdt = a->h.grad_dtype;
    e.src.rdt = a->res_dtype;
    e.src.decay = a->ef_decay;
    e.res = a->residual;
    e.rdt = a->res_dtype;
    e.send = a->send;
    e.bad = a->h.ws->bad;
    e.ws = a->h.ws;
    e.unit_slot = -1;
    e.rng = fc_cu_call_rng(a->h);
    e.key = fc_cu_header_key(a->h, a->h.m.id);
    e.device = a->h.device;
    return e;
}

static fc_cu_dec dec_of(const fc_cuda_decode_args *a)
{
    fc_cu_dec d;
    memset(&d, 0, sizeof(d));
    d.geo = a->h.geo;
    d.recv = a->recv;
    d.slot = a->slot;
    d.grad = a->h.grad;
    d.gdt = a->h.grad_dtype;
    d.out = a->out;
    d.odt = a->out_dtype;
    d.out_numel = a->out_numel;
    d.bad = a->h.ws->bad;
    d.ws = a->h.ws;
    d.zero_nonfinite = a->h.nonfinite_zero;
    d.key = fc_cu_header_key(a->h, a->h.m.id);
    d.varsize = a->h.varsize;
    return d;
}

// A call on h with method m checked and its frame readied, nothing entered yet.
static int frame_check(const fc_cu_method *m, fc_cu_frame *f, const fc_cuda_head &h, fc_err *err)
{
    fc_cu_frame_init(f, h);
    return check_call(m, h.m.id, &h.geo, err);
}

// Enters h's device, checks a single-payload call's scratch (enc or dec; the collective's are
// NULL), starts the timer of `kind` and clears the verdicts or counts of the call's `nbad`
// payloads (none for a one-pass encode, which leaves its own counts zero, nor for a fused decode,
// whose warps keep their verdicts in registers).
static int frame_start(fc_cuda_ctx *ctx, const fc_cu_method *m, fc_cu_frame *f, const fc_cuda_head &h,
                       int kind, const fc_cuda_encode_args *enc, const fc_cuda_decode_args *dec, int nbad,
                       fc_err *err)
{
    int rc = FC_OK;
    FC_TRY(fc_cu_frame_enter(f, err));
    if (enc != NULL || dec != NULL)
        FC_TRY(check_scratch(m, enc, dec, err));
    f->t = fc_cu_timer_start(ctx, kind, f->s);
    if (nbad > 0)
        FC_CHECK_CUDA(cudaMemsetAsync(h.ws->bad, 0, sizeof(unsigned int) * (size_t)nbad, f->s), err, error);
error:
    return rc;
}

// The encode of a method that is not one pass (fc_cu_method.onepass): the driver's kernels around
// the method's, on a workspace whose bad[] frame_start cleared: the unit's ||e||^2 cleared, the
// count (nonfinite_in and saturated by `count`, COUNT_*), the sample's pick where the call
// samples, the headers before the bodies, the sample's sums after them.
static int encode_apart(const fc_cuda_encode_args *a, const fc_cu_method *m, const fc_cu_enc &e, int count,
                        cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    if (e.unit_slot >= 0)
        FC_CHECK_CUDA(cudaMemsetAsync(&a->h.ws->unit_sq[e.unit_slot], 0, sizeof(double), s), err, error);
    count_nonfinite<<<fc_cu_grid(a->h.geo.per, FC_CU_THREADS * 8, a->h.geo.world), FC_CU_THREADS, 0, s>>>(
        a->h.geo, e.src, count, a->h.ws->bad, a->h.ws);
    FC_CHECK_LAUNCH(err, error);
    if (a->sample) {
        pick_sample<<<1, 1, 0, s>>>(a->h.geo, a->h.nonfinite_zero, a->h.ws);
        FC_CHECK_LAUNCH(err, error);
    }
    write_headers<<<a->h.geo.world, 32, 0, s>>>(a->h.geo, a->send, e.key, a->h.nonfinite_zero, a->h.ws);
    FC_CHECK_LAUNCH(err, error);
    FC_TRY(m->encode(a, &e, s, err));
    if (a->sample) {
        finish_sample<<<1, 1, 0, s>>>(a->h.ws, a->residual != NULL);
        FC_CHECK_LAUNCH(err, error);
    }
error:
    return rc;
}

// A parts method's calls (adaptive: a->h.x.parts, ABI 12) compose its rungs' compress() and
// decompress() span by span (fc_cu_parts.cu).
int fc_cu_parts_encode(fc_cuda_ctx *ctx, const fc_cuda_encode_args *a, int single, int64_t *written, fc_err *err);
int fc_cu_parts_decode(fc_cuda_ctx *ctx, const fc_cuda_decode_args *a, int single, fc_err *err);

static int encode(fc_cuda_ctx *ctx, const fc_cuda_encode_args *a, fc_err *err)
{
    if (a->h.x.parts != NULL)
        return fc_cu_parts_encode(ctx, a, 0, NULL, err);
    const fc_cu_method *m = fc_cu_method_by_id(a->h.m.id);
    fc_cu_frame f;
    int rc = frame_check(m, &f, a->h, err);
    if (rc != FC_OK || a->h.geo.numel == 0)
        return rc;
    // A unit's ||e||^2 (counters' residual_norm) lives in the workspace's fixed table: a unit
    // past it would read 0 there with nothing said, so its error feedback is refused instead.
    if (a->residual != NULL && a->h.unit >= FC_CUDA_MAX_UNITS)
        return fc_fail(err, FC_ERR_VALUE,
                       "error feedback on CUDA counts the residual norm of at most %d units per "
                       "State, and this is unit %u: put the parameters in fewer, larger units, or "
                       "set error_feedback to False",
                       FC_CUDA_MAX_UNITS, a->h.unit);
    const cudaStream_t s = f.s;
    FC_TRY(frame_start(ctx, m, &f, a->h, FC_TIME_COMPRESS, NULL, NULL, m->onepass ? 0 : a->h.geo.world, err));
    {
        fc_cu_enc e = enc_of(a);
        e.unit_slot = a->residual != NULL ? (int)a->h.unit : -1;
        e.sample = a->sample;
        e.src.zero_nonfinite = a->h.nonfinite_zero;
        // one pass: one launch that counts, encodes, writes the headers and finishes the call
        FC_TRY(m->onepass ? m->encode(a, &e, s, err) : encode_apart(a, m, e, COUNT_BAD | COUNT_SAT, s, err));
    }
    fc_cu_frame_done(ctx, &f);
error:
    return fc_cu_frame_leave(&f, rc);
}

static int decode(fc_cuda_ctx *ctx, const fc_cuda_decode_args *a, fc_err *err)
{
    if (a->h.x.parts != NULL)
        return fc_cu_parts_decode(ctx, a, 0, err);
    const fc_cu_method *m = fc_cu_method_by_id(a->h.m.id);
    fc_cu_frame f;
    int rc = frame_check(m, &f, a->h, err);
    if (rc != FC_OK || a->out_numel == 0)
        return rc;
    const cudaStream_t s = f.s;
    // a fused decode: its one kernel checks the headers and counts the own chunk (0 memsets)
    FC_TRY(frame_start(ctx, m, &f, a->h, FC_TIME_DECOMPRESS, NULL, NULL, m->fused_decode ? 0 : a->h.geo.world, err));
    {
        fc_cu_dec d = dec_of(a);
        int64_t start, n;
        fc_cu_span(a->h.geo, a->h.geo.rank, &start, &n);
        if (!m->fused_decode)
            FC_CHECK_CUDA(cudaMemsetAsync(&a->h.ws->passed, 0, sizeof(unsigned int), s), err, error);
        if (!m->fused_decode && n > 0 && a->h.geo.skip_own) {
            own_nonfinite<<<fc_cu_grid(n, FC_CU_THREADS * 8, 1), FC_CU_THREADS, 0, s>>>(
                a->h.geo, a->h.grad, a->h.grad_dtype, a->h.ws);
            FC_CHECK_LAUNCH(err, error);
        }
        if (!m->fused_decode && n > 0 && a->slot > 0) {
            int threads = a->h.geo.world < 256 ? 32 * ((a->h.geo.world + 31) / 32) : 256;
            check_headers<<<1, threads, 0, s>>>(a->h.geo, a->recv, a->slot, a->h.geo.world, fc_cu_header_key(a->h, a->h.m.id),
                                                a->h.varsize, a->h.ws);
            FC_CHECK_LAUNCH(err, error);
        }
        FC_TRY(m->decode(a, &d, s, err));
    }
    fc_cu_frame_done(ctx, &f);
error:
    return fc_cu_frame_leave(&f, rc);
}

// compress(): chunk 0 of a.geo (numel = per = n, skip_own 0: the other chunks are empty) as one
// payload, with the CPU's fc_cpu_compress semantics: without a residual, NaN/Inf of the input
// passed (a NaN as the canonical one, the header flagged) and not counted; with one, the payload
// of g' = x + e under the collective's rules (a.h.nonfinite_zero) and e replaced, only the
// saturated sums counted. No sample; the RNG keyed by a.chunk_base and a.geo.rank.
static int compress(fc_cuda_ctx *ctx, const fc_cuda_encode_args *a, int64_t *written, fc_err *err)
{
    if (a->h.x.parts != NULL)
        return fc_cu_parts_encode(ctx, a, 1, written, err);
    const fc_cu_method *m = fc_cu_method_by_id(a->h.m.id);
    fc_cu_frame f;
    *written = 0;
    int rc = frame_check(m, &f, a->h, err);
    if (rc != FC_OK)
        return rc;
    if (a->h.geo.numel < 1 || a->h.geo.per != a->h.geo.numel || a->h.geo.skip_own || a->sample)
        return fc_fail(err, FC_ERR_STATE, "internal: compress() takes a one-chunk geometry without "
                       "sample");
    if (a->residual != NULL && m->single_without_residual) // m: checked by frame_check
        return fc_fail(err, FC_ERR_TYPE, "method id %d: compress() with a residual has no CUDA kernels "
                       "in this build", a->h.m.id);
    const cudaStream_t s = f.s;
    FC_TRY(frame_start(ctx, m, &f, a->h, FC_TIME_COMPRESS, a, NULL, m->onepass ? 0 : a->h.geo.world, err));
    {
        fc_cu_enc e = enc_of(a);
        e.single = 1;
        e.src.zero_nonfinite = a->h.nonfinite_zero;
        // NaN/Inf of x go on the wire (canonical, flagged in the header) and are not counted;
        // with a residual, "zero" mode sends e in their place
        FC_TRY(m->onepass ? m->encode(a, &e, s, err)
                          : encode_apart(a, m, e, a->residual != NULL ? COUNT_SAT : 0, s, err));
    }
    fc_cu_frame_done(ctx, &f);
    *written = a->h.geo.pay_full;
    if (a->h.varsize) { // how long the body came out is in the header the encode wrote
        fc_header h;
        FC_CHECK_CUDA(cudaMemcpyAsync(&h, a->send, sizeof(h), cudaMemcpyDeviceToHost, s), err, error);
        FC_CHECK_CUDA(cudaStreamSynchronize(s), err, error);
        if (fc_header_body(&h) > (uint64_t)(a->h.geo.pay_full - FC_HEADER_BYTES)) {
            rc = fc_fail(err, FC_ERR_STATE, "internal: the encode wrote a %llu-byte body, its "
                         "layout allows %lld", (unsigned long long)fc_header_body(&h),
                         (long long)(a->h.geo.pay_full - FC_HEADER_BYTES));
            goto error;
        }
        *written = fc_align_up(FC_HEADER_BYTES + (int64_t)fc_header_body(&h));
    }
error:
    return fc_cu_frame_leave(&f, rc);
}

// decompress(): out (fp32) += alpha * D(payload): the header checked as the CPU's decode_one
// checks it (a rejected payload makes out NaN and counters() raise), then the method's decoder
// in its add mode (fc_cu_dec.add) on a one-chunk geometry, with the device scratch and unit
// state the caller gave (fc_cuda_decode_args.x).
static int decompress(fc_cuda_ctx *ctx, const fc_cuda_decode_args *a, fc_err *err)
{
    if (a->h.x.parts != NULL)
        return fc_cu_parts_decode(ctx, a, 1, err);
    const fc_cu_method *m = fc_cu_method_by_id(a->h.m.id);
    fc_cu_frame f;
    int rc = frame_check(m, &f, a->h, err);
    if (rc != FC_OK)
        return rc;
    if (a->out_numel < 1 || a->h.geo.numel != a->out_numel || a->h.geo.per != a->h.geo.numel ||
        a->h.geo.rank != 0 || a->h.geo.skip_own || a->out_dtype != FC_CU_F32 || a->slot < FC_HEADER_BYTES)
        return fc_fail(err, FC_ERR_STATE, "internal: decompress() takes a one-chunk geometry, an "
                       "fp32 output of its length and a slot of at least a header");
    const cudaStream_t s = f.s;
    FC_TRY(frame_start(ctx, m, &f, a->h, FC_TIME_DECOMPRESS, NULL, a, m->fused_decode ? 0 : 1, err));
    {
        fc_cu_dec d = dec_of(a);
        d.add = 1;
        d.alpha = a->alpha;
        // a data-dependent method walks its headers itself (its payload may be `none`'s, as the
        // CPU's payload_method allows), as in the collective's decode; so does a fused decode
        if (!a->h.varsize && !m->fused_decode) {
            check_headers<<<1, 32, 0, s>>>(a->h.geo, a->recv, a->slot, 1, fc_cu_header_key(a->h, a->h.m.id), a->h.varsize, a->h.ws);
            FC_CHECK_LAUNCH(err, error);
        }
        FC_TRY(m->decode(a, &d, s, err));
    }
    fc_cu_frame_done(ctx, &f);
error:
    return fc_cu_frame_leave(&f, rc);
}

static int read_counters(fc_cuda_ctx *ctx, const fc_cuda_ws *dev_ws, fc_cuda_ws *host_ws,
                         double seconds[FC_TIME_KINDS], fc_err *err)
{
    int rc = FC_OK;
    fc_cu_device_guard dg = {0, 0};
    if (host_ws != NULL)
        memset(host_ws, 0, sizeof(*host_ws));
    if (ctx->have_last) {
        FC_TRY(fc_cu_device_enter(&dg, ctx->last_device, err));
        if (dev_ws != NULL && host_ws != NULL) {
            FC_CHECK_CUDA(cudaMemcpyAsync(host_ws, dev_ws, sizeof(*host_ws), cudaMemcpyDeviceToHost,
                                          ctx->last_stream), err, error);
            FC_CHECK_CUDA(cudaStreamSynchronize(ctx->last_stream), err, error);
        }
    }
    fc_cu_timers_harvest(ctx, 1); // comm marks may be all there is (nothing encoded yet)
    for (int k = 0; k < FC_TIME_KINDS; k++) {
        seconds[k] = ctx->seconds[k];
        ctx->seconds[k] = 0;
    }
error:
    fc_cu_device_leave(&dg);
    return rc;
}

static int reset_counters(fc_cuda_ctx *ctx, fc_cuda_ws *dev_ws, fc_err *err)
{
    int rc = FC_OK;
    fc_cu_device_guard dg = {0, 0};
    if (ctx->have_last) {
        FC_TRY(fc_cu_device_enter(&dg, ctx->last_device, err));
        if (dev_ws != NULL)
            FC_CHECK_CUDA(cudaMemsetAsync(dev_ws, 0, offsetof(fc_cuda_ws, call_sum), ctx->last_stream),
                          err, error);
    }
    fc_cu_timers_harvest(ctx, 1); // what ran before the reset is not counted after it
    for (int k = 0; k < FC_TIME_KINDS; k++)
        ctx->seconds[k] = 0;
error:
    fc_cu_device_leave(&dg);
    return rc;
}

// Host only: what fc_cu.cuh's geometry gives for every chunk, for the CPU tests to compare
// with the CPU driver's plan (no CUDA call: runs where there is no GPU).
static void probe_geometry(const fc_cuda_geom *g, int64_t slot, int64_t *rows)
{
    for (int c = 0; c < g->world; c++) {
        int64_t *row = rows + (int64_t)c * FC_GEO_COLS, start, n;
        fc_cu_span(*g, c, &start, &n);
        const int sent = fc_cu_sent(*g, c, n);
        row[FC_GEO_START] = start;
        row[FC_GEO_LEN] = n;
        row[FC_GEO_SENT] = sent;
        row[FC_GEO_SEND_OFF] = sent ? fc_cu_send_off(*g, c) : -1;
        row[FC_GEO_BODY] = sent ? fc_cu_body_bytes(*g, n) : -1;
        row[FC_GEO_RECV_OFF] = g->skip_own && c == g->rank ? -1 : fc_cu_recv_off(*g, c, slot);
    }
}

static int has_method(int id)
{
    // adaptive has no kernels of its own: its calls carry a parts list of methods that do
    return fc_cu_method_by_id(id) != NULL || id == FC_ID_ADAPTIVE;
}

// the sparse, aggregate and stateful methods' entries (fc_cu_sparse_api.cu, fc_cu_fetch.cu)
int fc_cu_scratch_bytes(const fc_cuda_encode_args *enc, const fc_cuda_decode_args *dec, int64_t *bytes,
                        fc_err *err);
int fc_cu_fetch_picks(fc_cuda_ctx *ctx, const fc_cuda_fetch_args *a, fc_err *err);
int fc_cu_fetch_values(fc_cuda_ctx *ctx, const fc_cuda_fetch_args *a, fc_err *err);
int fc_cu_fetch_finish(fc_cuda_ctx *ctx, const fc_cuda_fetch_args *a, fc_err *err);
int fc_cu_copy(fc_cuda_ctx *ctx, int device, void *stream, void *dst, const void *src, int64_t bytes,
               int to_host, fc_err *err);
int fc_cu_res8(fc_cuda_ctx *ctx, int device, void *stream, int pack, float *e, int64_t n,
               uint8_t *packed, uint32_t key, fc_err *err);
int fc_cu_ef(fc_cuda_ctx *ctx, const fc_cuda_ef_args *a, fc_err *err); // fc_cu_ef.cu

#ifndef FC_CUDA_BUILD_INFO
#define FC_CUDA_BUILD_INFO "unknown"
#endif

static const fc_cuda_api api = {
    FC_CUDA_ABI,
    FC_CUDA_BUILD_INFO,
    has_method,
    fc_cu_ctx_new,
    fc_cu_ctx_free,
    encode,
    decode,
    read_counters,
    reset_counters,
    // ABI 2: the driver's additions
    compress,
    decompress,
    fc_cu_comm_mark,
    probe_geometry,
    // ABI 3: the sparse, aggregate and stateful methods
    fc_cu_scratch_bytes,
    fc_cu_fetch_picks,
    fc_cu_fetch_values,
    fc_cu_fetch_finish,
    fc_cu_copy,
    // ABI 7: the 8-bit residual
    fc_cu_res8,
    // ABI 11: error feedback outside a codec
    fc_cu_ef,
};

// The library's only exported symbol.
extern "C" __attribute__((visibility("default"))) const fc_cuda_api *fc_cuda_get_api(int abi)
{
    return abi == FC_CUDA_ABI ? &api : NULL;
}
