// fc_cu_sparse_common.cu: the kernels the sparse methods share: the value codec over the kept
// values of each chunk, the index coding, the two residual passes of a sparse encode, and the
// fp32 accumulator of a sparse decode.
#include "fc_cu_sparse.cuh"

#define SP_THREADS 256

// ---- value codecs

// One job (chunk) per grid row; the warps of a row share its array, unit by unit.
template <class C>
__global__ void __launch_bounds__(FC_CU_CODEC_THREADS) vc_encode_blocks(C codec, const fc_cu_vc_job *jobs)
{
    const fc_cu_vc_job j = jobs[blockIdx.y];
    if (j.k <= 0)
        return; // the whole block
    fc_cu_no_sink sink;
    const fc_cu_f32_values x = {j.vals};
    fc_cu_encode_blocks(codec, x, j.k, j.out, j.rng, sink,
                        (int64_t)blockIdx.x * FC_CU_CODEC_WARPS + (threadIdx.x >> 5),
                        (int64_t)gridDim.x * FC_CU_CODEC_WARPS);
}

// fp32 (the values as they are) and fp16 (pre-divided by W), element by element.
__global__ void vc_encode_elems(int quantize, fc_cu_fp16_code h, const fc_cu_vc_job *jobs)
{
    const fc_cu_vc_job j = jobs[blockIdx.y];
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < j.k; i += stride) {
        if (quantize == FC_VC_NONE)
            ((float *)j.out)[i] = j.vals[i];
        else
            h.put(j.out, i, j.vals[i]);
    }
}

template <class C>
static int vc_launch_blocks(const C &codec, const fc_cu_vc_job *jobs, int count, int64_t kmax,
                            cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    const int64_t units = (kmax + fc_cu_unit(codec.bs) - 1) / fc_cu_unit(codec.bs);
    dim3 grid = fc_cu_grid(units, FC_CU_CODEC_WARPS, count);
    grid.x = grid.x > 1024 ? 1024 : grid.x; // the warps stride over the units
    vc_encode_blocks<C><<<grid, FC_CU_CODEC_THREADS, 0, s>>>(codec, jobs);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

int fc_cu_vc_encode(const fc_cu_vc &vc, const fc_cu_vc_job *jobs, int count, int64_t kmax,
                    cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    if (count <= 0 || kmax <= 0)
        return FC_OK;
    switch (vc.shape.quantize) {
    case FC_VC_INT8:
        return vc_launch_blocks(vc.int8(), jobs, count, kmax, s, err);
    case FC_VC_QSGD:
        return vc_launch_blocks(vc.qsgd(), jobs, count, kmax, s, err);
    case FC_VC_NC:
        return vc_launch_blocks(vc.nc(), jobs, count, kmax, s, err);
    case FC_VC_INTN:
        return vc_launch_blocks(vc.intn(), jobs, count, kmax, s, err);
    default: {
        dim3 grid(fc_cu_blocks(kmax, SP_THREADS * 4), (unsigned)count);
        grid.x = grid.x > 1024 ? 1024 : grid.x;
        vc_encode_elems<<<grid, SP_THREADS, 0, s>>>(vc.shape.quantize, vc.fp16, jobs);
        FC_CHECK_LAUNCH(err, error);
    }
    }
error:
    return rc;
}

// ---- index coding: one grid row per chunk. Pass 1 writes 16/32-bit indices and zeroes a
// bitmap (and the padding); pass 2 sets a bitmap's bits (bytes shared by indices: atomics on
// the region's 32-bit words, which lie 4-byte aligned after the 16-byte aligned header).

__global__ void index_write(fc_cu_selection sel, fc_cu_outs outs, int64_t at)
{
    const fc_cu_sel_chunk h = sel.ch[blockIdx.y];
    if (!h.on)
        return;
    uint8_t *region = outs.at((int)blockIdx.y) + FC_HEADER_BYTES + at;
    const int64_t bytes = fc_rule_index_bytes(h.n, h.k);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (fc_rule_use_bitmap(h.n, h.k)) {
        for (int64_t w = t0; w < bytes / 4; w += stride)
            ((uint32_t *)region)[w] = 0;
    } else if (fc_rule_index_width(h.n) == 2) {
        for (int64_t j = t0; j < h.k; j += stride)
            ((uint16_t *)region)[j] = (uint16_t)(sel.idx[h.off + j] - h.start);
        if (t0 == 0 && (h.k & 1))
            ((uint16_t *)region)[h.k] = 0; // padding to 4 bytes
    } else {
        for (int64_t j = t0; j < h.k; j += stride)
            ((uint32_t *)region)[j] = (uint32_t)(sel.idx[h.off + j] - h.start);
    }
}

__global__ void index_bits(fc_cu_selection sel, fc_cu_outs outs, int64_t at)
{
    const fc_cu_sel_chunk h = sel.ch[blockIdx.y];
    if (!h.on || !fc_rule_use_bitmap(h.n, h.k))
        return;
    uint32_t *words = (uint32_t *)(outs.at((int)blockIdx.y) + FC_HEADER_BYTES + at);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < h.k; j += stride) {
        const int64_t l = sel.idx[h.off + j] - h.start;
        atomicOr(&words[l >> 5], 1u << (l & 31));
    }
}

