/* fc_chunk_rules.h: the per-chunk rules of a collective call, one definition that the CPU backend
 * (fc_core.c, fc_encode.c) and the CUDA kernels (cuda/) both call, as fc_wire.h's header writer
 * and verdict are: how a unit is cut into chunks, which chunks have a payload, each sender's
 * random stream, the header key, the fall back to `none`, and the error sample's pick and sums.
 * The two paths must agree bit for bit (the receiver may run the other one), so a rule changed
 * here changes both alike. */
#ifndef FC_CHUNK_RULES_H
#define FC_CHUNK_RULES_H

#include <math.h>
#include <stdint.h>
#include "common/fc_counters.h"
#include "common/fc_hostdev.h"
#include "common/fc_rng.h"
#include "common/fc_wire.h"

/* ---- geometry: chunk c of a unit of numel elements is [c * per, ...), clipped to the unit, so
 * every chunk but the last non-empty one is full and an offset needs no table on the device */

/* The chunk length of a unit over `world` ranks. */
FC_HOSTDEV int64_t fc_chunk_per(int64_t numel, int world)
{
    return (numel + world - 1) / world;
}

/* Chunk c's span under chunk length per: [*start, *start + *len), empty past the unit's end. */
FC_HOSTDEV void fc_chunk_span_per(int64_t numel, int64_t per, int c, int64_t *start, int64_t *len)
{
    int64_t a = per * (int64_t)c, b = a + per;
    a = a > numel ? numel : a;
    b = b > numel ? numel : b;
    *start = a;
    *len = b - a;
}

/* The chunks that hold elements (ceil(numel / per) can be fewer than the world: 5 over 4). */
FC_HOSTDEV int64_t fc_chunk_nonempty(int64_t numel, int64_t per)
{
    return per > 0 ? (numel + per - 1) / per : 0;
}

/* The length of the last non-empty chunk, the only one that may be shorter than per. */
FC_HOSTDEV int64_t fc_chunk_last(int64_t numel, int64_t per)
{
    return per > 0 ? numel - (numel - 1) / per * per : 0;
}

/* Whether chunk c, of len elements, has a payload: not empty, and not the own chunk kept exact
 * (skip_own: compress_own_chunk off). */
FC_HOSTDEV int fc_chunk_sent(int64_t len, int c, int rank, int skip_own)
{
    return len > 0 && !(skip_own && c == rank);
}

/* ---- random streams */

/* The stream every rank draws alike for chunk id `chunk` (randomk's and sketch's shared picks):
 * keyed by the seed, counted by (chunk, unit, step). */
FC_HOSTDEV fc_rng fc_chunk_shared_rng(uint64_t seed, uint32_t chunk, uint32_t unit, uint32_t step)
{
    fc_rng r;
    r.key0 = (uint32_t)seed;
    r.key1 = (uint32_t)(seed >> 32);
    r.chunk = chunk;
    r.unit = unit;
    r.step = step;
    return r;
}

/* The sender's own stream from the shared one: stochastic rounding on different ranks must not
 * be correlated, so rank r's key differs (0x85EBCA6B: murmur3's odd mixing constant). */
FC_HOSTDEV fc_rng fc_chunk_sender_rng(fc_rng shared, int rank)
{
    shared.key1 ^= 0x85EBCA6Bu * (uint32_t)(rank + 1);
    return shared;
}

/* ---- the header */

/* The fields a call's headers carry and a receiver checks (fc_header_make, fc_header_verdict):
 * the method id the payload was written with, the gradient's dtype, W, the unit, the step and
 * the config's fingerprint. */
FC_HOSTDEV fc_header_key fc_chunk_header_key(unsigned method, int dtype, int world, uint32_t unit,
                                             uint32_t step, uint32_t fingerprint)
{
    fc_header_key k;
    k.method = method;
    k.dtype = dtype;
    k.world = world;
    k.unit = unit;
    k.step = step;
    k.fingerprint = fingerprint;
    return k;
}

/* ---- the fall back to `none`: a data-dependent payload (FC_VARSIZE) of a collective that came
 * out no smaller than `none`'s padded payload of the same chunk goes as `none` (the exact values
 * cost no more); the header's method id tells the receiver. compress()'s single payload never
 * falls back (fallback 0): its caller sized the buffer for the method. */
FC_HOSTDEV int fc_chunk_falls_back(int fallback, int64_t padded, int64_t none_padded)
{
    return fallback && padded >= none_padded;
}

/* ---- NaN/Inf and the error sample */

/* Whether a chunk whose g' held `nonfinite` NaN/Inf sends them ("pass" mode): the header is
 * flagged and its residual keeps them; in "zero" mode they were replaced before the encode. */
FC_HOSTDEV int fc_chunk_passes(int64_t nonfinite, int zero_mode)
{
    return nonfinite != 0 && !zero_mode;
}

/* A sampled call's error statistics come from one chunk: the first sent chunk, in chunk order,
 * that passes no NaN/Inf (a chunk that passes one is skipped, not counted). `taken`: a chunk
 * before this one was picked. */
FC_HOSTDEV int fc_sample_picks(int taken, int passes)
{
    return !taken && !passes;
}

/* Whether the picked chunk's sums become a sample: with error feedback always (e = g' - D
 * replaced g' in the residual, and is counted as it is), without it only finite ones. */
FC_HOSTDEV int fc_sample_counts(int ef, double ee, double xx)
{
    return ef || (isfinite(xx) && isfinite(ee));
}

/* The sample's cosine between g' (x) and its decode D = x - e from ||e||^2, ||x||^2 and x . e:
 * ||D||^2 = ||x||^2 - 2 x . e + ||e||^2 and x . D = ||x||^2 - x . e. */
FC_HOSTDEV double fc_sample_cos_of_residual(double ee, double xx, double xe)
{
    const double xd = xx - xe, dd = xx - 2 * xe + ee;
    return fc_sample_cos(xx, dd, xd);
}

#endif
