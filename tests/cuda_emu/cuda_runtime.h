// cuda_runtime.h (tests only): the subset of CUDA that cuda/*.cu uses, emulated on the host so
// that tests/cuda/test_cuda_emulated.py can run the real driver and kernels without a GPU. Every
// CUDA thread of a block is a fiber of the launching host thread; warp shuffles and __syncwarp
// are barriers of the warp's lanes, __syncthreads one of the block's (a thread that skips a
// collective the others reach deadlocks, as full-mask code may not do on a GPU, and the launch
// aborts saying so). Launches are written `fc_emu_launch(kernel, grid, block, smem, stream)(args)`:
// the test rewrites `kernel<<<...>>>(` into that when it copies cuda/.
//
// Adversarial where a GPU may differ from a naive emulation (FC_EMU_SEED, default 1, seeds it;
// FC_EMU_ORDER=index keeps the scheduler's fixed order, to tell a scheduling bug apart):
// - the threads of a block run in a random order between barriers (reshuffled every round), and
//   the blocks of a grid in a random order: code that leans on lockstep warps or block order shows;
// - __shared__ memory is filled with a poison byte (FC_EMU_POISON, default 0xFF: NaN floats, -1
//   ints) before every block, as a GPU gives a block whatever the last one left; device scratch
//   is poisoned before every driver call (emu_stubs.cpp);
// - launch configurations are checked against the real limits (1..1024 threads a block, grid
//   1..2^31-1 x 65535 x 65535, 48 KiB of dynamic shared memory; build.py checks each kernel's
//   static shared memory): a bad one does not run and is reported, as CUDA does, through
//   cudaGetLastError / cudaPeekAtLastError;
// - a device-to-host cudaMemcpyAsync reads the device in stream order but lands in host memory
//   (poisoned until then) only when the host synchronizes (stream, event): a host read of it
//   before the wait sees garbage.
// Kernels run to completion at their launch: stream order between kernels and copies holds.
// Every call of the runtime that costs the host time on a GPU is counted (fc_emu_count: launches,
// memsets, events, host waits, copies, allocations), for tests/cuda/test_cuda_call_counts.py to
// read per driver call through emu_stubs.cpp's fc_emu_counts_read / fc_emu_counts_reset.
#ifndef FC_EMU_CUDA_RUNTIME_H
#define FC_EMU_CUDA_RUNTIME_H

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <ucontext.h>
#include <cmath>
#include <math.h> // isfinite, sqrt unqualified, as CUDA declares them
#include <cstdint>
#include <cstring>
#include <atomic>
#include <mutex>
#include <vector>

#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
// every __shared__ variable in one section, poisoned before each block (fc_emu_poison_shared)
#define __shared__ static __attribute__((section("fc_emu_shared")))
#define __launch_bounds__(...)
#define __noinline__ __attribute__((noinline)) // a rare path kept out of a loop's registers

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

typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNotReady = 600,
} cudaError_t;
typedef int cudaMemcpyKind;
#define cudaMemcpyHostToDevice 1
#define cudaMemcpyDeviceToHost 2
#define cudaMemcpyDeviceToDevice 3
struct fc_emu_stream;
typedef fc_emu_stream *cudaStream_t;
typedef struct fc_emu_event {
    int recorded;
    const void *stream;
    uint64_t seq;
} *cudaEvent_t;
#define cudaEventDefault 0