int fc_cu_index_encode(const fc_cu_selection &sel, const fc_cu_outs &outs, int64_t at,
                       cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    const dim3 grid(fc_cu_blocks(sel.sp.per, SP_THREADS * 8), (unsigned)sel.sp.chunks);
    index_write<<<grid, SP_THREADS, 0, s>>>(sel, outs, at);
    FC_CHECK_LAUNCH(err, error);
    index_bits<<<grid, SP_THREADS, 0, s>>>(sel, outs, at);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

// ---- residuals

// Whether global index i is among the kept ones: idx[0, total) ascending (chunk by chunk).
__device__ __forceinline__ int res_kept(const int64_t *idx, int64_t total, int64_t i)
{
    const int64_t lo = fc_cu_lower_bound(idx, total, i);
    return lo < total && idx[lo] == i;
}

// e = x over every sent chunk but the kept coordinates, which res_fix writes (fc_cu_residual
// with no decode: 0 where g' holds a NaN/Inf that went on the wire), with ||e||^2 and the sampled chunk's statistics of those elements:
// a kept coordinate's x never enters a sum, so huge kept values leave no rounding behind.
__global__ void res_dense(fc_cu_enc e, const int64_t *idx, const int64_t *num, int64_t n_idx)
{
    const int c = blockIdx.y;
    int64_t start, n;
    fc_cu_span(e.geo, c, &start, &n);
    if (!fc_cu_sent(e.geo, c, n))
        return;
    if (e.bad[c] == FC_CU_ELSEWHERE) // another pass owns the chunk, its residual and its sums
        return;
    const int ef = e.res != NULL; // always replaced: the old residual went out inside g'
    const int sample = fc_cu_sampled(e, c);
    if (!ef && !sample)
        return;
    const int64_t total = idx == NULL ? 0 : num != NULL ? *num : n_idx;
    fc_cu_esum sum;
    int64_t sat = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (total > 0 && res_kept(idx, total, start + i))
            continue;
        const float x = e.src.x(start + i);
        int64_t s = 0;
        const float r = fc_cu_residual(x, -0.0f, &s); // x + -0 = x
        if (ef) {
            fc_cu_store_res(e.res, e.rdt, start + i, r, &s);
            sat += s;
        }
        sum.add(x, r);
    }
    sum.flush(e.ws, ef ? e.unit_slot : -1, sample);
    fc_cu_count(&e.ws->saturated, sat);
}

