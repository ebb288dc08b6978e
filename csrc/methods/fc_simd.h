/* fc_simd.h: how the CPU fast paths are chosen. Each fast path sits beside its method's scalar
 * reference loop and must write the same bytes; fc_cpu_reference (set by
 * _C._reference_kernels, for the tests that prove that) sends every call to the reference. */
#ifndef FC_SIMD_H
#define FC_SIMD_H

extern int fc_cpu_reference;

/* A function compiled twice, for the SSE2 baseline and for AVX2, picked once at load time by
 * the ifunc resolver GCC emits. Only "avx2", never "fma": no FMA instruction exists in either
 * version, so no contraction can change a rounding. Selections between two float results
 * in these loops are written as masks: GCC turns a ?: back into a branch around the float op,
 * and then (trapping math) does not vectorise the loop. Elsewhere (aarch64, clang): the one
 * baseline version, still correct. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define FC_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FC_CLONES
#endif

#endif