// the last launch error, as the runtime keeps it per host thread (not sticky: a bad configuration)
inline thread_local cudaError_t fc_emu_last_error = cudaSuccess;
static inline cudaError_t cudaGetLastError(void)
{
    const cudaError_t e = fc_emu_last_error;
    fc_emu_last_error = cudaSuccess;
    return e;
}
static inline cudaError_t cudaPeekAtLastError(void) { return fc_emu_last_error; }
static inline const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess ? "no error" : e == cudaErrorInvalidConfiguration ? "invalid configuration argument"
         : e == cudaErrorInvalidValue ? "invalid argument" : e == cudaErrorNotReady ? "device not ready" : "emulated";
}
static inline const char *cudaGetErrorName(cudaError_t e)
{
    return e == cudaSuccess ? "cudaSuccess" : e == cudaErrorInvalidConfiguration ? "cudaErrorInvalidConfiguration"
         : e == cudaErrorInvalidValue ? "cudaErrorInvalidValue" : e == cudaErrorNotReady ? "cudaErrorNotReady"
         : "cudaEmulated";
}

// ---- the seeded choices: thread and block order, the poison byte (environment, read once)
struct fc_emu_conf {
    uint64_t seed = 1;
    bool index_order = false;
    int poison = 0xFF;
    fc_emu_conf()
    {
        if (const char *v = getenv("FC_EMU_SEED"))
            seed = strtoull(v, nullptr, 0);
        if (const char *v = getenv("FC_EMU_ORDER"))
            index_order = strcmp(v, "index") == 0;
        if (const char *v = getenv("FC_EMU_POISON"))
            poison = (int)strtol(v, nullptr, 0) & 0xFF;
    }
};
static inline const fc_emu_conf &fc_emu_config(void)
{
    static const fc_emu_conf c;
    return c;
}
static inline uint64_t fc_emu_mix(uint64_t *s) // splitmix64
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
template <class T> static inline void fc_emu_shuffle(std::vector<T> &v, uint64_t *rng)
{
    if (fc_emu_config().index_order)
        return;
    for (size_t i = v.size(); i > 1; i--)
        std::swap(v[i - 1], v[(size_t)(fc_emu_mix(rng) % i)]);
}

// ---- what the driver asks of the runtime, counted: the host's fixed cost per call on a GPU is
// mostly these (a launch, a memset or an event record is a few microseconds of host time each,
// a host wait stalls the hook path). One set per process; emu_stubs.cpp exports them, in this
// order (FC_EMU_COUNT_NAMES). cudaEventQuery is not a wait (it returns cudaErrorNotReady on a GPU);
// cub_calls are the CUB algorithms emu_stubs.cpp stands in for (several launches each on a GPU).
#define FC_EMU_COUNT_NAMES "launches,memsets,event_creates,event_records,event_queries,host_syncs,d2h_copies,mallocs,cub_calls"
struct fc_emu_counts {
    std::atomic<unsigned long long> launches, memsets, event_creates, event_records, event_queries, host_syncs,
        d2h_copies, mallocs, cub_calls;
};
inline fc_emu_counts fc_emu_count;
static inline void fc_emu_tick(std::atomic<unsigned long long> &c) { c.fetch_add(1, std::memory_order_relaxed); }

