/* fc_res8.c: the CPU backend's 8-bit residuals (fc_res8.h has the rule and the layout): the
 * whole-tensor pack and unpack (pack_residual(), a device's workspace), and the in-place access
 * the CPU's codec, second round and error feedback use instead of a unit-sized fp32 copy: values
 * read as code * scale where g' = g + e is formed, and the new e packed block by block as it is
 * written. A block of 64 that straddles two parts of a call (a chunk boundary, a piece boundary:
 * neither is a multiple of 64) is staged in a carry slot until its last value is written: a part
 * must still read the OLD values of its own elements of that block, and the scale is the whole
 * block's. The bytes are the whole-tensor pack's: each block is rounded once, from the same
 * values, with the same draws. */
#include "common/fc_res8.h"

#include <stdlib.h>
#include <string.h>

#include "backend_cpu/fc_cpu.h"
#include "methods/fc_simd.h"

static float *scales_of(uint8_t *p)
{
    return (float *)p; /* the tensor's data: 4-byte aligned by the allocator */
}

static int8_t *codes_of(uint8_t *p, int64_t n)
{
    return (int8_t *)(p + 4 * fc_res8_blocks(n));
}

/* Block b (values v, all of the block's) packed: its scale from their amax, its codes drawn. */
static inline void pack_block(uint8_t *p, int64_t n, int64_t b, const float *v, uint32_t key)
{
    int8_t *codes = codes_of(p, n);
    const int64_t lo = b * FC_RES8_BLOCK;
    const int64_t len = n - lo < FC_RES8_BLOCK ? n - lo : FC_RES8_BLOCK;
    /* amax over 8 lanes: one running max was a latency-bound chain (most of the pack's time);
     * the largest non-NaN |v| is the same in any order, so the scale's bits are too */
    float lane[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= len; i += 8)
        for (int j = 0; j < 8; j++) {
            const float a = fabsf(v[i + j]);
            lane[j] = a > lane[j] ? a : lane[j];
        }
    for (; i < len; i++) {
        const float a = fabsf(v[i]);
        lane[0] = a > lane[0] ? a : lane[0];
    }
    float amax = lane[0];
    for (int j = 1; j < 8; j++)
        amax = lane[j] > amax ? lane[j] : amax;
    const float scale = fc_res8_scale(amax);
    scales_of(p)[b] = scale;
    /* a block never straddles 2^32 (64 divides it): one high-word hash per block */
    const uint32_t high = fc_res8_u_high(key, lo);
    for (i = 0; i < len; i++)
        codes[lo + i] = fc_res8_code(v[i], scale, fc_res8_u_low(high, lo + i));
}

/* An AVX2 clone where the CPU has it: floorf is one vroundss there, a libm call in baseline
 * x86-64. GCC does not vectorise the loop under -ftrapping-math (about 5 ns per element here). */
FC_CLONES static void pack_host(const float *e, int64_t n, uint8_t *dst, uint32_t key)
{
    for (int64_t b = 0; b * FC_RES8_BLOCK < n; b++)
        pack_block(dst, n, b, e + b * FC_RES8_BLOCK, key);
}

/* Values [start, start + len) of a packed residual of n values into e, a block's scale at a
 * time. */
static void unpack_range(const uint8_t *src, int64_t n, int64_t start, int64_t len, float *e)
{
    const float *scales = (const float *)src;
    const int8_t *codes = (const int8_t *)(src + 4 * fc_res8_blocks(n));
    for (int64_t k = start; k < start + len;) {
        const int64_t b = k / FC_RES8_BLOCK, hi = (b + 1) * FC_RES8_BLOCK;
        const int64_t end = hi < start + len ? hi : start + len;
        const float scale = scales[b];
        for (; k < end; k++)
            e[k - start] = fc_res8_value(codes[k], scale);
    }
}

int fc_cpu_res8_pack(fc_core *s, const fc_exec *x, const fc_buf *e, fc_buf *packed, uint32_t key,
                     fc_err *err)
{
    (void)s;
    (void)x;
    (void)err;
    pack_host((const float *)e->data, e->numel, (uint8_t *)packed->data, key);
    return FC_OK;
}

