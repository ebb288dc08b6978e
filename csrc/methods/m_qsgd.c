/* m_qsgd.c: `qsgd` (Alistarh et al. 2017): per bucket the L2 norm (fp32), and per element a
 * sign and a level in [0, s] rounded stochastically so E[decode] = x (unbiased). Codes of
 * 1 + ceil(log2(s + 1)) bits, packed 8 per group. Body: nbuckets norms, then the codes. */
#include <math.h>
#include <string.h>
#include "methods/fc_block.h"
#include "methods/fc_method.h"
#include "common/fc_pack.h"
#include "common/fc_qsgd.h"
#include "methods/fc_rng_batch.h"
#include "methods/fc_simd.h"

static const fc_key qsgd_keys[] = {
    FC_INT(fc_qsgd_cfg, levels, 15, 1, 32767, 0, "s, the number of positive levels"),
    FC_INT(fc_qsgd_cfg, bucket_size, 512, 8, 1 << 24, FC_KEY_POW2, "elements per norm; a power of two"),
    FC_KEYS_END,
};

static void qsgd_layout(const fc_chunk *c, fc_layout *out)
{
    const fc_qsgd_cfg *cfg = (const fc_qsgd_cfg *)c->cfg;
    fc_layout_set(out, 4 * fc_nblocks(c->n, cfg->bucket_size), fc_pack_bytes(c->n, fc_qsgd_width(cfg->levels)),
                  c->n);
}

/* The reference's sum of squares, compiled once (not inlined into the AVX2 clone), so that
 * a NaN's bits, which depend on operand order, are the same from both paths. */
static __attribute__((noinline)) double qsgd_sum_sq_ref(const float *x, int64_t lo, int64_t hi)
{
    return fc_sum_sq(x, lo, hi);
}

/* fc_sum_sq's lanes as an inner loop of 8: element i still adds into lane (i - lo) % 8 in
 * increasing i, so the sums are the same. */
static double qsgd_sum_sq(const float *x, int64_t lo, int64_t hi)
{
    double l[FC_LANES] = {0};
    int64_t i = lo;
    for (; i + FC_LANES <= hi; i += FC_LANES)
        for (int j = 0; j < FC_LANES; j++)
            l[j] += (double)x[i + j] * (double)x[i + j];
    for (; i < hi; i++)
        l[(i - lo) & (FC_LANES - 1)] += (double)x[i] * (double)x[i];
    return fc_lanes_total(l);
}

/* Sums of squares of buckets b0 .. b0 + count - 1 (count <= QSGD_SUMS) into out[]. */
typedef void (*qsgd_sums_fn)(const float *x, int64_t n, int64_t bs, int64_t b0, int count,
                             double *out);
#define QSGD_SUMS 4

