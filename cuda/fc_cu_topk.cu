// fc_cu_topk.cu: kernels of `topk` (m_topk.c): the exact k largest magnitudes of every sent chunk
// at once (fc_cu_select.cu: a radix select of the k-th largest, ties to the lowest indices, in two
// reads of g', which also write the indices as the CPU codes them, the kept values and the
// residual of everything not kept), the values through the value codec
// (fc_cu_sparse_common.cu), then the residual at the kept indices; receivers check each payload
// and add it at its indices in rank order, as the CPU decoder does.
#include "fc_cu_sparse.cuh"

struct topk_cfg {
    fc_cu_krule kr;
    fc_cu_sp_values va;
};

static int config(const fc_cuda_method_cfg *m, int world, topk_cfg *c, fc_err *err)
{
    memset(c, 0, sizeof(*c));
    return fc_cu_sparsifier_read(fc_cu_cfg_of<fc_topk_cfg>(m), world, &c->kr, &c->va.vc, err);
}

struct topk_enc_parts {
    fc_cu_selection sel;
    float *vals;
    fc_cu_vc_job *jobs;
    int64_t total;
};

static int carve_encode(const fc_cuda_encode_args *a, fc_cu_arena &ar, topk_cfg *c, topk_enc_parts *p,
                        fc_err *err)
{
    const int rc = config(&a->h.m, a->h.geo.world, c, err);
    if (rc != FC_OK)
        return rc;
    p->total = fc_cu_kept_total(a->h.geo, c->kr);
    p->vals = ar.take<float>(p->total);
    p->jobs = ar.take<fc_cu_vc_job>(a->h.geo.world);
    return fc_cu_sel_carve(ar, fc_cu_sel_space_of(a->h.geo), &p->sel, err);
}

static constexpr fc_cu_carve_fn<fc_cuda_decode_args, topk_cfg, fc_cu_sp_parts> carve_decode =
    fc_cu_sp_carve_decode<topk_cfg, config>;

static int encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, const topk_cfg &c, topk_enc_parts &p, cudaStream_t s,
                  fc_err *err)
{
    int rc = FC_OK;
    {
        fc_cu_sel_emit em;
        memset(&em, 0, sizeof(em));
        em.e = *e;
        em.outs = fc_cu_outs{a->send, a->h.geo, NULL};
        em.at = 0;
        em.vals = p.vals;
        em.jobs = p.jobs;
        em.residual = e->res != NULL || e->sample;
        FC_TRY(fc_cu_select_topk_emit(p.sel, c.kr, em, s, err));
        FC_TRY(fc_cu_vc_encode(c.va.vc, p.jobs, a->h.geo.world, fc_rule_sparse_k(a->h.geo.per, c.kr.k, c.kr.ratio),
                               s, err));
        FC_TRY(fc_cu_sel_topk_residual(p.sel, em, c.va.vc, s, err));
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

static int decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, const topk_cfg &c, fc_cu_sp_parts &p, cudaStream_t s,
                  fc_err *err)
{
    int rc = FC_OK;
    topk_desc<<<1, 256, 0, s>>>(a->h.geo, a->slot, p.n, fc_rule_sparse_k(p.n, c.kr.k, c.kr.ratio), p.dec.desc);
    FC_CHECK_LAUNCH(err, error);
    FC_TRY(fc_cu_sp_decode(p.dec, *d, c.va, a->h.unit, a->h.step, s, err));
error:
    return rc;
}

extern const fc_cu_method fc_cu_topk =
    fc_cu_carving<topk_cfg, topk_enc_parts, carve_encode, encode, fc_cu_sp_parts, carve_decode, decode>::entry(
        FC_ID_TOPK, 0);
