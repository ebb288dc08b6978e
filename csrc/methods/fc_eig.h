/* fc_eig.h: eigenvectors of a small symmetric matrix (cyclic Jacobi, double precision),
 * deterministic so every rank that holds the same matrix gets the same basis bit for bit. */
#ifndef FC_EIG_H
#define FC_EIG_H

#include <stdint.h>

/* a: m x m symmetric (row-major, destroyed). Writes the k eigenvectors of largest eigenvalue to
 * u (vector j at u[j*m .. j*m+m)), each with its largest-magnitude entry positive. work: m*m
 * doubles. Returns 0, or -1 when m > 256 or k > m. */
int fc_top_eigvecs(double *a, int m, int k, double *work, float *u);

#endif