static void qsgd_sums(const float *x, int64_t n, int64_t bs, int64_t b0, int count, double *out)
{
    for (int k = 0; k < count; k++) {
        const int64_t lo = (b0 + k) * bs;
        out[k] = qsgd_sum_sq(x, lo, FC_BLOCK_END(lo, bs, n));
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define QSGD_AVX2 1

/* The same 8 lanes as two vectors of 4 doubles (GCC leaves the loop above scalar). */
__attribute__((target("avx2"))) static double qsgd_sum_sq_avx2(const float *x, int64_t lo, int64_t hi)
{
    __m256d a0 = _mm256_setzero_pd(), a1 = a0;
    int64_t i = lo;
    for (; i + FC_LANES <= hi; i += FC_LANES) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256d v0 = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        const __m256d v1 = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        a0 = _mm256_add_pd(a0, _mm256_mul_pd(v0, v0));
        a1 = _mm256_add_pd(a1, _mm256_mul_pd(v1, v1));
    }
    double l[FC_LANES];
    _mm256_storeu_pd(l, a0);
    _mm256_storeu_pd(l + 4, a1);
    for (; i < hi; i++)
        l[(i - lo) & (FC_LANES - 1)] += (double)x[i] * (double)x[i];
    return fc_lanes_total(l);
}

/* Four whole buckets at once, each exactly as qsgd_sum_sq_avx2 sums it: a bucket's 8 lanes
 * are 2 chains of dependent adds, so one bucket at a time waits on the add latency; four
 * give the core 8 independent chains. */
__attribute__((target("avx2"))) static void qsgd_sums_avx2(const float *x, int64_t n, int64_t bs,
                                                           int64_t b0, int count, double *out)
{
    if (count == QSGD_SUMS && (b0 + QSGD_SUMS) * bs <= n) {
        __m256d a[QSGD_SUMS][2];
        for (int k = 0; k < QSGD_SUMS; k++)
            a[k][0] = a[k][1] = _mm256_setzero_pd();
        const float *base = x + b0 * bs;
        const char *ahead = (const char *)(base + QSGD_SUMS * bs); /* the next call's buckets */
        for (int64_t i = 0; i < bs; i += FC_LANES) { /* bs: a power of two >= 8 */
            if (i % 16 == 0) /* one 64-byte line of each; a prefetch past the end never faults */
                for (int k = 0; k < QSGD_SUMS; k++)
                    _mm_prefetch(ahead + 4 * (k * bs + i), _MM_HINT_T0);
            for (int k = 0; k < QSGD_SUMS; k++) {
                const __m256 v = _mm256_loadu_ps(base + k * bs + i);
                const __m256d v0 = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
                const __m256d v1 = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
                a[k][0] = _mm256_add_pd(a[k][0], _mm256_mul_pd(v0, v0));
                a[k][1] = _mm256_add_pd(a[k][1], _mm256_mul_pd(v1, v1));
            }
        }
        for (int k = 0; k < QSGD_SUMS; k++) {
            double l[FC_LANES];
            _mm256_storeu_pd(l, a[k][0]);
            _mm256_storeu_pd(l + 4, a[k][1]);
            out[k] = fc_lanes_total(l);
        }
        return;
    }
    for (int k = 0; k < count; k++) {
        const int64_t lo = (b0 + k) * bs;
        out[k] = qsgd_sum_sq_avx2(x, lo, FC_BLOCK_END(lo, bs, n));
    }
}
#endif

/* fc_qsgd_code over a stretch, branch-free so it vectorises */
static inline void qsgd_codes(const float *restrict x, const uint16_t *restrict h, int64_t n,
                              float inv, int32_t s, uint32_t *restrict codes)
{
    for (int64_t j = 0; j < n; j++) {
        const uint32_t u = fc_f32_bits(x[j]);
        const float p = fc_bits_f32(u & 0x7fffffffu) * inv;
        int32_t l = fc_floor_i32(p);
        l += fc_u01_16(h[j]) < p - (float)l;
        l = l > s ? s : l;
        codes[j] = ((uint32_t)l << 1) | (u >> 31);
    }
}

/* Groups of 8 codes (n a multiple of 8) into w bytes each, as fc_pack8 writes them; `w` is a
 * literal at each call, so the shifts specialise. Each group is stored as 8 bytes, the extra
 * ones overwritten by the groups after it, except within 8 bytes of `limit` (the end of the
 * body), which an 8-byte store would pass. */
static inline void qsgd_pack(const uint32_t *codes, int64_t n, int w, uint8_t *out,
                             const uint8_t *limit)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (w <= 8) {
        for (int64_t g = 0; g < n; g += 8) {
            uint64_t v = 0;
            for (int j = 0; j < 8; j++)
                v |= (uint64_t)codes[g + j] << (w * j);
            uint8_t *o = out + (g / 8) * w;
            if (limit - o < 8)
                memcpy(o, &v, (size_t)w);
            else
                memcpy(o, &v, 8);
        }
        return;
    }
#endif
    (void)limit;
    for (int64_t g = 0; g < n; g += 8)
        fc_pack8(codes + g, w, out + (g / 8) * w);
}