// At the kept coordinates: e = fc_cu_residual(x, dn) and its terms of the sums. dn: what the
// CPU's decode_add adds there with alpha = -1.
__global__ void res_fix(fc_cu_enc e, const int64_t *idx, const float *xv, const float *dn,
                        const int64_t *num, int64_t n)
{
    const int64_t total = num != NULL ? *num : n;
    const double inv = 1.0 / (double)(e.geo.per > 0 ? e.geo.per : 1);
    double ee_unit = 0, ee = 0, xx = 0, xe = 0;
    int64_t sat = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < total; j += stride) {
        const int64_t i = idx[j];
        const int c = fc_cu_chunk_of(i, e.geo.per, inv);
        const int ef = e.res != NULL;
        const int sample = fc_cu_sampled(e, c);
        int64_t s = 0;
        const float x = xv[j];
        const float ej = fc_cu_residual(x, dn[j], &s);
        if (ef) {
            fc_cu_store_res(e.res, e.rdt, i, ej, &s);
            sat += s;
            ee_unit += (double)ej * ej;
        }
        if (sample) {
            ee += (double)ej * ej;
            xx += (double)x * x;
            xe += (double)x * ej;
        }
    }
    ee_unit = fc_cu_warp_sum(ee_unit);
    ee = fc_cu_warp_sum(ee);
    xx = fc_cu_warp_sum(xx);
    xe = fc_cu_warp_sum(xe);
    if ((threadIdx.x & 31) == 0) {
        if (e.unit_slot >= 0 && ee_unit != 0)
            atomicAdd(&e.ws->unit_sq[e.unit_slot], ee_unit);
        if (ee != 0 || xx != 0 || xe != 0) {
            atomicAdd(&e.ws->call_sum[0], ee);
            atomicAdd(&e.ws->call_sum[1], xx);
            atomicAdd(&e.ws->call_sum[2], xe);
        }
    }
    fc_cu_count(&e.ws->saturated, sat);
}

int fc_cu_res_dense(const fc_cu_enc &e, const int64_t *idx, const int64_t *num, int64_t n,
                    cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    if (e.res == NULL && !e.sample)
        return FC_OK;
    res_dense<<<fc_cu_grid(e.geo.per, SP_THREADS * 4, e.geo.world), SP_THREADS, 0, s>>>(e, idx, num, n);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

int fc_cu_res_fix(const fc_cu_enc &e, const int64_t *idx, const float *xv, const float *dn,
                  const int64_t *num, int64_t n, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    if ((e.res == NULL && !e.sample) || n <= 0)
        return FC_OK;
    res_fix<<<fc_cu_blocks(n, SP_THREADS * 4), SP_THREADS, 0, s>>>(e, idx, xv, dn, num, n);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

// ---- the decode's accumulator

__global__ void acc_own(fc_cu_dec d, float *acc, int own, int64_t start, int64_t n)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        acc[i] = own ? acc[i] + fc_cu_own(d, start + i) : 0.0f;
}

__global__ void acc_write(fc_cu_dec d, const float *acc, int64_t start, int64_t n)
{
    const float w = (float)d.geo.world;
    const int passed = fc_cu_sum_passes(d), own_pass = fc_cu_own_pass(d);
    int64_t nonfinite = 0, sat = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < d.out_numel; i += stride) {
        if (i < n) {
            const float v = acc[i] / w; // the own chunk's element read only where v is not finite
            const int p = fc_abs_bits(v) < FC_INF_BITS || fc_output_passes(passed, own_pass, own_pass ? fc_cu_own(d, start + i) : 0.0f);
            fc_cu_store_out(d.out, d.odt, i, v, p, &nonfinite, &sat);
        } else if (d.odt == FC_CU_F32) { // FSDP's padded tail of the output
            ((float *)d.out)[i] = 0.0f;
        } else {
            ((uint16_t *)d.out)[i] = 0;
        }
    }
    fc_cu_count(&d.ws->nonfinite_out, nonfinite);
    fc_cu_count(&d.ws->saturated, sat);
}

// Everywhere: (0 + own) / W, NaN where a payload was rejected (as it poisons the dense
// decodes): randomk's and sketch's output before their picks add the senders' values.
__global__ void own_dense(fc_cu_dec d)
{
    const int poison = fc_cu_any_rejected(d);
    fc_cu_decode_out(d, [&](int64_t, float acc) { return poison ? acc + fc_cu_poison() : acc; });
}

int fc_cu_own_dense(const fc_cu_dec &d, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    if (d.out_numel > 0) {
        own_dense<<<fc_cu_blocks(d.out_numel, SP_THREADS * 4), SP_THREADS, 0, s>>>(d);
        FC_CHECK_LAUNCH(err, error);
    }
error:
    return rc;
}

int fc_cu_acc_own(const fc_cu_dec &d, float *acc, int own, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    int64_t start, n;
    fc_cu_span(d.geo, d.geo.rank, &start, &n);
    if (n > 0) {
        acc_own<<<fc_cu_blocks(n, SP_THREADS * 4), SP_THREADS, 0, s>>>(d, acc, own, start, n);
        FC_CHECK_LAUNCH(err, error);
    }
error:
    return rc;
}