// ---- device-to-host copies in flight: read in stream order, written to the host at a wait
struct fc_emu_copy {
    void *dst;
    std::vector<char> data;
    const void *stream;
    uint64_t seq;
};
inline std::mutex fc_emu_copies_lock;
inline std::vector<fc_emu_copy> fc_emu_copies;
inline uint64_t fc_emu_seq;
// Lands the copies queued before `seq` on `stream` (the legacy stream 0 waits for, and is waited
// by, every stream; all: every copy).
static inline void fc_emu_land(const void *stream, uint64_t seq, bool all)
{
    std::lock_guard<std::mutex> g(fc_emu_copies_lock);
    std::vector<fc_emu_copy> keep;
    for (auto &c : fc_emu_copies) {
        if (all || (c.seq < seq && (c.stream == stream || stream == nullptr || c.stream == nullptr)))
            memcpy(c.dst, c.data.data(), c.data.size());
        else
            keep.push_back(std::move(c));
    }
    fc_emu_copies.swap(keep);
}
static inline cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
static inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t = 0)
{
    fc_emu_tick(fc_emu_count.memsets);
    memset(p, v, n);
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind kind, cudaStream_t st = 0)
{
    if (kind != cudaMemcpyDeviceToHost || n == 0) {
        memcpy(d, s, n);
        return cudaSuccess;
    }
    fc_emu_tick(fc_emu_count.d2h_copies);
    std::lock_guard<std::mutex> g(fc_emu_copies_lock);
    fc_emu_copies.push_back(fc_emu_copy{d, std::vector<char>((const char *)s, (const char *)s + n), st, fc_emu_seq++});
    memset(d, fc_emu_config().poison, n); // in flight: what the host reads before its wait
    return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t st)
{
    fc_emu_tick(fc_emu_count.host_syncs);
    fc_emu_land(st, UINT64_MAX, false);
    return cudaSuccess;
}
static inline cudaError_t cudaDeviceSynchronize(void)
{
    fc_emu_tick(fc_emu_count.host_syncs);
    fc_emu_land(nullptr, UINT64_MAX, true);
    return cudaSuccess;
}
// Device memory from the runtime: the library must take it from torch's allocator through the
// State (fc_cuda.h), so a call here is counted for the tests to refuse; it works, so they can.
static inline cudaError_t cudaMalloc(void **p, size_t n)
{
    fc_emu_tick(fc_emu_count.mallocs);
    *p = malloc(n > 0 ? n : 1);
    return *p != nullptr ? cudaSuccess : cudaErrorInvalidValue;
}
static inline cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
static inline cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    fc_emu_tick(fc_emu_count.event_creates);
    *e = new fc_emu_event{0, nullptr, 0};
    return cudaSuccess;
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t st = 0)
{
    fc_emu_tick(fc_emu_count.event_records);
    std::lock_guard<std::mutex> g(fc_emu_copies_lock);
    e->recorded = 1;
    e->stream = st;
    e->seq = fc_emu_seq++;
    return cudaSuccess;
}
// an event is complete once looked at (the kernels before it ran at their launch); what it
// completes are the copies queued before it on its stream
static inline cudaError_t fc_emu_event_done(cudaEvent_t e)
{
    fc_emu_land(e->stream, e->seq, false);
    return cudaSuccess;
}
static inline cudaError_t cudaEventQuery(cudaEvent_t e)
{
    fc_emu_tick(fc_emu_count.event_queries);
    return fc_emu_event_done(e);
}
static inline cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    fc_emu_tick(fc_emu_count.host_syncs);
    return fc_emu_event_done(e);
}
static inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t) { *ms = 0.0f; return cudaSuccess; }

// ---- threads, warps, blocks: every CUDA thread is a fiber (its own stack) of the launching host
// thread, run cooperatively: a barrier (a warp's, for shuffles and __syncwarp; the block's) is a
// count the fiber waits on by yielding to the launch's scheduler. One host thread, no locks, and
// no host thread per CUDA thread, which on a loaded machine cost more than the kernels.

struct fc_emu_bar {
    int need = 0, count = 0;
    unsigned gen = 0;
};

struct fc_emu_warp {
    fc_emu_bar bar;
    uint64_t slot[32][2];
    explicit fc_emu_warp(int lanes) { bar.need = lanes; }
};

struct fc_emu_fiber {
    ucontext_t ctx; // swapcontext's (FC_EMU_FAST: unused)
    void *sp;       // fc_emu_swap's: the saved stack pointer
    dim3 tid, bid;
    fc_emu_warp *warp;
    bool done;
};

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
inline thread_local fc_emu_warp *fc_emu_cur;
inline thread_local fc_emu_bar *fc_emu_block; // the block's threads (__syncthreads)
inline thread_local fc_emu_fiber *fc_emu_self;
inline thread_local ucontext_t fc_emu_sched;
inline thread_local void *fc_emu_sched_sp;
inline thread_local unsigned long long fc_emu_progress; // arrivals: a round without any is a deadlock
inline std::mutex fc_emu_atomic;