typedef void (*qsgd_pack_fn)(const uint32_t *, int64_t, int, uint8_t *, const uint8_t *);

/* qsgd_pack with w a runtime value, for the other widths and for CPUs without AVX2. */
static void qsgd_pack_any(const uint32_t *codes, int64_t n, int w, uint8_t *out,
                          const uint8_t *limit)
{
    switch (w) {
    case 4: qsgd_pack(codes, n, 4, out, limit); break;
    case 5: qsgd_pack(codes, n, 5, out, limit); break;
    case 8: qsgd_pack(codes, n, 8, out, limit); break;
    default: qsgd_pack(codes, n, w, out, limit); break;
    }
}

#ifdef QSGD_AVX2
/* qsgd_pack for w <= 8, 32 codes (4 groups) per step, without a shift per code: the codes
 * narrowed to bytes in order, then each 64-bit lane (one group of 8 bytes) folded three
 * times, neighbours joined at w, 2w, 4w bits: the same 8w bits fc_pack8 writes, with zeros
 * above. The 4 groups are stored as 8 bytes each in increasing order, as qsgd_pack does, so
 * each one's zero bytes are overwritten by the next; the last steps (within reach of
 * `limit`) go to qsgd_pack. */
__attribute__((target("avx2"))) static void qsgd_pack_avx2(const uint32_t *codes, int64_t n,
                                                           int w, uint8_t *out,
                                                           const uint8_t *limit)
{
    if (w > 8) {
        qsgd_pack_any(codes, n, w, out, limit);
        return;
    }
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i m8 = _mm256_set1_epi16(0x00ff);
    const __m256i m16 = _mm256_set1_epi32(0xffff);
    const __m256i m32 = _mm256_set1_epi64x(0xffffffffLL);
    const __m128i s1 = _mm_cvtsi32_si128(w), s2 = _mm_cvtsi32_si128(2 * w);
    const __m128i s4 = _mm_cvtsi32_si128(4 * w);
    int64_t g = 0;
    for (; g + 32 <= n && limit - (out + (g / 8 + 3) * w) >= 8; g += 32) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(codes + g));
        const __m256i b = _mm256_loadu_si256((const __m256i *)(codes + g + 8));
        const __m256i c = _mm256_loadu_si256((const __m256i *)(codes + g + 16));
        const __m256i d = _mm256_loadu_si256((const __m256i *)(codes + g + 24));
        /* codes < 2^8: no saturation; the packs interleave 128-bit halves, `order` undoes it */
        __m256i v = _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d));
        v = _mm256_permutevar8x32_epi32(v, order);
        v = _mm256_or_si256(_mm256_and_si256(v, m8),
                            _mm256_sll_epi16(_mm256_srli_epi16(v, 8), s1));
        v = _mm256_or_si256(_mm256_and_si256(v, m16),
                            _mm256_sll_epi32(_mm256_srli_epi32(v, 16), s2));
        v = _mm256_or_si256(_mm256_and_si256(v, m32),
                            _mm256_sll_epi64(_mm256_srli_epi64(v, 32), s4));
        const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
        uint8_t *o = out + (g / 8) * w;
        const uint64_t q0 = (uint64_t)_mm_cvtsi128_si64(lo), q1 = (uint64_t)_mm_extract_epi64(lo, 1);
        const uint64_t q2 = (uint64_t)_mm_cvtsi128_si64(hi), q3 = (uint64_t)_mm_extract_epi64(hi, 1);
        memcpy(o, &q0, 8);
        memcpy(o + w, &q1, 8);
        memcpy(o + 2 * w, &q2, 8);
        memcpy(o + 3 * w, &q3, 8);
    }
    if (g < n)
        qsgd_pack_any(codes + g, n - g, w, out + (g / 8) * w, limit);
}
#endif

