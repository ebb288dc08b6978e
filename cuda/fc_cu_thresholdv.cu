// fc_cu_thresholdv.cu: kernels of `thresholdv` (m_thresholdv.c): every |x| > v of every sent chunk
// (one ordered compaction over the unit), then each chunk's payload sized on the device and the
// payloads packed back to back. The sizes are copied to the host and waited for: the only wait on
// the GPU in a hook call, because the host needs them for the size exchange before the data can
// go (docs/design.md). A payload no smaller than `none`'s goes as `none` (the CPU's per-payload
// fallback, fc_core.c encode_one): its chunk leaves the selection, which runs once more. Receivers
// walk the packed headers on the device, as the CPU decoder walks them, then check and add each
// payload (at its indices, or every value of a `none` one) in rank order.
#include "fc_cu_sparse.cuh"

#define THRV_THREADS 256

struct thrv_cfg {
    float v;
    fc_cu_sp_values va;
};

static int config(const fc_cuda_method_cfg *m, int world, thrv_cfg *c, fc_err *err)
{
    memset(c, 0, sizeof(*c));
    const fc_thresholdv_cfg *k = fc_cu_cfg_of<fc_thresholdv_cfg>(m);
    c->v = (float)k->threshold; // the CPU's (float)cfg->threshold
    c->va.sign = k->values == FC_THRV_SIGN;
    c->va.sign_v = c->v;
    return fc_cu_vc_read(&k->vc, world, &c->va.vc, err);
}

// The body of a chunk of n keeping k (m_thresholdv.c's layout_k).
__host__ __device__ __forceinline__ void thrv_layout(const fc_cu_sp_values &va, int64_t n, int64_t k,
                                                     fc_cuda_sent *l)
{
    if (va.sign) {
        l->value_bytes = (k + 7) / 8;
        l->meta_bytes = 0;
    } else {
        fc_rule_vc_layout(&va.vc.shape, k, &l->value_bytes, &l->meta_bytes);
    }
    l->meta_bytes += 4; // the count
    l->index_bytes = fc_rule_index_bytes(n, k);
    l->kept = k;
    l->size = (FC_HEADER_BYTES + l->value_bytes + l->meta_bytes + l->index_bytes + FC_ALIGN - 1) /
              FC_ALIGN * FC_ALIGN;
}

__host__ __device__ __forceinline__ int64_t thrv_body(const fc_cuda_sent &l)
{
    return l.value_bytes + l.meta_bytes + l.index_bytes;
}

// `none`'s payload of a chunk of n in a dtype of `dsize` bytes (m_none.c's layout).
__host__ __device__ __forceinline__ void thrv_none_layout(int64_t n, int dsize, fc_cuda_sent *l)
{
    memset(l, 0, sizeof(*l));
    l->value_bytes = n * dsize;
    l->kept = n;
    l->size = (FC_HEADER_BYTES + l->value_bytes + FC_ALIGN - 1) / FC_ALIGN * FC_ALIGN;
    l->none = 1;
}

// One thread: each sent chunk's payload from its count, `none` where that is no larger (the
// CPU's rule: padded sizes; a collective's only, `fallback`), packed in chunk order.
__global__ void thrv_plan(fc_cu_selection sel, fc_cu_sp_values va, int dsize, int fallback, fc_cuda_sent *sent,
                          int64_t *offs)
{
    int64_t at = 0;
    for (int c = 0; c < sel.sp.chunks; c++) {
        const fc_cu_sel_chunk h = sel.ch[c];
        fc_cuda_sent l, plain;
        memset(&l, 0, sizeof(l));
        if (h.on) {
            thrv_layout(va, h.n, h.k, &l);
            thrv_none_layout(h.n, dsize, &plain);
            if (fc_chunk_falls_back(fallback, l.size, plain.size))
                l = plain;
        }
        sent[c] = l;
        offs[c] = at;
        at += l.size;
    }
}