int fc_cu_acc_write(const fc_cu_dec &d, const float *acc, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    int64_t start, n;
    fc_cu_span(d.geo, d.geo.rank, &start, &n);
    if (d.out_numel > 0) {
        acc_write<<<fc_cu_blocks(d.out_numel, SP_THREADS * 4), SP_THREADS, 0, s>>>(d, acc, start, n);
        FC_CHECK_LAUNCH(err, error);
    }
error:
    return rc;
}

// ---- index payloads: the encode after the selection

// x at the kept indices, before the residual changes what x reads.
__global__ void sp_gather(fc_cu_src src, const int64_t *idx, const int64_t *num, float *vals)
{
    const int64_t total = *num, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < total; j += stride)
        vals[j] = src.x(idx[j]);
}

// Where chunk c's values go: after its header, `at` bytes of the body and its index region.
__device__ __forceinline__ uint8_t *sp_values_at(const fc_cu_outs &outs, int c, int64_t at,
                                                 const fc_cu_sel_chunk &h)
{
    return outs.at(c) + FC_HEADER_BYTES + at + fc_rule_index_bytes(h.n, h.k);
}

__global__ void sp_jobs(fc_cu_selection sel, fc_cu_outs outs, int64_t at, float *vals, fc_rng base,
                        int rank, fc_cu_vc_job *jobs)
{
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < sel.sp.chunks; c += gridDim.x * blockDim.x) {
        const fc_cu_sel_chunk h = sel.ch[c];
        fc_cu_vc_job j;
        j.vals = vals + h.off;
        j.k = h.on ? h.k : 0;
        j.out = h.on ? sp_values_at(outs, c, at, h) : NULL;
        j.rng = fc_cu_vc_rng(base, c, rank);
        jobs[c] = j;
    }
}

// thresholdv's sign bits: bit j of the chunk's k set when its value is negative (a NaN by its
// sign bit), the bits past k zero.
__global__ void sp_sign_bits(fc_cu_selection sel, fc_cu_outs outs, int64_t at, const float *vals)
{
    const fc_cu_sel_chunk h = sel.ch[blockIdx.y];
    if (!h.on)
        return;
    uint8_t *bits = sp_values_at(outs, (int)blockIdx.y, at, h);
    const int64_t bytes = (h.k + 7) / 8, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < bytes; b += stride) {
        uint32_t byte = 0;
        for (int j = 0; j < 8 && 8 * b + j < h.k; j++)
            byte |= (fc_f32_bits(vals[h.off + 8 * b + j]) >> 31) << j;
        bits[b] = (uint8_t)byte;
    }
}

// The decode with alpha = -1 at the kept indices, as the CPU's decode_add adds it to x: 0 +
// (-1) * D for codec values (decoded into zeroed values, then added), +-v * -1 for sign bits.
__global__ void sp_corrections(fc_cu_selection sel, fc_cu_outs outs, int64_t at, fc_cu_sp_values va,
                               float *dn)
{
    const int64_t total = *sel.num, stride = (int64_t)gridDim.x * blockDim.x;
    const double inv = 1.0 / (double)(sel.sp.per > 0 ? sel.sp.per : 1);
    const float pos = -1.0f * va.sign_v, neg = -1.0f * -va.sign_v;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < total; j += stride) {
        const int c = fc_cu_chunk_of(sel.idx[j], sel.sp.per, inv);
        const fc_cu_sel_chunk h = sel.ch[c];
        const uint8_t *v = sp_values_at(outs, c, at, h);
        const int64_t jj = j - h.off;
        int bad = 0;
        if (va.sign)
            dn[j] = (v[jj >> 3] >> (jj & 7)) & 1u ? neg : pos;
        else
            dn[j] = 0.0f + va.vc.term(v, h.k, jj, -1.0f, &bad);
    }
}