/* The reference's encode with the draws made in bulk, a stretch at a time in L1. */
FC_CLONES static void qsgd_encode_fast(const fc_rng *rng, const float *x, int64_t n, int64_t bs,
                                       int32_t s, int w, qsgd_sums_fn sums, qsgd_pack_fn pack,
                                       uint8_t *body)
{
    const int64_t nb = fc_nblocks(n, bs);
    float *norms = (float *)body;
    uint8_t *packed = body + 4 * nb;
    fc_rng_buf buf = {0, 0, {0}};
    uint32_t codes[FC_RNG_STRETCH];
    double ss_next[QSGD_SUMS];
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, n);
        if (b % QSGD_SUMS == 0)
            sums(x, n, bs, b, nb - b < QSGD_SUMS ? (int)(nb - b) : QSGD_SUMS, ss_next);
        double ss = ss_next[b % QSGD_SUMS];
        if (!isfinite(ss)) /* a NaN's bits depend on operand order: the reference's sum decides */
            ss = qsgd_sum_sq_ref(x, lo, hi);
        const float norm = fc_qsgd_norm(ss);
        const int ok = fc_qsgd_ok(norm);
        norms[b] = norm;
        const float inv = ok ? (float)s / norm : 0.0f;
        int64_t m;
        for (int64_t g = lo; g < hi; g += m) {
            if (ok) {
                const uint16_t *h = fc_rng_at(&buf, rng, g, n, &m);
                m = m < hi - g ? m : hi - g;
                qsgd_codes(x + g, h, m, inv, s, codes);
            } else {
                m = hi - g < FC_RNG_STRETCH ? hi - g : FC_RNG_STRETCH;
                memset(codes, 0, sizeof(codes));
            }
            const int64_t m8 = (m + 7) / 8 * 8; /* only the chunk's last group is short */
            for (int64_t j = m; j < m8; j++)
                codes[j] = 0;
            uint8_t *out = packed + (g / 8) * w;
            const uint8_t *end = packed + fc_pack_bytes(n, w);
            pack(codes, m8, w, out, end);
        }
    }
}

static int qsgd_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    (void)err;
    const fc_qsgd_cfg *cfg = (const fc_qsgd_cfg *)c->cfg;
    const int w = fc_qsgd_width(cfg->levels);
    const int32_t s = (int32_t)cfg->levels;
    const int64_t bs = cfg->bucket_size, nb = fc_nblocks(c->n, bs);
    if (!fc_cpu_reference) {
        qsgd_sums_fn sums = qsgd_sums;
        qsgd_pack_fn pack = qsgd_pack_any;
#ifdef QSGD_AVX2
        if (__builtin_cpu_supports("avx2")) {
            sums = qsgd_sums_avx2;
            pack = qsgd_pack_avx2;
        }
#endif
        qsgd_encode_fast(&c->rng, x, c->n, bs, s, w, sums, pack, body);
        qsgd_layout(c, used);
        return FC_OK;
    }
    float *norms = (float *)body;
    uint8_t *packed = body + 4 * nb;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, c->n);
        const float norm = fc_qsgd_norm(qsgd_sum_sq_ref(x, lo, hi));
        const int ok = fc_qsgd_ok(norm);
        norms[b] = norm;
        const float inv = ok ? (float)s / norm : 0.0f;
        for (int64_t g = lo; g < hi; g += 8) { /* one Philox evaluation per element: the definition */
            uint32_t codes[8];
            for (int64_t j = 0; j < 8; j++)
                codes[j] = ok && g + j < hi ? fc_qsgd_code(x[g + j], inv, s,
                                                           fc_rng_u16(&c->rng, (uint64_t)(g + j))) : 0;
            fc_pack8(codes, w, packed + (g / 8) * w);
        }
    }
    qsgd_layout(c, used);
    return FC_OK;
}

