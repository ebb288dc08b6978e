// fc_cu_thresholdv.cu: kernels of `thresholdv` (m_thresholdv.c): every |x| > v of every sent chunk
// (one ordered compaction over the unit), then each chunk's payload sized on the device and the
// payloads packed back to back. The sizes are copied to the host and waited for: the only wait on
// the GPU in a hook call, because the host needs them for the size exchange before the data can
// go (docs/design.md). Receivers walk the packed headers on the device, as the CPU decoder walks
// them, then check and add each payload at its indices in rank order.
#include "fc_cu_sparse.cuh"

struct thrv_cfg {
    float v;
    fc_cu_sp_values va;
};

static int config(const fc_cuda_method_cfg *m, int world, thrv_cfg *c, fc_err *err)
{
    memset(c, 0, sizeof(*c));
    c->v = (float)fc_cu_cfg(m, "threshold", 1e-3); // the CPU's (float)cfg->threshold
    c->va.vc = fc_cu_vc_from(m, world);
    c->va.sign = fc_cu_cfg(m, "values", 0) == 1;
    c->va.sign_v = c->v;
    return fc_cu_vc_check(c->va.vc, err);
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

// One thread: each sent chunk's payload from its count, packed in chunk order.
__global__ void thrv_plan(fc_cu_selection sel, fc_cu_sp_values va, fc_cuda_sent *sent, int64_t *offs)
{
    int64_t at = 0;
    for (int c = 0; c < sel.sp.chunks; c++) {
        const fc_cu_sel_chunk h = sel.ch[c];
        fc_cuda_sent l;
        memset(&l, 0, sizeof(l));
        if (h.on)
            thrv_layout(va, h.n, h.k, &l);
        sent[c] = l;
        offs[c] = at;
        at += l.size;
    }
}

// Header, count and padding of every sent chunk at its packed offset.
__global__ void thrv_headers(fc_cu_selection sel, const fc_cuda_sent *sent, const int64_t *offs, uint8_t *send,
                             int method, int dtype, uint32_t unit, uint32_t step)
{
    const int c = blockIdx.x;
    const fc_cu_sel_chunk h = sel.ch[c];
    if (!h.on)
        return;
    uint8_t *p = send + offs[c];
    const int64_t body = thrv_body(sent[c]), size = sent[c].size;
    if (threadIdx.x == 0) {
        fc_header hd;
        memset(&hd, 0, sizeof(hd));
        hd.magic = FC_MAGIC;
        hd.version = FC_WIRE_VERSION;
        hd.method = (uint8_t)method;
        hd.dtype = (uint8_t)dtype;
        hd.unit = unit;
        hd.step = step;
        hd.numel = (uint64_t)h.n;
        hd.body_bytes = (uint64_t)body;
        memcpy(p, &hd, sizeof(hd));
        *(uint32_t *)(p + FC_HEADER_BYTES) = (uint32_t)h.k;
    }
    for (int64_t i = FC_HEADER_BYTES + body + threadIdx.x; i < size; i += blockDim.x)
        p[i] = 0;
}

struct thrv_enc_parts {
    fc_cu_selection sel;
    float *vals, *ev;
    fc_cu_vc_job *jobs;
    fc_cuda_sent *sent;
    int64_t *offs;
};

static int carve_encode(const fc_cuda_encode_args *a, fc_cu_arena &ar, thrv_enc_parts *p, fc_err *err)
{
    const fc_cu_sel_space sp = {a->geo.numel, a->geo.per > 0 ? a->geo.per : 1, a->geo.world,
                                a->geo.skip_own ? a->geo.rank : -1};
    p->vals = ar.take<float>(a->geo.numel);
    p->ev = ar.take<float>(a->geo.numel);
    p->jobs = ar.take<fc_cu_vc_job>(a->geo.world);
    p->sent = ar.take<fc_cuda_sent>(a->geo.world);
    p->offs = ar.take<int64_t>(a->geo.world);
    return fc_cu_sel_carve(ar, sp, &p->sel, err);
}

static int encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    thrv_cfg c;
    thrv_enc_parts p;
    fc_cu_arena ar = fc_cu_arena_of(a->x);
    if (a->x.sent == NULL)
        return fc_fail(err, FC_ERR_STATE, "internal: thresholdv's encode needs the host's size records");
    FC_TRY(config(&a->m, a->geo.world, &c, err));
    FC_TRY(carve_encode(a, ar, &p, err));
    FC_TRY(fc_cu_arena_check(ar, err));
    {
        const fc_cu_outs outs = {a->send, a->geo, p.offs};
        FC_TRY(fc_cu_select_threshold(p.sel, e->src, c.v, s, err));
        thrv_plan<<<1, 1, 0, s>>>(p.sel, c.va, p.sent, p.offs);
        FC_CHECK_LAUNCH(err, error);
        // the sizes to the host now, so that it can start the size exchange: the one wait
        FC_CHECK_CUDA(cudaMemcpyAsync(a->x.sent, p.sent, sizeof(fc_cuda_sent) * (size_t)a->geo.world,
                                      cudaMemcpyDeviceToHost, s), err, error);
        FC_CHECK_CUDA(cudaStreamSynchronize(s), err, error);
        thrv_headers<<<a->geo.world, 64, 0, s>>>(p.sel, p.sent, p.offs, a->send, a->m.id, a->grad_dtype, a->unit,
                                                 a->step);
        FC_CHECK_LAUNCH(err, error);
        FC_TRY(fc_cu_sp_encode(p.sel, *e, outs, 4, c.va, p.vals, p.ev, p.jobs, a->geo.per, a->geo.numel, s, err));
    }
error:
    return rc;
}