// Header (wire version 3, as the driver's write_headers), count and padding of every sent chunk
// at its packed offset (a `none` one: its header and padding; its values come with thrv_none).
__global__ void thrv_headers(fc_cu_selection sel, const fc_cuda_sent *sent, const int64_t *offs, uint8_t *send,
                             fc_header_key key, int nonfinite_zero, const unsigned int *bad)
{
    const int c = blockIdx.x;
    const fc_cu_sel_chunk h = sel.ch[c];
    if (!h.on)
        return;
    uint8_t *p = send + offs[c];
    const int64_t body = thrv_body(sent[c]), size = sent[c].size;
    if (threadIdx.x == 0) {
        fc_header hd;
        if (sent[c].none)
            key.method = FC_ID_NONE;
        fc_header_make(&hd, &key, (uint64_t)h.n, (uint64_t)body,
                       fc_chunk_passes(bad[c], nonfinite_zero) ? FC_HDR_NONFINITE : 0u); // as write_headers
        memcpy(p, &hd, sizeof(hd));
        if (!sent[c].none)
            *(uint32_t *)(p + FC_HEADER_BYTES) = (uint32_t)h.k;
    }
    for (int64_t i = FC_HEADER_BYTES + body + threadIdx.x; i < size; i += blockDim.x)
        p[i] = 0;
}

// A chunk that fell back leaves the selection (fc_cu_reselect_threshold drops its indices), and
// the index payloads' residual passes: `skip` is the encode's chunk flags with it marked
// FC_CU_ELSEWHERE, so fc_cu_res_dense leaves its residual (and g', which thrv_none reads after)
// and its sums to thrv_none.
__global__ void thrv_drop(fc_cu_sel_chunk *ch, const fc_cuda_sent *sent, const unsigned int *bad,
                          unsigned int *skip, int chunks)
{
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        if (sent[c].none)
            ch[c].on = 0;
        skip[c] = sent[c].none ? FC_CU_ELSEWHERE : bad[c];
    }
}

// The `none` payloads' values (g' in the gradient's dtype, m_none.c), and their residual as the
// CPU's update_residual makes it with none's decode: e = x + (-1) * D under fc_cu_residual's
// per-element rule, with ||e||^2 and, sampled, the
// chunk's statistics (fc_cu_res_dense leaves such a chunk alone).
__global__ void thrv_none(fc_cu_enc e, const fc_cuda_sent *sent, const int64_t *offs, int dt)
{
    const int c = blockIdx.y;
    int64_t start, n;
    fc_cu_span(e.geo, c, &start, &n);
    if (!sent[c].none)
        return;
    uint8_t *body = e.send + offs[c] + FC_HEADER_BYTES;
    const int ef = e.res != NULL;
    const int sample = fc_cu_sampled(e, c);
    double dee_unit = 0, dee = 0, dxx = 0, dxe = 0;
    int64_t sat = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float x = e.src.x(start + i);
        if (dt == FC_CU_F32)
            ((float *)body)[i] = x;
        else
            ((uint16_t *)body)[i] = dt == FC_CU_BF16 ? fc_f32_to_bf16(x) : fc_f32_to_f16(x);
        if (ef || sample) {
            int64_t s = 0;
            const float r = fc_cu_residual(x, -1.0f * fc_cu_load(body, dt, i), &s);
            const double xd = x, rd = r;
            if (ef) {
                fc_cu_store_res(e.res, e.rdt, start + i, r, &s);
                sat += s;
                dee_unit += rd * rd;
            }
            if (sample) {
                dee += rd * rd;
                dxx += xd * xd;
                dxe += xd * rd;
            }
        }
    }
    dee_unit = fc_cu_warp_sum(dee_unit);
    dee = fc_cu_warp_sum(dee);
    dxx = fc_cu_warp_sum(dxx);
    dxe = fc_cu_warp_sum(dxe);
    if ((threadIdx.x & 31) == 0) {
        if (ef && e.unit_slot >= 0 && dee_unit != 0)
            atomicAdd(&e.ws->unit_sq[e.unit_slot], dee_unit);
        if (dee != 0 || dxx != 0 || dxe != 0) {
            atomicAdd(&e.ws->call_sum[0], dee);
            atomicAdd(&e.ws->call_sum[1], dxx);
            atomicAdd(&e.ws->call_sum[2], dxe);
        }
    }
    fc_cu_count(&e.ws->saturated, sat);
}