int fc_cpu_res8_unpack(fc_core *s, const fc_exec *x, const fc_buf *packed, fc_buf *e, fc_err *err)
{
    (void)s;
    (void)x;
    (void)err;
    unpack_range((const uint8_t *)packed->data, e->numel, 0, e->numel, (float *)e->data);
    return FC_OK;
}

/* ---------------------------------------------------------------- in place */

void fc_cpu_res8_values(const fc_buf *r, int64_t start, int64_t len, float *v)
{
    unpack_range((const uint8_t *)r->data, fc_res8_numel(r->numel), start, len, v);
}

float fc_cpu_res8_at(const fc_buf *r, int64_t i)
{
    float v;
    fc_cpu_res8_values(r, i, 1, &v);
    return v;
}

/* x[i] = g[i] + d * e[start + i] (g: fp32, start's chunk), counting the non-finite results:
 * load_sum_f32's float operations on the values an unpack would make, in one pass. */
FC_CLONES int64_t fc_cpu_res8_load_sum(const float *g, const fc_buf *r, int64_t start, int64_t len,
                                       float d, float *x)
{
    const int64_t n = fc_res8_numel(r->numel);
    const float *scales = (const float *)r->data;
    const int8_t *codes = codes_of((uint8_t *)r->data, n);
    int64_t bad = 0;
    for (int64_t k = start; k < start + len;) {
        const int64_t b = k / FC_RES8_BLOCK, hi = (b + 1) * FC_RES8_BLOCK;
        const int64_t end = hi < start + len ? hi : start + len;
        const float scale = scales[b];
        for (; k < end; k++) {
            const float v = g[k - start] + d * fc_res8_value(codes[k], scale);
            x[k - start] = v;
            bad += !(fc_abs_bits(v) < FC_INF_BITS);
        }
    }
    return bad;
}

/* dst[i] += d * e[start + i]: add_f32's float operations on the values an unpack would make. */
FC_CLONES void fc_cpu_res8_add(const fc_buf *r, int64_t start, int64_t len, float d, float *dst)
{
    const int64_t n = fc_res8_numel(r->numel);
    const float *scales = (const float *)r->data;
    const int8_t *codes = codes_of((uint8_t *)r->data, n);
    for (int64_t k = start; k < start + len;) {
        const int64_t b = k / FC_RES8_BLOCK, hi = (b + 1) * FC_RES8_BLOCK;
        const int64_t end = hi < start + len ? hi : start + len;
        const float scale = scales[b];
        for (; k < end; k++)
            dst[k - start] += d * fc_res8_value(codes[k], scale);
    }
}

/* The carry grown to at least `slots` slots, the staged blocks kept and the new slots free:
 * fc_cpu_res8_open sizes it for a call, stage adds one where the parts came in an order that
 * leaves more cut blocks open at once. Grow-only, so a warm call allocates nothing. */
static int grow_carry(fc_core *s, int64_t slots, fc_err *err)
{
    if (slots <= s->carry_cap)
        return FC_OK;
    const size_t bytes = ((size_t)slots * sizeof(fc_res8_slot) + 63) / 64 * 64;
    fc_res8_slot *q = (fc_res8_slot *)aligned_alloc(64, bytes);
    if (q == NULL)
        return fc_fail(err, FC_ERR_NOMEM, "could not allocate %zu bytes of scratch", bytes);
    if (s->carry_cap > 0)
        memcpy(q, s->carry, (size_t)s->carry_cap * sizeof(fc_res8_slot));
    const int64_t cap = (int64_t)(bytes / sizeof(fc_res8_slot));
    for (int64_t j = s->carry_cap; j < cap; j++)
        q[j].block = -1;
    free(s->carry);
    s->carry = q;
    s->carry_cap = cap;
    return FC_OK;
}

/* `len` new values of block b from its element `off` on: into the block's carry slot (taken at
 * its first values), packed from there once the block has all of them. */