// One thread: the receiver's walk over the packed payloads (fc_core.c's decode loop and
// check_payload, thrv_decode_add's count checks). A payload that fails is rejected, and so are
// those after it, whose places are then unknown.
__global__ void thrv_walk(fc_cu_dec d, fc_cu_sp_values va, int64_t packed, int method, uint32_t unit,
                          uint32_t step, fc_cu_sp_desc *desc)
{
    int64_t start, n;
    fc_cu_span(d.geo, d.geo.rank, &start, &n);
    int64_t at = 0;
    int lost = 0, last = -1;
    fc_cuda_sent bound;
    thrv_layout(va, n, n, &bound);
    for (int r = 0; r < d.geo.world && n > 0; r++) {
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
            if (h.magic != FC_MAGIC)
                code = FC_PAYLOAD_MAGIC;
            else if (h.version != FC_WIRE_VERSION)
                code = FC_PAYLOAD_VERSION;
            else if (h.method != method)
                code = FC_PAYLOAD_METHOD;
            else if (h.dtype != d.gdt || h.reserved != 0)
                code = FC_PAYLOAD_DTYPE;
            else if (h.unit != unit || h.step != step)
                code = FC_PAYLOAD_ORDER;
            else if (h.numel != (uint64_t)n)
                code = FC_PAYLOAD_NUMEL;
            else if (h.body_bytes > (uint64_t)(packed - at - FC_HEADER_BYTES) ||
                     h.body_bytes > (uint64_t)thrv_body(bound) || h.body_bytes < 4)
                code = FC_PAYLOAD_BODY;
        }
        if (code == 0) {
            memcpy(&k, d.recv + at + FC_HEADER_BYTES, 4);
            if ((int64_t)k > n) {
                code = FC_PAYLOAD_COUNT;
            } else {
                thrv_layout(va, n, k, &l);
                if (thrv_body(l) != (int64_t)h.body_bytes)
                    code = FC_PAYLOAD_COUNT;
            }
        }
        if (code != 0) {
            fc_cu_reject(d.ws, d.ws->bad, r, code, unit, step);
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
    if (!lost && last >= 0 && at != packed) // bytes the payloads do not account for
        fc_cu_reject(d.ws, d.ws->bad, last, FC_PAYLOAD_BODY, unit, step);
}

static int decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    thrv_cfg c;
    fc_cu_sp_decoder dec;
    int64_t start, n;
    fc_cu_arena ar = fc_cu_arena_of(a->x);
    fc_cu_span(a->geo, a->geo.rank, &start, &n);
    FC_TRY(config(&a->m, a->geo.world, &c, err));
    FC_TRY(fc_cu_sp_carve(ar, n, a->geo.world, &dec, err));
    FC_TRY(fc_cu_arena_check(ar, err));
    thrv_walk<<<1, 1, 0, s>>>(*d, c.va, a->x.packed_bytes, a->m.id, a->unit, a->step, dec.desc);
    FC_CHECK_LAUNCH(err, error);
    FC_TRY(fc_cu_sp_decode(dec, *d, c.va, a->unit, a->step, s, err));
error:
    return rc;
}

static int scratch(const fc_cuda_encode_args *enc, const fc_cuda_decode_args *dec, int64_t *bytes, fc_err *err)
{
    int rc = FC_OK;
    fc_cu_arena ar = {NULL, 0, 0};
    if (enc != NULL) {
        thrv_enc_parts p;
        FC_TRY(carve_encode(enc, ar, &p, err));
    } else {
        fc_cu_sp_decoder d;
        int64_t start, n;
        fc_cu_span(dec->geo, dec->geo.rank, &start, &n);
        FC_TRY(fc_cu_sp_carve(ar, n, dec->geo.world, &d, err));
    }
    *bytes = ar.used;
error:
    return rc;
}

extern const fc_cu_method fc_cu_thresholdv = {10, encode, decode, scratch,
                                              FC_CU_NO_SINGLE("thresholdv")};