struct thrv_enc_parts {
    fc_cu_selection sel;
    float *vals, *ev;
    fc_cu_vc_job *jobs;
    fc_cuda_sent *sent;
    int64_t *offs;
    unsigned int *skip; // the chunk flags the residual passes see (thrv_drop)
};

static int carve_encode(const fc_cuda_encode_args *a, fc_cu_arena &ar, thrv_cfg *c, thrv_enc_parts *p,
                        fc_err *err)
{
    const int rc = config(&a->h.m, a->h.geo.world, c, err);
    if (rc != FC_OK)
        return rc;
    p->vals = ar.take<float>(a->h.geo.numel);
    p->ev = ar.take<float>(a->h.geo.numel);
    p->jobs = ar.take<fc_cu_vc_job>(a->h.geo.world);
    p->sent = ar.take<fc_cuda_sent>(a->h.geo.world);
    p->offs = ar.take<int64_t>(a->h.geo.world);
    p->skip = ar.take<unsigned int>(a->h.geo.world);
    return fc_cu_sel_carve(ar, fc_cu_sel_space_of(a->h.geo), &p->sel, err);
}

static constexpr fc_cu_carve_fn<fc_cuda_decode_args, thrv_cfg, fc_cu_sp_parts> carve_decode =
    fc_cu_sp_carve_decode<thrv_cfg, config>;

static int encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, const thrv_cfg &c, thrv_enc_parts &p, cudaStream_t s,
                  fc_err *err)
{
    int rc = FC_OK;
    if (a->h.x.sent == NULL && !e->single)
        return fc_fail(err, FC_ERR_STATE, "internal: thresholdv's encode needs the host's size records");
    {
        const fc_cu_outs outs = {a->send, a->h.geo, p.offs};
        const int dsize = a->h.grad_dtype == FC_CU_F32 ? 4 : 2;
        int fell_back = 0;
        FC_TRY(fc_cu_select_threshold(p.sel, e->src, c.v, s, err));
        // compress(): the method as configured whatever its size (fc_drive_compress), and the
        // size read back from the header by the driver afterwards
        thrv_plan<<<1, 1, 0, s>>>(p.sel, c.va, dsize, !e->single, p.sent, p.offs);
        FC_CHECK_LAUNCH(err, error);
        if (!e->single) { // the sizes to the host now, so that it can start the size exchange: the one wait
            FC_CHECK_CUDA(cudaMemcpyAsync(a->h.x.sent, p.sent, sizeof(fc_cuda_sent) * (size_t)a->h.geo.world,
                                          cudaMemcpyDeviceToHost, s), err, error);
            FC_CHECK_CUDA(cudaStreamSynchronize(s), err, error);
        }
        thrv_headers<<<a->h.geo.world, 64, 0, s>>>(p.sel, p.sent, p.offs, a->send,
                                                   fc_cu_header_key(a->h, a->h.m.id), a->h.nonfinite_zero, e->bad);
        FC_CHECK_LAUNCH(err, error);
        for (int ch = 0; ch < a->h.geo.world && !e->single; ch++)
            fell_back |= a->h.x.sent[ch].none != 0;
        fc_cu_enc ie = *e; // the index payloads' encode
        if (fell_back) {
            thrv_drop<<<1, 256, 0, s>>>(p.sel.ch, p.sent, e->bad, p.skip, a->h.geo.world);
            FC_CHECK_LAUNCH(err, error);
            FC_TRY(fc_cu_reselect_threshold(p.sel, e->src, s, err));
            ie.bad = p.skip;
        }
        FC_TRY(fc_cu_sp_encode(p.sel, ie, outs, 4, c.va, p.vals, p.ev, p.jobs, a->h.geo.per, a->h.geo.numel, s, err));
        if (fell_back) { // the fallen-back chunks' values, residuals and sums
            thrv_none<<<fc_cu_grid(a->h.geo.per, THRV_THREADS * 4, a->h.geo.world), THRV_THREADS, 0, s>>>(
                *e, p.sent, p.offs, a->h.grad_dtype);
            FC_CHECK_LAUNCH(err, error);
        }
    }
error:
    return rc;
}

