/* fc_randk_par.h: random-k's selection sampling (m_randomk.c: element i taken when its shared
 * draw r_i satisfies r_i * (n - i) < need << 32, `need` the picks still to make) cut into segments
 * that run side by side, with exactly the sequential picks. Each step depends on `need`, so a
 * segment cannot know its entry value; it runs from the two ends a <= b of a window of likely
 * entry values instead. Trajectories never cross (a step takes from every need at or above a
 * threshold), so every entry x in [a, b] moves as a's does except at the steps where b's takes
 * and a's does not: those steps ("events", at most b - a) are recorded, and the segment's exit
 * value for any x in [a, b] follows from them in O(events). Segments of FC_RK_L1 elements are
 * composed by FC_RK_G into level-2 segments the same way (walking their events), so one thread
 * walks n / (FC_RK_L1 * FC_RK_G) level-2 segments for the exact entry values, and the level-1
 * segments then emit their picks in parallel. A window that misses the exact value, or more
 * events than a segment stores, falls back to simulating that segment: slower, never different.
 * Windows are 6 standard deviations of `need` (hypergeometric) wide and more, so that a window
 * rarely misses; but over a chunk's last few thousand elements every trajectory of a window
 * converges (each step an event), so there the segments fall back as a rule. The CUDA kernels
 * (cuda/fc_cu_randomk.cu) run steps 1, 2 and 5 as they are here, and steps 3 and 4 by warps with
 * the same rules (events resolved 32 at a time, a fallback simulated 128 elements a round); a
 * host test (tests/core/test_randk_parallel.py) runs these functions in order. */
#ifndef FC_RANDK_PAR_H
#define FC_RANDK_PAR_H

#include <math.h>
#include <stdint.h>
#include "common/fc_hostdev.h"
#include "common/fc_rng.h"
#include "common/fc_sparse_rules.h"

#define FC_RK_L1 512   /* elements per level-1 segment (a multiple of 4: whole Philox calls) */
#define FC_RK_G 64     /* level-1 segments per level-2 segment */
#define FC_RK_CAP1 16  /* events a level-1 segment stores */
#define FC_RK_CAP2 256  /* events a level-2 segment stores */

typedef struct {
    uint64_t key;   /* r * (n - i): taken from need v when key < v << 32 */
    int64_t before; /* steps of the window's low end taken before this one */
} fc_rk_event;

typedef struct {
    int64_t a, b; /* the window of entry values */
    int64_t dlo;  /* steps the low end takes over the segment */
    int32_t nev;  /* events stored */
    int32_t over; /* 1: not usable (events lost, or a level-1 window missed): simulate instead */
} fc_rk_seg;

/* The window of `need` at element i of a chunk of n keeping k: its mean k (n - i) / n, plus and
 * minus `spread` standard deviations (sd^2 = k (n - k) i (n - i) / (n^2 (n - 1))) and some, within
 * what is possible. Level 1 is wider than level 2, so that a level-2 segment's two trajectories
 * stay inside the windows of the level-1 segments it is composed of. */
FC_HOSTDEV void fc_rk_window(int64_t n, int64_t k, int64_t i, int level, double spread, int64_t *a,
                             int64_t *b)
{
    const double nn = (double)n, kk = (double)k, ii = (double)i;
    const double var = n > 1 ? kk * (nn - kk) * ii * (nn - ii) / (nn * nn * (nn - 1.0)) : 0.0;
    double w = spread * sqrt(var > 0 ? var : 0.0) + 16.0;
    if (level == 1)
        w = 2.0 * w + 64.0;
    const double c = kk * (nn - ii) / nn;
    int64_t lo = (int64_t)(c - w), hi = (int64_t)(c + w) + 1;
    const int64_t mn = k - i > 0 ? k - i : 0, mx = k < n - i ? k : n - i;
    *a = lo < mn ? mn : lo > mx ? mx : lo;
    *b = hi > mx ? mx : hi < mn ? mn : hi;
}

/* Elements [lo, hi) of the chunk from need x, exactly as m_randomk.c steps: the need left; the
 * picks, when out is not NULL, as base + element into out[0..). */
FC_HOSTDEV int64_t fc_rk_run(const fc_rng *g, int64_t n, int64_t lo, int64_t hi, int64_t x, int64_t *out,
                             int64_t base)
{
    int64_t m = 0;
    for (int64_t q = lo; q < hi && x > 0; q += 4) {
        const fc_u32x4 r = fc_rng_draw4(g, (uint32_t)(q >> 2));
        for (int j = 0; j < 4 && q + j < hi && x > 0; j++)
            if (fc_rule_randk_take(r.v[j], (uint64_t)(n - (q + j)), x)) {
                if (out != NULL)
                    out[m++] = base + q + j;
                x--;
            }
    }
    return x;
}