FC_CLONES static int stage(fc_core *s, uint8_t *p, int64_t n, int64_t b, int64_t off, const float *v,
                 int64_t len, fc_err *err)
{
    fc_res8_slot *slot = NULL;
    for (int64_t j = 0; j < s->carry_cap && slot == NULL; j++)
        if (s->carry[j].block == b)
            slot = &s->carry[j];
    if (slot == NULL) {
        int64_t j = 0;
        while (j < s->carry_cap && s->carry[j].block >= 0)
            j++;
        if (j == s->carry_cap) {
            int rc = grow_carry(s, s->carry_cap + 1, err);
            if (rc != FC_OK)
                return rc;
        }
        slot = &s->carry[j];
        slot->block = b;
        slot->have = 0;
    }
    memcpy(slot->v + off, v, (size_t)len * 4);
    slot->have += len;
    const int64_t lo = b * FC_RES8_BLOCK;
    if (slot->have == (n - lo < FC_RES8_BLOCK ? n - lo : FC_RES8_BLOCK)) {
        pack_block(p, n, b, slot->v, s->res8_key);
        slot->block = -1;
    }
    return FC_OK;
}

/* e (the new values of [start, start + len)) into the packed residual: whole blocks packed at
 * once, a block's part staged. Every element is written once per call, after its part read its
 * old value, so a block is packed exactly when all of its new values are there. An AVX2 clone,
 * as pack_host: floorf inlined. */
FC_CLONES int fc_cpu_res8_store(fc_core *s, fc_buf *r, int64_t start, int64_t len, const float *e,
                      fc_err *err)
{
    const int64_t n = fc_res8_numel(r->numel);
    uint8_t *p = (uint8_t *)r->data;
    for (int64_t k = start; k < start + len;) {
        const int64_t b = k / FC_RES8_BLOCK, lo = b * FC_RES8_BLOCK;
        const int64_t hi = n - lo < FC_RES8_BLOCK ? n : lo + FC_RES8_BLOCK;
        const int64_t end = hi < start + len ? hi : start + len;
        if (k == lo && end == hi)
            pack_block(p, n, b, e + (k - start), s->res8_key);
        else {
            int rc = stage(s, p, n, b, k - lo, e + (k - start), end - k, err);
            if (rc != FC_OK)
                return rc;
        }
        k = end;
    }
    return FC_OK;
}

/* [start, start + len) keeps its values (a chunk the call does not encode) but is rounded
 * again with this call's draws, as a whole-tensor unpack and pack would: 32 blocks at a time
 * through the stack (a block's values are all read before it is packed over). */
int fc_cpu_res8_keep(fc_core *s, fc_buf *r, int64_t start, int64_t len, fc_err *err)
{
    enum { SPAN = 32 * FC_RES8_BLOCK };
    const int64_t n = fc_res8_numel(r->numel);
    float v[SPAN];
    for (int64_t k = start; k < start + len;) {
        const int64_t hi = (k / SPAN + 1) * SPAN;
        const int64_t end = hi < start + len ? hi : start + len;
        unpack_range((const uint8_t *)r->data, n, k, end - k, v);
        int rc = fc_cpu_res8_store(s, r, k, end - k, v, err);
        if (rc != FC_OK)
            return rc;
        k = end;
    }
    return FC_OK;
}

/* The carry for a call that stages `slots` blocks at once (stage adds one where the parts'
 * order needs it), grown once (a warm call allocates nothing) and cleared: a dropped call's
 * slots are void. */
int fc_cpu_res8_open(fc_core *s, int64_t slots, fc_err *err)
{
    int rc = grow_carry(s, slots, err);
    if (rc != FC_OK)
        return rc;
    for (int64_t j = 0; j < s->carry_cap; j++)
        s->carry[j].block = -1;
    return FC_OK;
}

/* Every staged block was packed: the call wrote each of its elements once. */
int fc_cpu_res8_close(const fc_core *s, fc_err *err)
{
    for (int64_t j = 0; j < s->carry_cap; j++)
        if (s->carry[j].block >= 0)
            return fc_fail(err, FC_ERR_STATE, "internal: block %lld of an 8-bit residual was "
                           "left unpacked (%lld of its values written)",
                           (long long)s->carry[j].block, (long long)s->carry[j].have);
    return FC_OK;
}
