// fc_cu_ctx.cuh: the per-State CUDA context (event pairs, last stream) and the helpers that
// switch to a tensor's device for the length of one call.
#ifndef FC_CU_CTX_CUH
#define FC_CU_CTX_CUH

#include <stdlib.h>
#include "fc_cu.cuh"

// Event pairs, every kind's from one ring: timed calls whose times may be in flight at once (the
// 64 per kind of before, pooled). All are made at the context's first timed call, in one go: a
// cudaEventCreate costs the host about as much as a launch, and made one pair per call (as they
// were) they cost the first calls of every State two each.
#define FC_CU_PAIRS (64 * FC_TIME_KINDS)

typedef struct {
    cudaEvent_t a, b;
    int kind;    // what the pair times (FC_TIME_*)
    int pending; // both recorded, elapsed time not yet harvested
} fc_cu_timer;

struct fc_cuda_ctx {
    fc_cu_timer t[FC_CU_PAIRS];
    int made;                      // pairs whose events exist (the first `made` of t)
    int tried;                     // the pool was made, or its making failed: not tried again
    int next;                      // ring position of the next pair
    double seconds[FC_TIME_KINDS]; // harvested, not yet handed to the State's counters
    fc_cu_timer *open_comm;        // comm_mark's begin, waiting for its end
    int open_kind;
    cudaStream_t last_stream;      // where the workspace was last written
    int last_device;
    int have_last;
};

fc_cuda_ctx *fc_cu_ctx_new(void);
void fc_cu_ctx_free(fc_cuda_ctx *ctx);
// The next free pair with `a` recorded on s, timing `kind`, or NULL (the call goes untimed) when
// the GPU still runs the call that used it FC_CU_PAIRS timed calls ago, or an event call failed.
// The first call makes the pool.
fc_cu_timer *fc_cu_timer_start(fc_cuda_ctx *ctx, int kind, cudaStream_t s);
void fc_cu_timer_stop(fc_cu_timer *t, cudaStream_t s);
// Adds finished pairs to ctx->seconds; `wait`: waits for every pending one first.
void fc_cu_timers_harvest(fc_cuda_ctx *ctx, int wait);
int fc_cu_comm_mark(fc_cuda_ctx *ctx, int device, void *stream, int end, int kind, fc_err *err);

const fc_cu_method *fc_cu_method_by_id(int id);

// Makes `device` current for one call and puts the caller's device back afterwards.
typedef struct {
    int prev, changed;
} fc_cu_device_guard;

static inline int fc_cu_device_enter(fc_cu_device_guard *g, int device, fc_err *err)
{
    int rc = FC_OK;
    g->changed = 0;
    FC_CHECK_CUDA(cudaGetDevice(&g->prev), err, error);
    if (g->prev != device) {
        FC_CHECK_CUDA(cudaSetDevice(device), err, error);
        g->changed = 1;
    }
error:
    return rc;
}

static inline void fc_cu_device_leave(const fc_cu_device_guard *g)
{
    if (g->changed)
        FC_CUDA_IGNORE(cudaSetDevice(g->prev));
}

// One API entry's frame: its stream and device, the device guard, the timer it runs (NULL: none
// yet). fc_cu_frame_init before any exit, fc_cu_frame_enter to switch devices, f.t from
// fc_cu_timer_start, fc_cu_frame_done once the work is queued, fc_cu_frame_leave on every exit.
struct fc_cu_frame {
    cudaStream_t s;
    int device;
    fc_cu_device_guard dg;
    fc_cu_timer *t;
};

static inline void fc_cu_frame_init(fc_cu_frame *f, const fc_cuda_head &h)
{
    f->s = (cudaStream_t)h.stream;
    f->device = h.device;
    f->dg.prev = 0;
    f->dg.changed = 0;
    f->t = NULL;
}

static inline int fc_cu_frame_enter(fc_cu_frame *f, fc_err *err)
{
    return fc_cu_device_enter(&f->dg, f->device, err);
}

// The work is queued: the timer stopped, the stream noted as where the workspace was written.
static inline void fc_cu_frame_done(fc_cuda_ctx *ctx, fc_cu_frame *f)
{
    if (f->t != NULL)
        fc_cu_timer_stop(f->t, f->s);
    f->t = NULL;
    ctx->last_stream = f->s;
    ctx->last_device = f->device;
    ctx->have_last = 1;
}

// Every exit: a timer still running stopped, the caller's device back; returns rc.
static inline int fc_cu_frame_leave(fc_cu_frame *f, int rc)
{
    if (f->t != NULL)
        fc_cu_timer_stop(f->t, f->s);
    fc_cu_device_leave(&f->dg);
    return rc;
}

// What fc_gprime_fix finds in g' of each sent chunk, before the encode of a method that is not
// one pass (fc_cu_method.onepass; a one-pass encode counts as it goes): the NaN/Inf of the
// gradient per chunk into bad_per_chunk[c] (the driver's ws->bad, a parts call's own flags: a
// chunk with any passes them, flagged in its header, or sends e there in "zero" mode) and, by
// `count` (COUNT_*), into nonfinite_in and (sums of two finite values beyond fp32) saturated.
// compress() counts only the saturated sums of x + e, as the CPU's does. (fc_cu_driver.cu)
enum { COUNT_BAD = 1, COUNT_SAT = 2 };
__global__ void count_nonfinite(fc_cuda_geom geo, fc_cu_src src, int count, unsigned int *bad_per_chunk,
                                fc_cuda_ws *ws);

#endif