int fc_cu_sp_encode(const fc_cu_selection &sel, const fc_cu_enc &e, const fc_cu_outs &outs, int64_t at,
                    const fc_cu_sp_values &va, float *vals, float *ev, fc_cu_vc_job *jobs, int64_t kmax,
                    int64_t total, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    const int W = sel.sp.chunks;
    const unsigned gb = fc_cu_blocks(total, SP_THREADS * 4);
    sp_gather<<<gb, SP_THREADS, 0, s>>>(e.src, sel.idx, sel.num, vals);
    FC_CHECK_LAUNCH(err, error);
    FC_TRY(fc_cu_index_encode(sel, outs, at, s, err));
    if (va.sign) {
        const dim3 grid(fc_cu_blocks((kmax + 7) / 8, SP_THREADS), (unsigned)W);
        sp_sign_bits<<<grid, SP_THREADS, 0, s>>>(sel, outs, at, vals);
        FC_CHECK_LAUNCH(err, error);
    } else {
        sp_jobs<<<fc_cu_blocks(W, SP_THREADS), SP_THREADS, 0, s>>>(sel, outs, at, vals, e.rng, e.geo.rank, jobs);
        FC_CHECK_LAUNCH(err, error);
        FC_TRY(fc_cu_vc_encode(va.vc, jobs, W, kmax, s, err));
    }
    if (e.res != NULL || e.sample) {
        sp_corrections<<<gb, SP_THREADS, 0, s>>>(sel, outs, at, va, ev);
        FC_CHECK_LAUNCH(err, error);
        FC_TRY(fc_cu_res_dense(e, sel.idx, sel.num, total, s, err));
        FC_TRY(fc_cu_res_fix(e, sel.idx, vals, ev, sel.num, total, s, err));
    }
error:
    return rc;
}

// ---- index payloads: the decode

int fc_cu_sp_carve(fc_cu_arena &ar, const fc_cuda_geom &g, fc_cu_sp_decoder *dec, int64_t *n, fc_err *err)
{
    int64_t start;
    fc_cu_span(g, g.rank, &start, n);
    fc_cu_sel_space sp = {*n, *n > 0 ? *n : 1, 1, -1};
    dec->acc = ar.take<float>(*n);
    dec->desc = ar.take<fc_cu_sp_desc>(g.world);
    return fc_cu_sel_carve(ar, sp, &dec->sel, err);
}

__device__ __forceinline__ const uint8_t *sp_body(const fc_cu_dec &d, const fc_cu_sp_desc &p)
{
    return d.recv + p.off + FC_HEADER_BYTES;
}

// The bitmap of sender r, if it sends one (and was not rejected), for fc_cu_bitmap_select.
__global__ void sp_bits_prepare(fc_cu_dec d, const fc_cu_sp_desc *desc, int r, fc_cu_sel_chunk *ch, int64_t n)
{
    fc_cu_sel_chunk h;
    memset(&h, 0, sizeof(h));
    h.n = n;
    h.on = d.bad[r] == 0 && desc[r].width == 0;
    h.bits = sp_body(d, desc[r]) + desc[r].at_idx;
    ch[0] = h;
}

__device__ __forceinline__ int64_t sp_index(const fc_cu_dec &d, const fc_cu_sp_desc &p, const int64_t *list, int64_t j)
{
    const uint8_t *b = sp_body(d, p) + p.at_idx;
    return p.width == 0 ? list[j] : p.width == 2 ? (int64_t)((const uint16_t *)b)[j] : (int64_t)((const uint32_t *)b)[j];
}

// What the CPU decoder checks before it adds anything: the bitmap's count, the indices in range
// and ascending, the values' codes (or the sign bits past k).
__global__ void sp_check(fc_cu_dec d, const fc_cu_sp_desc *desc, int r, fc_cu_selection sel, fc_cu_sp_values va,
                         int64_t n, uint32_t unit, uint32_t step)
{
    const fc_cu_sp_desc p = desc[r];
    if (d.bad[r] != 0 || p.width == FC_CU_SP_NONE) // a `none` payload: every value is one
        return;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t0 == 0 && p.width == 0 && *sel.num != p.k)
        fc_cu_reject(d.ws, d.ws->bad, r, FC_PAYLOAD_INDEX, unit, step);
    if (t0 == 0 && va.sign && (p.k & 7) != 0 && (sp_body(d, p)[p.at_vals + (p.k >> 3)] >> (p.k & 7)) != 0)
        fc_cu_reject(d.ws, d.ws->bad, r, FC_PAYLOAD_COUNT, unit, step);
    const int64_t listed = p.width == 0 ? (*sel.num < p.k ? *sel.num : p.k) : p.k;
    for (int64_t j = t0; j < listed; j += stride) {
        const int64_t i = sp_index(d, p, sel.idx, j);
        if (i >= n || (j > 0 && i <= sp_index(d, p, sel.idx, j - 1)))
            fc_cu_reject(d.ws, d.ws->bad, r, FC_PAYLOAD_INDEX, unit, step);
        int bad = 0;
        if (!va.sign)
            (void)va.vc.term(sp_body(d, p) + p.at_vals, p.k, j, 1.0f, &bad);
        if (bad)
            fc_cu_reject(d.ws, d.ws->bad, r, FC_PAYLOAD_CODES, unit, step);
    }
}