/* One bucket of packed codes; `w` is a literal at the common call sites, so it specialises. */
static inline uint32_t qsgd_bucket(const uint8_t *packed, int w, float step, float alpha,
                                   int64_t lo, int64_t hi, float *acc)
{
    uint32_t worst = 0;
    for (int64_t g = lo; g < hi; g += 8) {
        uint32_t codes[8];
        fc_unpack8(packed + (g / 8) * w, w, codes);
        const int64_t m = hi - g < 8 ? hi - g : 8;
        for (int64_t j = 0; j < m; j++) {
            worst = codes[j] > worst ? codes[j] : worst;
            acc[g + j] += alpha * fc_qsgd_value(codes[j], step);
        }
    }
    return worst;
}

static uint32_t qsgd_decode_ref(const uint8_t *packed, int w, float step, float alpha,
                                int64_t lo, int64_t hi, float *acc)
{
    switch (w) {
    case 3: return qsgd_bucket(packed, 3, step, alpha, lo, hi, acc);
    case 4: return qsgd_bucket(packed, 4, step, alpha, lo, hi, acc);
    case 5: return qsgd_bucket(packed, 5, step, alpha, lo, hi, acc);
    case 8: return qsgd_bucket(packed, 8, step, alpha, lo, hi, acc);
    default: return qsgd_bucket(packed, w, step, alpha, lo, hi, acc);
    }
}

/* Inlined into each FC_CLONES version, so that the loops are compiled for AVX2 too (an
 * outlined copy would be the baseline one). */
#define QSGD_INLINE __attribute__((always_inline)) static inline

/* Whole groups [0, ngroups) of packed codes into codes[], as fc_unpack8 reads them; `w` is a
 * literal at each call. For w <= 8 a group is one 8-byte little-endian load (w bytes used),
 * except within 8 bytes of `end` (the end of the codes), which the load would pass. */
QSGD_INLINE void qsgd_unpack(const uint8_t *in, int64_t ngroups, int w, const uint8_t *end,
                             uint32_t *restrict codes)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (w <= 8) {
        const uint32_t mask = (1u << w) - 1u;
        int64_t wide = end - in < 8 ? 0 : (end - in - 8) / w + 1; /* groups with 8 bytes left */
        wide = wide < ngroups ? wide : ngroups;
        int64_t g = 0;
        for (; g < wide; g++) {
            uint64_t v;
            memcpy(&v, in + g * w, 8);
            for (int j = 0; j < 8; j++)
                codes[g * 8 + j] = (uint32_t)(v >> (w * j)) & mask;
        }
        for (; g < ngroups; g++) {
            uint64_t v = 0;
            memcpy(&v, in + g * w, (size_t)w);
            for (int j = 0; j < 8; j++)
                codes[g * 8 + j] = (uint32_t)(v >> (w * j)) & mask;
        }
        return;
    }
#endif
    (void)end;
    for (int64_t g = 0; g < ngroups; g++)
        fc_unpack8(in + g * w, w, codes + g * 8);
}

/* qsgd_bucket's arithmetic over whole groups, a stretch of codes at a time so the float loop
 * vectorises: the same operations in the same order (the sign flip of fc_qsgd_value is an
 * exact negation, written as the sign bit). Returns the largest code. */
QSGD_INLINE uint32_t qsgd_bucket_fast(const uint8_t *packed, int w, const uint8_t *end,
                                      float step, float alpha, int64_t lo, int64_t hi, float *acc)
{
    uint32_t codes[FC_RNG_STRETCH];
    uint32_t worst = 0;
    for (int64_t k = lo; k < hi; k += FC_RNG_STRETCH) {
        const int64_t m = hi - k < FC_RNG_STRETCH ? hi - k : FC_RNG_STRETCH; /* a multiple of 8 */
        qsgd_unpack(packed + k / 8 * w, m / 8, w, end, codes);
        float *restrict a = acc + k;
        for (int64_t j = 0; j < m; j++) {
            const uint32_t cj = codes[j];
            worst = cj > worst ? cj : worst;
            const float v = fc_bits_f32(fc_f32_bits((float)(cj >> 1) * step) ^ (cj << 31));
            a[j] += alpha * v;
        }
    }
    return worst;
}