// One thread: the receiver's walk over the packed payloads (fc_core.c's decode loop and
// check_payload, thrv_decode_add's count checks). A payload that fails is rejected, and so are
// those after it, whose places are then unknown. decompress() (d.add): one payload, rank 0's,
// in a buffer of `packed` bytes that may run past it, as the CPU's decode_one allows.
__global__ void thrv_walk(fc_cu_dec d, fc_cu_sp_values va, int64_t packed, fc_header_key key,
                          fc_cu_sp_desc *desc)
{
    const int senders = d.add ? 1 : d.geo.world;
    int64_t start, n;
    fc_cu_span(d.geo, d.geo.rank, &start, &n);
    int64_t at = 0;
    int lost = 0, last = -1;
    fc_cuda_sent bound, plain;
    thrv_layout(va, n, n, &bound);
    thrv_none_layout(n, d.gdt == FC_CU_F32 ? 4 : 2, &plain);
    for (int r = 0; r < senders && n > 0; r++) {
        if (d.geo.skip_own && r == d.geo.rank)
            continue;
        last = r;
        fc_cu_sp_desc p;
        memset(&p, 0, sizeof(p));
        unsigned int code = 0;
        fc_header h;
        memset(&h, 0, sizeof(h));
        uint32_t k = 0;
        fc_cuda_sent l;
        if (lost || packed - at < FC_HEADER_BYTES) {
            code = FC_PAYLOAD_BODY;
        } else {
            memcpy(&h, d.recv + at, sizeof(h));
            // the receiver's rule (fc_header_verdict) against thresholdv's payload, or `none`'s
            // in its place (the CPU's payload_method)
            const int none = h.method == FC_ID_NONE;
            fc_header_key k = key;
            k.method = none ? FC_ID_NONE : key.method;
            code = fc_header_verdict(&h, &k, (uint64_t)n, (uint64_t)thrv_body(none ? plain : bound), !none,
                                     packed - at);
            if (code == 0 && !none && fc_header_body(&h) < 4)
                code = FC_PAYLOAD_BODY;
        }
        if (code == 0 && (h.flags & FC_HDR_NONFINITE))
            d.ws->passed = 1; // the sender's NaN/Inf are on the wire: they go through the sum
        if (code == 0 && h.method != key.method) { // `none` in thresholdv's place
            p.off = at;
            p.k = n;
            p.width = FC_CU_SP_NONE;
            p.at_vals = 0;
            at += plain.size;
            desc[r] = p;
            continue;
        }
        if (code == 0) {
            memcpy(&k, d.recv + at + FC_HEADER_BYTES, 4);
            if ((int64_t)k > n) {
                code = FC_PAYLOAD_COUNT;
            } else {
                thrv_layout(va, n, k, &l);
                if (thrv_body(l) != (int64_t)fc_header_body(&h))
                    code = FC_PAYLOAD_COUNT;
            }
        }
        if (code != 0) {
            fc_cu_reject(d.ws, d.ws->bad, r, code, key.unit, key.step);
            lost = 1;
        } else {
            p.off = at;
            p.k = k;
            p.width = fc_rule_use_bitmap(n, k) ? 0 : fc_rule_index_width(n);
            p.at_idx = 4;
            p.at_vals = 4 + fc_rule_index_bytes(n, k);
            at += l.size;
        }
        desc[r] = p;
    }
    if (!d.add && !lost && last >= 0 && at != packed) // bytes the payloads do not account for
        fc_cu_reject(d.ws, d.ws->bad, last, FC_PAYLOAD_BODY, key.unit, key.step);
}

static int decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, const thrv_cfg &c, fc_cu_sp_parts &p, cudaStream_t s,
                  fc_err *err)
{
    int rc = FC_OK;
    thrv_walk<<<1, 1, 0, s>>>(*d, c.va, a->h.x.packed_bytes, fc_cu_header_key(a->h, a->h.m.id), p.dec.desc);
    FC_CHECK_LAUNCH(err, error);
    FC_TRY(fc_cu_sp_decode(p.dec, *d, c.va, a->h.unit, a->h.step, s, err));
error:
    return rc;
}

extern const fc_cu_method fc_cu_thresholdv =
    fc_cu_carving<thrv_cfg, thrv_enc_parts, carve_encode, encode, fc_cu_sp_parts, carve_decode, decode>::entry(
        FC_ID_THRESHOLDV, 0);