#if defined(__x86_64__) && defined(__linux__)
// A switch between fibers without a system call (emu_stubs.cpp): swapcontext also saves and
// restores the signal mask, one syscall per switch, which was most of the emulation's time.
// fc_emu_swap pushes the callee-saved registers, MXCSR and the x87 control word, stores the
// stack pointer in *save_sp, loads load_sp and pops what the other side pushed.
#define FC_EMU_FAST 1
extern "C" void fc_emu_swap(void **save_sp, void *load_sp);
#endif

static inline void fc_emu_yield(void)
{
#ifdef FC_EMU_FAST
    fc_emu_swap(&fc_emu_self->sp, fc_emu_sched_sp);
#else
    swapcontext(&fc_emu_self->ctx, &fc_emu_sched);
#endif
}

static inline void fc_emu_wait(fc_emu_bar *b)
{
    const unsigned g = b->gen;
    fc_emu_progress++;
    if (++b->count == b->need) {
        b->count = 0;
        b->gen++;
        return;
    }
    while (b->gen == g)
        fc_emu_yield();
}

static inline void __syncwarp(unsigned = 0xffffffffu) { fc_emu_wait(&fc_emu_cur->bar); }
// Every thread of the block (one that returned early deadlocks it, as CUDA does not promise).
static inline void __syncthreads(void) { fc_emu_wait(fc_emu_block); }
// Orders a thread's global writes before its later ones (a last-block ticket): the emulation's
// writes are seen at once, by one host thread.
static inline void __threadfence(void) {}

template <class T> static inline T fc_emu_shfl(T v, int src)
{
    static_assert(sizeof(T) <= 16, "shuffle of a small value");
    const int lane = (int)(threadIdx.x & 31);
    memcpy(fc_emu_cur->slot[lane], &v, sizeof(T));
    fc_emu_wait(&fc_emu_cur->bar);
    T r;
    memcpy(&r, fc_emu_cur->slot[src & 31], sizeof(T));
    fc_emu_wait(&fc_emu_cur->bar);
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
    // every lane's bit through the warp's slots, in one exchange (two barriers, not a shuffle a
    // lane); lanes past a partial warp's last hold no bit
    const int lane = (int)(threadIdx.x & 31), lanes = fc_emu_cur->bar.need;
    fc_emu_cur->slot[lane][0] = pred ? 1u : 0u;
    fc_emu_wait(&fc_emu_cur->bar);
    unsigned all = 0;
    for (int l = 0; l < lanes; l++)
        all |= (fc_emu_cur->slot[l][0] != 0 ? 1u : 0u) << l;
    fc_emu_wait(&fc_emu_cur->bar);
    return all;
}
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
static inline int __ffs(int v) { return __builtin_ffs(v); }
static inline int __ffsll(long long v) { return __builtin_ffsll(v); }

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

// Runs the grid: blockDim.x fibers walk the blocks (in a seeded random order), the block's
// __shared__ memory poisoned between blocks (barriers around it).
extern "C" char __start_fc_emu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_fc_emu_shared[] __attribute__((weak, visibility("hidden")));
static inline void fc_emu_poison_shared(void)
{
    if (__start_fc_emu_shared != nullptr && __stop_fc_emu_shared > __start_fc_emu_shared)
        memset(__start_fc_emu_shared, fc_emu_config().poison, (size_t)(__stop_fc_emu_shared - __start_fc_emu_shared));
}
inline thread_local uint64_t fc_emu_launches; // each launch's own draws, reproducible from the seed
inline thread_local std::function<void()> *fc_emu_body;
static inline void fc_emu_entry(void)
{
    (*fc_emu_body)();
    fc_emu_self->done = true; // back to the scheduler through uc_link
#ifdef FC_EMU_FAST
    fc_emu_yield(); // never resumed
    __builtin_trap();
#endif
}

