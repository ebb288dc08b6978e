/* randk_parallel.c (tests only): random-k's segmented selection sampling (csrc/common/fc_randk_par.h, the
 * CUDA kernels' steps run one after the other) against the sequential definition (m_randomk.c's
 * loop), for the (n, k, seed, spread) cases given as arguments in fours: prints one line per case,
 * "ok n k" or where the picks differ. spread: the windows' width in standard deviations (small
 * ones force the exact fallbacks). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fc_randk_par.h"

static int64_t reference(const fc_rng *g, int64_t n, int64_t k, int64_t *idx)
{
    int64_t need = k, m = 0;
    for (int64_t q = 0; q < n && need > 0; q += 4) {
        fc_u32x4 r = fc_rng_draw4(g, (uint32_t)(q >> 2));
        for (int j = 0; j < 4 && q + j < n && need > 0; j++)
            if (fc_rule_randk_take(r.v[j], (uint64_t)(n - (q + j)), need)) {
                idx[m++] = q + j;
                need--;
            }
    }
    return m;
}

int main(int argc, char **argv)
{
    int bad = 0;
    for (int a = 1; a + 3 < argc; a += 4) {
        const int64_t n = atoll(argv[a]), k = atoll(argv[a + 1]);
        const uint64_t seed = strtoull(argv[a + 2], NULL, 10);
        const double spread = atof(argv[a + 3]);
        fc_rng g = {(uint32_t)seed, (uint32_t)(seed >> 32), 3u, 7u, 11u};
        const int64_t s1 = fc_rk_segs1(n), s2 = fc_rk_segs2(n);
        fc_rk_seg *segs1 = calloc((size_t)s1 + 1, sizeof(fc_rk_seg)), *segs2 = calloc((size_t)s2 + 1, sizeof(fc_rk_seg));
        fc_rk_event *ev1 = calloc((size_t)(s1 + 1) * FC_RK_CAP1, sizeof(fc_rk_event));
        fc_rk_event *ev2 = calloc((size_t)(s2 + 1) * FC_RK_CAP2, sizeof(fc_rk_event));
        int64_t *x1 = calloc((size_t)s1 + 1, 8), *x2 = calloc((size_t)s2 + 1, 8);
        int64_t *want = calloc((size_t)k + 1, 8), *got = calloc((size_t)k + 1, 8);
        int usable1 = 0, usable2 = 0;
        for (int64_t j = 0; j < s1; j++)
            fc_rk_level1(&g, n, k, j, spread, segs1, ev1);
        for (int64_t t = 0; t < s2; t++)
            fc_rk_level2(n, k, t, spread, segs1, ev1, segs2, ev2);
        const int64_t left = fc_rk_top(&g, n, k, segs1, ev1, segs2, ev2, x2);
        for (int64_t t = 0; t < s2; t++) {
            fc_rk_mid(&g, n, t, segs1, ev1, x2, x1);
            usable2 += fc_rk_usable(&segs2[t], x2[t]);
        }
        for (int64_t j = 0; j < s1; j++) {
            fc_rk_emit(&g, n, k, j, x1, got, 0);
            usable1 += fc_rk_usable(&segs1[j], x1[j]);
        }
        const int64_t m = reference(&g, n, k, want);
        int same = left == 0 && m == k && memcmp(want, got, (size_t)k * 8) == 0;
        if (same) {
            printf("ok %lld %lld level1 %d/%lld level2 %d/%lld\n", (long long)n, (long long)k, usable1,
                   (long long)s1, usable2, (long long)s2);
        } else {
            int64_t at = 0;
            while (at < k && want[at] == got[at])
                at++;
            printf("DIFF %lld %lld seed %llu spread %g: left %lld, first difference at pick %lld\n", (long long)n,
                   (long long)k, (unsigned long long)seed, spread, (long long)left, (long long)at);
            bad = 1;
        }
        free(segs1), free(segs2), free(ev1), free(ev2), free(x1), free(x2), free(want), free(got);
    }
    return bad;
}
