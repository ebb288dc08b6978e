/* fc_eig.c: cyclic Jacobi eigen-solver for the small covariance matrices of gradiveq (m <= 256). */
#include "methods/fc_eig.h"

#include <math.h>
#include <string.h>

int fc_top_eigvecs(double *a, int m, int k, double *v, float *u)
{
    if (m > 256 || k > m)
        return -1;
    memset(v, 0, (size_t)m * (size_t)m * sizeof(double));
    for (int i = 0; i < m; i++)
        v[i * m + i] = 1.0;
    for (int sweep = 0; sweep < 30; sweep++) {
        double off = 0, diag = 0;
        for (int p = 0; p < m; p++)
            for (int q = 0; q < m; q++)
                if (p == q)
                    diag += a[p * m + q] * a[p * m + q];
                else
                    off += a[p * m + q] * a[p * m + q];
        if (off <= 1e-24 * diag || off == 0)
            break;
        for (int p = 0; p < m - 1; p++)
            for (int q = p + 1; q < m; q++) {
                double apq = a[p * m + q];
                if (apq == 0)
                    continue;
                double theta = (a[q * m + q] - a[p * m + p]) / (2 * apq);
                double t = (theta >= 0 ? 1.0 : -1.0) / (fabs(theta) + sqrt(theta * theta + 1));
                double c = 1 / sqrt(t * t + 1), s = t * c;
                for (int r = 0; r < m; r++) { /* columns p, q */
                    double arp = a[r * m + p], arq = a[r * m + q];
                    a[r * m + p] = c * arp - s * arq;
                    a[r * m + q] = s * arp + c * arq;
                }
                for (int r = 0; r < m; r++) { /* rows p, q */
                    double apr = a[p * m + r], aqr = a[q * m + r];
                    a[p * m + r] = c * apr - s * aqr;
                    a[q * m + r] = s * apr + c * aqr;
                }
                for (int r = 0; r < m; r++) {
                    double vrp = v[r * m + p], vrq = v[r * m + q];
                    v[r * m + p] = c * vrp - s * vrq;
                    v[r * m + q] = s * vrp + c * vrq;
                }
            }
    }
    /* the k largest eigenvalues, ties to the lower index */
    unsigned char taken[256] = {0};
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < m; i++)
            if (!taken[i] && (best < 0 || a[i * m + i] > a[best * m + best]))
                best = i;
        if (best < 0) /* k > m: never, gradiveq's check refuses it */
            break;
        taken[best] = 1;
        int big = 0;
        for (int r = 1; r < m; r++)
            if (fabs(v[r * m + best]) > fabs(v[big * m + best]))
                big = r;
        double sg = v[big * m + best] < 0 ? -1.0 : 1.0;
        for (int r = 0; r < m; r++)
            u[j * m + r] = (float)(sg * v[r * m + best]);
    }
    return 0;
}