// A fiber's first stack: what fc_emu_swap pops (MXCSR and control word as they are now, zeroed
// registers), then its return into fc_emu_entry, 16-byte aligned as at a call.
static inline void fc_emu_start(fc_emu_fiber &f, char *stack, size_t size)
{
#ifdef FC_EMU_FAST
    uintptr_t top = ((uintptr_t)(stack + size)) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = nullptr; // fc_emu_entry's own return address: it never returns
    *--sp = (void *)&fc_emu_entry;
    for (int r = 0; r < 6; r++) // rbp rbx r12 r13 r14 r15
        *--sp = nullptr;
    uint32_t mxcsr;
    uint16_t cw;
    __asm__ volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(cw));
    *--sp = (void *)((uintptr_t)mxcsr | (uintptr_t)cw << 32); // MXCSR at 0, control word at 4
    f.sp = sp;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = stack;
    f.ctx.uc_stack.ss_size = size;
    f.ctx.uc_link = &fc_emu_sched;
    makecontext(&f.ctx, fc_emu_entry, 0);
#endif
}

static inline void fc_emu_resume(fc_emu_fiber &f)
{
#ifdef FC_EMU_FAST
    fc_emu_swap(&fc_emu_sched_sp, f.sp);
#else
    swapcontext(&fc_emu_sched, &f.ctx);
#endif
}

// A launch configuration CUDA refuses (cudaErrorInvalidConfiguration), or NULL.
static inline const char *fc_emu_bad_launch(dim3 grid, dim3 block, size_t smem)
{
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64)
        return "threads per block outside 1..1024 (x, y <= 1024, z <= 64)";
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
        return "grid dimensions outside 1..2^31-1 x 1..65535 x 1..65535";
    if (smem > 48 * 1024) // no kernel opts in (cudaFuncSetAttribute) to more dynamic shared memory
        return "more than 48 KiB of dynamic shared memory";
    return nullptr;
}

