// cuda_runtime.h (tests only): the subset of CUDA that cuda/*.cu uses, emulated on the host so
// that tests/test_cuda_emulated.py can run the real driver and kernels without a GPU. Every
// CUDA thread of a block is a host thread; warp shuffles and __syncwarp are barriers of the
// warp's lanes (a lane that skips a collective the others reach deadlocks, as full-mask code
// may not do on a GPU); blocks run one after the other; streams and events are synchronous.
// Launches are written `fc_emu_launch(kernel, grid, block, smem, stream)(args)`: the test
// rewrites `kernel<<<...>>>(` into that when it copies cuda/.
#ifndef FC_EMU_CUDA_RUNTIME_H
#define FC_EMU_CUDA_RUNTIME_H

#include <barrier>
#include <cmath>
#include <math.h> // isfinite, sqrt unqualified, as CUDA declares them
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
typedef dim3 uint3;

struct float4 {
    float x, y, z, w;
};
struct uint4 {
    unsigned x, y, z, w;
};
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }

// ---- runtime API: one synchronous "device"

typedef enum { cudaSuccess = 0, cudaErrorNotReady = 600, cudaErrorInvalidValue = 1 } cudaError_t;
typedef int cudaMemcpyKind;
#define cudaMemcpyHostToDevice 1
#define cudaMemcpyDeviceToHost 2
#define cudaMemcpyDeviceToDevice 3
struct fc_emu_stream;
typedef fc_emu_stream *cudaStream_t;
typedef struct fc_emu_event {
    int recorded;
} *cudaEvent_t;
#define cudaEventDefault 0

static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
static inline const char *cudaGetErrorString(cudaError_t) { return "emulated"; }
static inline const char *cudaGetErrorName(cudaError_t) { return "cudaEmulated"; }
static inline cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
static inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t = 0)
{
    memset(p, v, n);
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t = 0)
{
    memcpy(d, s, n);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
static inline cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = new fc_emu_event{0}; return cudaSuccess; }
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { return cudaEventCreate(e); }
static inline cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t = 0) { e->recorded = 1; return cudaSuccess; }
static inline cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
static inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
static inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t) { *ms = 0.0f; return cudaSuccess; }

// ---- threads, warps, blocks

struct fc_emu_warp {
    std::barrier<> bar;
    uint64_t slot[32][2];
    explicit fc_emu_warp(int lanes) : bar(lanes) {}
};

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
inline thread_local fc_emu_warp *fc_emu_cur;
inline thread_local std::barrier<> *fc_emu_block; // the block's threads (__syncthreads)
inline std::mutex fc_emu_atomic;

static inline void __syncwarp(unsigned = 0xffffffffu) { fc_emu_cur->bar.arrive_and_wait(); }
// Every thread of the block (one that returned early deadlocks it, as CUDA does not promise).
static inline void __syncthreads(void) { fc_emu_block->arrive_and_wait(); }

template <class T> static inline T fc_emu_shfl(T v, int src)
{
    static_assert(sizeof(T) <= 16, "shuffle of a small value");
    const int lane = (int)(threadIdx.x & 31);
    memcpy(fc_emu_cur->slot[lane], &v, sizeof(T));
    fc_emu_cur->bar.arrive_and_wait();
    T r;
    memcpy(&r, fc_emu_cur->slot[src & 31], sizeof(T));
    fc_emu_cur->bar.arrive_and_wait();
    return r;
}
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o)
{
    return fc_emu_shfl(v, (int)(threadIdx.x & 31) ^ o);
}
template <class T> static inline T __shfl_sync(unsigned, T v, int src)
{
    return fc_emu_shfl(v, src);
}

template <class T> static inline T __shfl_up_sync(unsigned, T v, unsigned d)
{
    const int lane = (int)(threadIdx.x & 31);
    const T r = fc_emu_shfl(v, lane >= (int)d ? lane - (int)d : lane);
    return r;
}
static inline unsigned __ballot_sync(unsigned, int pred)
{
    const unsigned bit = pred ? 1u << (threadIdx.x & 31) : 0u;
    unsigned all = 0;
    for (int l = 0; l < 32; l++) // every lane's bit, through the warp's slots
        all |= fc_emu_shfl(bit, l);
    return all;
}
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
static inline int __ffs(int v) { return __builtin_ffs(v); }

template <class T> static inline T atomicOr(T *p, T v)
{
    std::lock_guard<std::mutex> g(fc_emu_atomic);
    T old = *p;
    *p = old | v;
    return old;
}
template <class T> static inline T atomicAdd(T *p, T v)
{
    std::lock_guard<std::mutex> g(fc_emu_atomic);
    T old = *p;
    *p = old + v;
    return old;
}
static inline unsigned atomicCAS(unsigned *p, unsigned cmp, unsigned v)
{
    std::lock_guard<std::mutex> g(fc_emu_atomic);
    unsigned old = *p;
    if (old == cmp)
        *p = v;
    return old;
}
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline long long __double_as_longlong(double d) { long long i; memcpy(&i, &d, 8); return i; }

// Runs the grid: blockDim.x host threads walk the blocks in order, a barrier between blocks.
template <class K> struct fc_emu_launcher {
    K k;
    dim3 grid, block;
    template <class... A> void operator()(A... args) const
    {
        const unsigned nt = block.x, nw = (nt + 31) / 32;
        std::vector<fc_emu_warp *> warps;
        for (unsigned w = 0; w < nw; w++)
            warps.push_back(new fc_emu_warp((int)(w + 1 < nw ? 32 : nt - 32 * w)));
        std::barrier<> between((std::ptrdiff_t)nt), inside((std::ptrdiff_t)nt);
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < nt; t++)
            ts.emplace_back([&, t]() {
                threadIdx = dim3(t, 0, 0);
                blockDim = block;
                gridDim = grid;
                fc_emu_cur = warps[t / 32];
                fc_emu_block = &inside;
                for (unsigned y = 0; y < grid.y; y++)
                    for (unsigned x = 0; x < grid.x; x++) {
                        blockIdx = dim3(x, y, 0);
                        k(args...);
                        between.arrive_and_wait();
                    }
            });
        for (auto &t : ts)
            t.join();
        for (auto *w : warps)
            delete w;
    }
};

template <class K> static inline fc_emu_launcher<K> fc_emu_launch(K k, dim3 grid, dim3 block, size_t = 0,
                                                                  cudaStream_t = 0)
{
    return fc_emu_launcher<K>{k, grid, block};
}

#endif