FC_CLONES static uint32_t qsgd_decode_fast(const uint8_t *packed, int w, const uint8_t *end,
                                           float step, float alpha, int64_t lo, int64_t hi,
                                           float *acc)
{
    const int64_t whole = lo + (hi - lo) / 8 * 8; /* only the chunk's last group is short */
    uint32_t worst;
    switch (w) {
    case 2: worst = qsgd_bucket_fast(packed, 2, end, step, alpha, lo, whole, acc); break;
    case 3: worst = qsgd_bucket_fast(packed, 3, end, step, alpha, lo, whole, acc); break;
    case 4: worst = qsgd_bucket_fast(packed, 4, end, step, alpha, lo, whole, acc); break;
    case 5: worst = qsgd_bucket_fast(packed, 5, end, step, alpha, lo, whole, acc); break;
    case 6: worst = qsgd_bucket_fast(packed, 6, end, step, alpha, lo, whole, acc); break;
    case 7: worst = qsgd_bucket_fast(packed, 7, end, step, alpha, lo, whole, acc); break;
    case 8: worst = qsgd_bucket_fast(packed, 8, end, step, alpha, lo, whole, acc); break;
    default: worst = qsgd_bucket_fast(packed, w, end, step, alpha, lo, whole, acc); break;
    }
    if (whole < hi) {
        const uint32_t t = qsgd_bucket(packed, w, step, alpha, whole, hi, acc);
        worst = t > worst ? t : worst;
    }
    return worst;
}

#ifdef QSGD_AVX2
/* The whole decode for w <= 8 with AVX2 intrinsics (a target_clones loop could not shuffle
 * bytes): a group's 8 bytes are broadcast to both halves, code j's two bytes moved to lane j by
 * a byte shuffle, shifted into place and masked, 4 instructions per 8 codes against a shift and
 * a mask per code; then qsgd_bucket's arithmetic in its order. Bucket by bucket like the
 * reference: returns the first bucket whose largest code exceeds `top`, accumulated first as
 * there (its largest code in *worst_out), or -1. */
__attribute__((target("avx2"))) static int64_t qsgd_decode_avx2(const float *norms,
    const uint8_t *packed, int64_t n, int64_t bs, int w, int32_t levels, uint32_t top,
    float alpha, float *acc, uint32_t *worst_out)
{
    const uint8_t *end = packed + fc_pack_bytes(n, w);
    int8_t idx[32];
    int32_t sh[8];
    for (int j = 0; j < 8; j++) { /* code j: bits [w*j, w*j + w) of the group, w*j + w <= 64 */
        const int lo_byte = w * j / 8;
        sh[j] = w * j % 8; /* sh + w <= 15: two bytes hold the code */
        for (int k = 0; k < 4; k++)
            idx[(j & 3) * 4 + k + (j >= 4 ? 16 : 0)] =
                (int8_t)(k < 2 && lo_byte + k < 8 ? lo_byte + k : -128); /* -128: a zero byte */
    }
    const __m256i vidx = _mm256_loadu_si256((const __m256i *)idx);
    const __m256i vsh = _mm256_loadu_si256((const __m256i *)sh);
    const __m256i vmask = _mm256_set1_epi32((1 << w) - 1);
    const __m256 va = _mm256_set1_ps(alpha);
    const int64_t nb = fc_nblocks(n, bs);
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, n);
        const int64_t whole = lo + (hi - lo) / 8 * 8; /* only the chunk's last group is short */
        const float step = norms[b] / (float)levels;
        const __m256 vstep = _mm256_set1_ps(step);
        __m256i vworst = _mm256_setzero_si256();
        for (int64_t g = lo; g < whole; g += 8) {
            const uint8_t *p = packed + g / 8 * w;
            __m128i q;
            if (end - p >= 8) {
                q = _mm_loadl_epi64((const __m128i *)p);
            } else { /* the 8-byte load would pass the end of the body */
                uint64_t t = 0;
                memcpy(&t, p, (size_t)w);
                q = _mm_cvtsi64_si128((long long)t);
            }
            const __m256i bytes = _mm256_broadcastq_epi64(q);
            const __m256i c = _mm256_and_si256(
                _mm256_srlv_epi32(_mm256_shuffle_epi8(bytes, vidx), vsh), vmask);
            vworst = _mm256_max_epu32(vworst, c);
            const __m256 mag = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c, 1)), vstep);
            const __m256 v = _mm256_xor_ps(mag, _mm256_castsi256_ps(_mm256_slli_epi32(c, 31)));
            _mm256_storeu_ps(acc + g, _mm256_add_ps(_mm256_loadu_ps(acc + g), _mm256_mul_ps(va, v)));
        }
        uint32_t l[8], worst = 0;
        _mm256_storeu_si256((__m256i *)l, vworst);
        for (int j = 0; j < 8; j++)
            worst = l[j] > worst ? l[j] : worst;
        if (whole < hi) {
            const uint32_t t = qsgd_bucket(packed, w, step, alpha, whole, hi, acc);
            worst = t > worst ? t : worst;
        }
        if (worst > top) {
            *worst_out = worst;
            return b;
        }
    }
    return -1;
}
#endif