template <class K> struct fc_emu_launcher {
    K k;
    dim3 grid, block;
    size_t smem;
    template <class... A> void operator()(A... args) const
    {
        if (const char *why = fc_emu_bad_launch(grid, block, smem)) {
            if (getenv("FC_EMU_VERBOSE"))
                fprintf(stderr, "cuda_emu: launch <<<(%u,%u,%u), (%u,%u,%u), %zu>>> refused: %s\n", grid.x, grid.y,
                        grid.z, block.x, block.y, block.z, smem, why);
            fc_emu_last_error = cudaErrorInvalidConfiguration;
            return;
        }
        fc_emu_tick(fc_emu_count.launches); // a refused one never reached the device
        // FC_EMU_SKIP_KERNELS=1 (benchmarks/call_overhead.py only: what the host spends per call
        // around the kernels): the launch is checked and counted, its threads never run, so every
        // output stays as it was. No test may set it.
        static const bool skip = getenv("FC_EMU_SKIP_KERNELS") != nullptr && strcmp(getenv("FC_EMU_SKIP_KERNELS"), "1") == 0;
        if (skip)
            return;
        if (block.y != 1 || block.z != 1 || grid.z != 1) {
            fprintf(stderr, "cuda_emu: a 2-D block or 3-D grid is not emulated\n");
            abort();
        }
        static thread_local std::vector<std::unique_ptr<char[]>> stacks;
        const size_t stack = 256 * 1024;
        const unsigned nt = block.x, nw = (nt + 31) / 32;
        uint64_t rng = fc_emu_config().seed * 0x2545F4914F6CDD1Dull + fc_emu_launches++;
        std::vector<std::unique_ptr<fc_emu_warp>> warps;
        for (unsigned w = 0; w < nw; w++)
            warps.emplace_back(new fc_emu_warp((int)(w + 1 < nw ? 32 : nt - 32 * w)));
        fc_emu_bar between, inside;
        between.need = inside.need = (int)nt;
        std::vector<dim3> blocks;
        blocks.reserve((size_t)grid.x * grid.y);
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++)
                blocks.push_back(dim3(x, y, 0));
        fc_emu_shuffle(blocks, &rng);
        std::function<void()> body = [&]() {
            for (const dim3 &b : blocks) {
                fc_emu_wait(&between); // the last block's threads are all done with its shared memory
                if (threadIdx.x == 0)
                    fc_emu_poison_shared();
                fc_emu_wait(&between);
                blockIdx = b;
                k(args...);
            }
        };
        std::function<void()> *outer_body = fc_emu_body;
        fc_emu_fiber *outer_self = fc_emu_self;
        void *outer_sched = fc_emu_sched_sp;
        fc_emu_body = &body;
        blockDim = block;
        gridDim = grid;
        while (stacks.size() < nt)
            stacks.emplace_back(new char[stack]);
        std::vector<fc_emu_fiber> fibers(nt);
        for (unsigned t = 0; t < nt; t++) {
            fc_emu_fiber &f = fibers[t];
            fc_emu_start(f, stacks[t].get(), stack);
            f.tid = dim3(t, 0, 0);
            f.bid = dim3(0, 0, 0);
            f.warp = warps[t / 32].get();
            f.done = false;
        }
        std::vector<unsigned> order(nt);
        for (unsigned t = 0; t < nt; t++)
            order[t] = t;
        unsigned alive = nt;
        while (alive > 0) {
            const unsigned long long before = fc_emu_progress;
            fc_emu_shuffle(order, &rng); // each round: the threads up to their next barrier, in a new order
            for (unsigned t : order) {
                fc_emu_fiber &f = fibers[t];
                if (f.done)
                    continue;
                fc_emu_self = &f;
                threadIdx = f.tid;
                blockIdx = f.bid;
                fc_emu_cur = f.warp;
                fc_emu_block = &inside;
                fc_emu_resume(f);
                f.bid = blockIdx;
                if (f.done) {
                    alive--;
                    fc_emu_progress++;
                }
            }
            if (alive > 0 && fc_emu_progress == before) {
                fprintf(stderr, "cuda_emu: deadlock: %u threads wait at a barrier the others never reach "
                        "(FC_EMU_SEED=%llu)\n", alive, (unsigned long long)fc_emu_config().seed);
                abort();
            }
        }
        fc_emu_body = outer_body;
        fc_emu_self = outer_self;
        fc_emu_sched_sp = outer_sched;
    }
};

template <class K> static inline fc_emu_launcher<K> fc_emu_launch(K k, dim3 grid, dim3 block, size_t smem = 0,
                                                                  cudaStream_t = 0)
{
    return fc_emu_launcher<K>{k, grid, block, smem};
}

// ---- what a kernel's grid is sized by (fc_cu_onepass.cuh's fc_cu_fill), and the fences of a
// last-block ticket. The emulated device is small (FC_EMU_SMS SMs, default 2, two blocks each), so
// that a grid sized to fill it gives every warp several units to walk, as on a GPU at large
// sizes. Blocks run one after another to completion, so a fence has nothing to order.
struct uint2 {
    unsigned x, y;
};
static inline uint2 make_uint2(unsigned a, unsigned b) { return uint2{a, b}; }
typedef enum { cudaDevAttrMultiProcessorCount = 16 } cudaDeviceAttr;
static inline cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr attr, int)
{
    if (attr != cudaDevAttrMultiProcessorCount)
        return cudaErrorInvalidValue;
    const char *e = getenv("FC_EMU_SMS");
    *v = e != nullptr && atoi(e) > 0 ? atoi(e) : 2;
    return cudaSuccess;
}
template <class K> static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, K, int threads, size_t)
{
    *n = threads > 0 && threads <= 1024 ? 2 : 0;
    return threads > 0 && threads <= 1024 ? cudaSuccess : cudaErrorInvalidValue;
}

#endif
