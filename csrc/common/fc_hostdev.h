/* fc_hostdev.h: lets one inline function serve the C reference path and the CUDA kernels. */
#ifndef FC_HOSTDEV_H
#define FC_HOSTDEV_H
#ifdef __CUDACC__
#define FC_HOSTDEV __host__ __device__ __forceinline__
#else
#define FC_HOSTDEV static inline
#endif
#endif