// acc[idx[j]] += value j: 0 + alpha * D for codec values, alpha * (+-v) for sign bits, alpha *
// value for a `none` payload (as the CPU's decode_add adds them; alpha is 1 in the collective);
// a rejected payload makes every element NaN.
__global__ void sp_scatter(fc_cu_dec d, const fc_cu_sp_desc *desc, int r, fc_cu_selection sel, fc_cu_sp_values va,
                           int64_t n, float alpha, float *acc)
{
    const fc_cu_sp_desc p = desc[r];
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (d.bad[r] != 0) {
        for (int64_t i = t0; i < n; i += stride)
            fc_cu_add_canon(acc + i, fc_cu_poison());
        return;
    }
    const uint8_t *v = sp_body(d, p) + p.at_vals;
    if (p.width == FC_CU_SP_NONE) { // none's decode_add: acc[i] += alpha * value i
        for (int64_t i = t0; i < n; i += stride)
            fc_cu_add_canon(acc + i, alpha * fc_cu_load(v, d.gdt, i));
        return;
    }
    const float pos = alpha * va.sign_v, neg = alpha * -va.sign_v;
    for (int64_t j = t0; j < p.k; j += stride) {
        int bad = 0;
        const int64_t i = sp_index(d, p, sel.idx, j);
        if (va.sign)
            fc_cu_add_canon(acc + i, (v[j >> 3] >> (j & 7)) & 1u ? neg : pos);
        else
            fc_cu_add_canon(acc + i, 0.0f + va.vc.term(v, p.k, j, alpha, &bad));
    }
}

// One sender's payload: its bitmap's bits selected, checked, then added into acc.
static int sp_add_one(const fc_cu_sp_decoder &dec, const fc_cu_dec &d, const fc_cu_sp_values &va, int r,
                      int64_t n, float alpha, float *acc, uint32_t unit, uint32_t step, cudaStream_t s,
                      fc_err *err)
{
    int rc = FC_OK;
    const unsigned blocks = fc_cu_blocks(n, SP_THREADS * 4);
    sp_bits_prepare<<<1, 1, 0, s>>>(d, dec.desc, r, dec.sel.ch, n);
    FC_CHECK_LAUNCH(err, error);
    FC_TRY(fc_cu_select_bits(dec.sel, s, err));
    sp_check<<<blocks, SP_THREADS, 0, s>>>(d, dec.desc, r, dec.sel, va, n, unit, step);
    FC_CHECK_LAUNCH(err, error);
    sp_scatter<<<blocks, SP_THREADS, 0, s>>>(d, dec.desc, r, dec.sel, va, n, alpha, acc);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

int fc_cu_sp_decode(const fc_cu_sp_decoder &dec, const fc_cu_dec &d, const fc_cu_sp_values &va, uint32_t unit,
                    uint32_t step, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    int64_t start, n;
    fc_cu_span(d.geo, d.geo.rank, &start, &n);
    if (d.add) // decompress(): the one payload (rank 0's slot) straight into the fp32 output
        return n > 0 ? sp_add_one(dec, d, va, 0, n, d.alpha, (float *)d.out, unit, step, s, err) : FC_OK;
    if (n > 0) {
        FC_TRY(fc_cu_acc_own(d, dec.acc, 0, s, err));
        for (int r = 0; r < d.geo.world; r++) { // rank order: the sum every rank and the CPU make
            if (d.geo.skip_own && r == d.geo.rank) {
                FC_TRY(fc_cu_acc_own(d, dec.acc, 1, s, err));
                continue;
            }
            FC_TRY(sp_add_one(dec, d, va, r, n, 1.0f, dec.acc, unit, step, s, err));
        }
    }
    FC_TRY(fc_cu_acc_write(d, dec.acc, s, err));
error:
    return rc;
}