/* Level 1: elements [lo, hi) from the window [a, b]; the events into ev[0..cap). */
FC_HOSTDEV void fc_rk_scan(const fc_rng *g, int64_t n, int64_t lo, int64_t hi, int64_t a, int64_t b,
                           fc_rk_event *ev, int cap, fc_rk_seg *s)
{
    int64_t x = a, y = b, dlo = 0;
    int nev = 0;
    for (int64_t q = lo; q < hi; q += 4) {
        const fc_u32x4 r = fc_rng_draw4(g, (uint32_t)(q >> 2));
        for (int j = 0; j < 4 && q + j < hi; j++) {
            const uint64_t key = (uint64_t)r.v[j] * (uint64_t)(n - (q + j));
            if (key < ((uint64_t)x << 32)) { /* the low end takes, so every x up to b does */
                x--;
                y--;
                dlo++;
            } else if (key < ((uint64_t)y << 32)) {
                if (nev < cap) {
                    ev[nev].key = key;
                    ev[nev].before = dlo;
                }
                nev++;
                y--;
            }
        }
    }
    s->a = a;
    s->b = b;
    s->dlo = dlo;
    s->nev = nev < cap ? nev : cap;
    s->over = nev > cap;
}

/* The exit value of a usable segment for an entry x in [a, b]. */
FC_HOSTDEV int64_t fc_rk_eval(const fc_rk_seg *s, const fc_rk_event *ev, int64_t x)
{
    int64_t extra = 0;
    for (int e = 0; e < s->nev; e++)
        extra += ev[e].key < ((uint64_t)(x - ev[e].before - extra) << 32);
    return x - s->dlo - extra;
}

FC_HOSTDEV int fc_rk_usable(const fc_rk_seg *s, int64_t x)
{
    return !s->over && s->a <= x && x <= s->b;
}

/* Level 2: `count` level-1 segments in a row (their events at ev1 + j * FC_RK_CAP1) walked from
 * the window [a, b]; the events into ev2[0..cap2). */
FC_HOSTDEV void fc_rk_compose(const fc_rk_seg *segs, const fc_rk_event *ev1, int count, int64_t a, int64_t b,
                              fc_rk_event *ev2, int cap2, fc_rk_seg *out)
{
    int64_t lo = a, hi = b, base = 0;
    int nev = 0, over = 0;
    for (int j = 0; j < count; j++) {
        const fc_rk_seg *s = &segs[j];
        const fc_rk_event *e1 = ev1 + (int64_t)j * FC_RK_CAP1;
        if (s->over || lo < s->a || hi > s->b) {
            over = 1;
            break;
        }
        int64_t dl = 0, dh = 0;
        for (int e = 0; e < s->nev; e++) {
            const int tl = e1[e].key < ((uint64_t)(lo - e1[e].before - dl) << 32);
            const int th = e1[e].key < ((uint64_t)(hi - e1[e].before - dh) << 32);
            if (th && !tl) {
                if (nev < cap2) {
                    ev2[nev].key = e1[e].key;
                    ev2[nev].before = base + e1[e].before + dl;
                }
                nev++;
            }
            dl += tl;
            dh += th;
        }
        base += s->dlo + dl;
        lo -= s->dlo + dl;
        hi -= s->dlo + dh;
    }
    out->a = a;
    out->b = b;
    out->dlo = base;
    out->nev = nev < cap2 ? nev : cap2;
    out->over = over || nev > cap2;
}

/* Segments of a chunk of n: level-1 segment j spans [j * FC_RK_L1, ...), level-2 segment t the
 * level-1 segments [t * FC_RK_G, ...). */
FC_HOSTDEV int64_t fc_rk_segs1(int64_t n)
{
    return (n + FC_RK_L1 - 1) / FC_RK_L1;
}

FC_HOSTDEV int64_t fc_rk_segs2(int64_t n)
{
    return (fc_rk_segs1(n) + FC_RK_G - 1) / FC_RK_G;
}

/* Level-1 segment j of a chunk of n from need x: its exit value, through its events when the
 * scan made it usable for x, else by simulation. */
