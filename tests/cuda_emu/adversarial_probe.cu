// adversarial_probe.cu (tests only): kernels that behave differently on the adversarial emulation
// than on a naive one (tests/cuda/test_cuda_emu_adversarial.py builds and runs it): __shared__ read
// before any write (the poison, every block), threads' order of arrival, launches CUDA refuses
// (reported, not run), a device-to-host copy read before the host waits for it.
#include "cuda_runtime.h"
#include <cstdio>
__global__ void k_shared(unsigned *out)
{
    __shared__ unsigned s[64];
    if (threadIdx.x == 0)
        out[blockIdx.x] = s[blockIdx.x % 64]; // read before any write: the poison
    __syncthreads();
    s[threadIdx.x % 64] = 0; // what a zeroed static would leave the next block
}
__global__ void k_order(int *log, int *pos)
{
    log[atomicAdd(pos, 1)] = (int)(blockIdx.x * blockDim.x + threadIdx.x);
}
__global__ void k_touch(int *p) { p[0] = 1; }
int main()
{
    unsigned sh[4];
    k_shared<<<4, 64>>>(sh);
    printf("shared %08x %08x %08x %08x\n", sh[0], sh[1], sh[2], sh[3]);
    int log[256], pos = 0;
    k_order<<<4, 64>>>(log, &pos);
    printf("order");
    for (int i = 0; i < 256; i++)
        printf(" %d", log[i]);
    printf("\n");
    int p = 0;
    k_touch<<<1, 1025>>>(&p);
    cudaError_t peek = cudaPeekAtLastError(), get = cudaGetLastError(), after = cudaGetLastError();
    printf("bad block: ran %d peek %s get %s after %s\n", p, cudaGetErrorName(peek), cudaGetErrorName(get), cudaGetErrorName(after));
    k_touch<<<0, 32>>>(&p);
    printf("empty grid: ran %d %s\n", p, cudaGetErrorName(cudaGetLastError()));
    k_touch<<<1, 32, 49 * 1024>>>(&p);
    printf("big smem: ran %d %s\n", p, cudaGetErrorName(cudaGetLastError()));
    int dev = 42, host = 7;
    cudaMemcpyAsync(&host, &dev, 4, cudaMemcpyDeviceToHost, 0);
    dev = 43; // a later kernel's write: the copy read 42 in stream order
    const int before = host;
    cudaStreamSynchronize(0);
    printf("copy: before sync %d after %d\n", before, host);
    return 0;
}