static int qsgd_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                           float *acc, fc_err *err)
{
    (void)body_bytes;
    const fc_qsgd_cfg *cfg = (const fc_qsgd_cfg *)c->cfg;
    const int w = fc_qsgd_width(cfg->levels);
    const int64_t bs = cfg->bucket_size, nb = fc_nblocks(c->n, bs);
    const uint32_t top = (uint32_t)cfg->levels << 1 | 1u;
    const float *norms = (const float *)body;
    const uint8_t *packed = body + 4 * nb;
#ifdef QSGD_AVX2
    if (!fc_cpu_reference && w <= 8 && __builtin_cpu_supports("avx2")) {
        uint32_t worst = 0;
        const int64_t b = qsgd_decode_avx2(norms, packed, c->n, bs, w, (int32_t)cfg->levels, top,
                                           alpha, acc, &worst);
        if (b >= 0)
            return fc_fail(err, FC_ERR_PAYLOAD, "qsgd payload: level %u in bucket %lld exceeds "
                           "%lld levels (corrupted)", worst >> 1, (long long)b, (long long)cfg->levels);
        return FC_OK;
    }
#endif
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, c->n);
        const float step = norms[b] / (float)cfg->levels;
        const uint32_t worst = fc_cpu_reference
            ? qsgd_decode_ref(packed, w, step, alpha, lo, hi, acc)
            : qsgd_decode_fast(packed, w, packed + fc_pack_bytes(c->n, w), step, alpha, lo, hi, acc);
        if (worst > top)
            return fc_fail(err, FC_ERR_PAYLOAD, "qsgd payload: level %u in bucket %lld exceeds "
                           "%lld levels (corrupted)", worst >> 1, (long long)b, (long long)cfg->levels);
    }
    return FC_OK;
}

const fc_method fc_method_qsgd = {
    .name = "qsgd",
    .id = FC_ID_QSGD,
    .flags = FC_UNBIASED | FC_RANDOM | FC_PIECEWISE,
    .summary = "QSGD: per-bucket L2 norm, sign + stochastic level per element (unbiased); "
               "1 + ceil(log2(levels + 1)) bits + 32/bucket_size",
    .cfg_size = sizeof(fc_qsgd_cfg),
    .keys = qsgd_keys,
    .layout = qsgd_layout,
    .encode = qsgd_encode,
    .decode_add = qsgd_decode_add,
};