FC_HOSTDEV int64_t fc_rk_step1(const fc_rng *g, int64_t n, int64_t j, const fc_rk_seg *s, const fc_rk_event *ev,
                               int64_t x)
{
    if (fc_rk_usable(s, x))
        return fc_rk_eval(s, ev, x);
    const int64_t lo = j * FC_RK_L1, hi = lo + FC_RK_L1 < n ? lo + FC_RK_L1 : n;
    return fc_rk_run(g, n, lo, hi, x, NULL, 0);
}

/* ---- the steps a kernel thread (or the host test) runs, in this order; chunk arrays: segs1 and
 * ev1 (FC_RK_CAP1 per segment) by level-1 segment, segs2 and ev2 (FC_RK_CAP2 each) by level-2
 * segment, x2 and x1 the exact entry values. */

/* 1. Level-1 segment j (one thread each). */
FC_HOSTDEV void fc_rk_level1(const fc_rng *g, int64_t n, int64_t k, int64_t j, double spread, fc_rk_seg *segs1,
                             fc_rk_event *ev1)
{
    int64_t a, b;
    const int64_t lo = j * FC_RK_L1, hi = lo + FC_RK_L1 < n ? lo + FC_RK_L1 : n;
    fc_rk_window(n, k, lo, 1, spread, &a, &b);
    fc_rk_scan(g, n, lo, hi, a, b, ev1 + j * FC_RK_CAP1, FC_RK_CAP1, &segs1[j]);
}

/* 2. Level-2 segment t (one thread each). */
FC_HOSTDEV void fc_rk_level2(int64_t n, int64_t k, int64_t t, double spread, const fc_rk_seg *segs1,
                             const fc_rk_event *ev1, fc_rk_seg *segs2, fc_rk_event *ev2)
{
    int64_t a, b;
    const int64_t j0 = t * FC_RK_G, s1 = fc_rk_segs1(n);
    const int count = (int)(j0 + FC_RK_G < s1 ? FC_RK_G : s1 - j0);
    fc_rk_window(n, k, j0 * FC_RK_L1, 2, spread, &a, &b);
    fc_rk_compose(segs1 + j0, ev1 + j0 * FC_RK_CAP1, count, a, b, ev2 + t * FC_RK_CAP2, FC_RK_CAP2, &segs2[t]);
}

/* 3. The chunk's exact need at each level-2 segment (one thread for the chunk); returns the need
 * left at the end, 0 for a correct walk. */
FC_HOSTDEV int64_t fc_rk_top(const fc_rng *g, int64_t n, int64_t k, const fc_rk_seg *segs1, const fc_rk_event *ev1,
                             const fc_rk_seg *segs2, const fc_rk_event *ev2, int64_t *x2)
{
    int64_t x = k;
    const int64_t s1 = fc_rk_segs1(n), s2 = fc_rk_segs2(n);
    for (int64_t t = 0; t < s2; t++) {
        x2[t] = x;
        if (fc_rk_usable(&segs2[t], x)) {
            x = fc_rk_eval(&segs2[t], ev2 + t * FC_RK_CAP2, x);
            continue;
        }
        for (int64_t j = t * FC_RK_G; j < (t + 1) * FC_RK_G && j < s1; j++)
            x = fc_rk_step1(g, n, j, &segs1[j], ev1 + j * FC_RK_CAP1, x);
    }
    return x;
}

/* 4. Within level-2 segment t (one thread each): the exact need at each of its level-1 ones. */
FC_HOSTDEV void fc_rk_mid(const fc_rng *g, int64_t n, int64_t t, const fc_rk_seg *segs1, const fc_rk_event *ev1,
                          const int64_t *x2, int64_t *x1)
{
    int64_t x = x2[t];
    const int64_t s1 = fc_rk_segs1(n);
    for (int64_t j = t * FC_RK_G; j < (t + 1) * FC_RK_G && j < s1; j++) {
        x1[j] = x;
        x = fc_rk_step1(g, n, j, &segs1[j], ev1 + j * FC_RK_CAP1, x);
    }
}

/* 5. Level-1 segment j's picks (one thread each), as base + element, at their place among the
 * chunk's k: out[k - x1[j] ...). */
FC_HOSTDEV void fc_rk_emit(const fc_rng *g, int64_t n, int64_t k, int64_t j, const int64_t *x1, int64_t *out,
                           int64_t base)
{
    const int64_t lo = j * FC_RK_L1, hi = lo + FC_RK_L1 < n ? lo + FC_RK_L1 : n;
    fc_rk_run(g, n, lo, hi, x1[j], out + (k - x1[j]), base);
}

#endif
