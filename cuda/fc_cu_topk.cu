// fc_cu_topk.cu: kernels of `topk` (m_topk.c): the exact k largest magnitudes of every sent chunk
// at once (fc_cu_select.cu: a radix select of the k-th largest, ties to the lowest indices, then
// one ordered compaction), the indices as the CPU codes them and the values through the value
// codec (fc_cu_sparse_common.cu); receivers check each payload and add it at its indices in rank
// order, as the CPU decoder does.
#include "fc_cu_sparse.cuh"

struct topk_cfg {
    fc_cu_krule kr;
    fc_cu_sp_values va;
};

static int config(const fc_cuda_method_cfg *m, int world, topk_cfg *c, fc_err *err)
{
    memset(c, 0, sizeof(*c));
    const fc_topk_cfg *k = fc_cu_cfg_of<fc_topk_cfg>(m);
    c->kr.k = k->k;
    c->kr.ratio = k->ratio;
    c->va.vc = fc_cu_vc_from(&k->vc, world);
    return fc_cu_vc_check(c->va.vc, err);
}

// What every sent chunk keeps, in all: the size of the gathered values.
static int64_t kept_total(const fc_cuda_geom &g, const fc_cu_krule &kr)
{
    int64_t total = 0;
    for (int c = 0; c < g.world; c++) {
        int64_t start, n;
        fc_cu_span(g, c, &start, &n);
        total += fc_cu_sent(g, c, n) ? fc_rule_sparse_k(n, kr.k, kr.ratio) : 0;
    }
    return total;
}

struct topk_enc_parts {
    fc_cu_selection sel;
    float *vals, *ev;
    fc_cu_vc_job *jobs;
    int64_t total;
};

static int carve_encode(const fc_cuda_encode_args *a, const topk_cfg &c, fc_cu_arena &ar, topk_enc_parts *p,
                        fc_err *err)
{
    const fc_cu_sel_space sp = {a->h.geo.numel, a->h.geo.per > 0 ? a->h.geo.per : 1, a->h.geo.world,
                                a->h.geo.skip_own ? a->h.geo.rank : -1};
    p->total = kept_total(a->h.geo, c.kr);
    p->vals = ar.take<float>(p->total);
    p->ev = ar.take<float>(p->total);
    p->jobs = ar.take<fc_cu_vc_job>(a->h.geo.world);
    return fc_cu_sel_carve(ar, sp, &p->sel, err);
}

static int encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    topk_cfg c;
    topk_enc_parts p;
    fc_cu_arena ar = fc_cu_arena_of(a->h.x);
    FC_TRY(config(&a->h.m, a->h.geo.world, &c, err));
    FC_TRY(carve_encode(a, c, ar, &p, err));
    FC_TRY(fc_cu_arena_check(ar, err));
    {
        const fc_cu_outs outs = {a->send, a->h.geo, NULL};
        FC_TRY(fc_cu_select_topk(p.sel, e->src, c.kr, s, err));
        FC_TRY(fc_cu_sp_encode(p.sel, *e, outs, 0, c.va, p.vals, p.ev, p.jobs,
                               fc_rule_sparse_k(a->h.geo.per, c.kr.k, c.kr.ratio), p.total, s, err));
    }
error:
    return rc;
}

// Every sender's payload for the own chunk of n: k indices then the values, all alike.
__global__ void topk_desc(fc_cuda_geom g, int64_t slot, int64_t n, int64_t k, fc_cu_sp_desc *desc)
{
    for (int r = threadIdx.x; r < g.world; r += blockDim.x) {
        fc_cu_sp_desc p;
        p.off = fc_cu_recv_off(g, r, slot);
        p.k = k;
        p.width = fc_rule_use_bitmap(n, k) ? 0 : fc_rule_index_width(n);
        p.at_idx = 0;
        p.at_vals = fc_rule_index_bytes(n, k);
        desc[r] = p;
    }
}

static int decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    topk_cfg c;
    fc_cu_sp_decoder dec;
    int64_t n;
    fc_cu_arena ar = fc_cu_arena_of(a->h.x);
    FC_TRY(config(&a->h.m, a->h.geo.world, &c, err));
    FC_TRY(fc_cu_sp_carve(ar, a->h.geo, &dec, &n, err));
    FC_TRY(fc_cu_arena_check(ar, err));
    topk_desc<<<1, 256, 0, s>>>(a->h.geo, a->slot, n, fc_rule_sparse_k(n, c.kr.k, c.kr.ratio), dec.desc);
    FC_CHECK_LAUNCH(err, error);
    FC_TRY(fc_cu_sp_decode(dec, *d, c.va, a->h.unit, a->h.step, s, err));
error:
    return rc;
}

static int scratch(const fc_cuda_encode_args *enc, const fc_cuda_decode_args *dec, int64_t *bytes, fc_err *err)
{
    int rc = FC_OK;
    topk_cfg c;
    fc_cu_arena ar = {NULL, 0, 0};
    if (enc != NULL) {
        topk_enc_parts p;
        FC_TRY(config(&enc->h.m, enc->h.geo.world, &c, err));
        FC_TRY(carve_encode(enc, c, ar, &p, err));
    } else {
        fc_cu_sp_decoder d;
        int64_t n;
        FC_TRY(fc_cu_sp_carve(ar, dec->h.geo, &d, &n, err));
    }
    *bytes = ar.used;
error:
    return rc;
}

extern const fc_cu_method fc_cu_topk = {FC_ID_TOPK, encode, decode, scratch};
