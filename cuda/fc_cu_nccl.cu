// fc_cu_nccl.cu: the NCCL transport: torch's own libnccl (found already loaded, never linked
// here), one non-blocking communicator per process group, the all-to-all of payloads as grouped
// ncclSend/ncclRecv on the hook's stream, a watchdog that aborts a communicator whose work
// stalls past its timeout, and the two ways a communicator ends: the collective release all
// ranks call together, and the local teardown of a destructor.
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include "fc_cu_ctx.cuh"

#ifdef FC_HAVE_NCCL
#include <nccl.h>
static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId is 128 bytes");
#else
// Without nccl.h the few ABI facts used here are declared directly; they have been stable
// since NCCL 2.0 (the library is resolved at run time either way).
typedef struct ncclComm *ncclComm_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef enum { ncclSuccess = 0, ncclInProgress = 7 } ncclResult_t;
typedef enum { ncclUint8 = 1 } ncclDataType_t;
#endif

// NCCL 2.14's ncclConfig_t, declared here whether or not nccl.h was found: NCCL copies
// min(size, its own) bytes and resets the fields a config of an older `version` lacks, so this
// layout means the same to every NCCL >= 2.14 and the header's version never has to match the
// library torch loaded.
typedef struct {
    size_t size;
    unsigned int magic, version;
    int blocking, cga_cluster_size, min_ctas, max_ctas;
    const char *net_name;
} fc_nccl_config;
#define FC_NCCL_CONFIG_MAGIC 0xcafebeefu
#define FC_NCCL_VERSION_2_14 21400u
#define FC_NCCL_UNDEF_INT (-2147483647 - 1)

typedef struct {
    int loaded;
    char why[400];
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*comm_init_rank_config)(ncclComm_t *, int, ncclUniqueId, int, fc_nccl_config *);
    ncclResult_t (*comm_finalize)(ncclComm_t);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*comm_abort)(ncclComm_t);
    ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    const char *(*error_string)(ncclResult_t);
} nccl_syms;

static nccl_syms nccl;
static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;

#define FC_NCCL_INFLIGHT 256 // all-to-alls the watchdog tracks per communicator

enum { FC_COMM_LIVE = 0, FC_COMM_ABORTED = 1, FC_COMM_RELEASED = 2 };

struct fc_cuda_comm {
    pthread_mutex_t mu;  // everything below; held for a whole enqueue, so the watchdog
                         // (trylock) never aborts a communicator another thread is inside
    ncclComm_t comm;     // NULL once aborted or released
    int world, rank, device;
    int nonblocking;     // made with ncclCommInitRankConfig (NCCL >= 2.14): waits are bounded
    double timeout_s;    // <= 0: none
    int state;
    char why[320];       // what ended it, for every later call's NcclError
    volatile int *abort_flag; // pinned and mapped: read on the device by each call's guard
    cudaEvent_t done[FC_NCCL_INFLIGHT];
    double queued_at[FC_NCCL_INFLIGHT];
    int head, count;     // ring of the all-to-alls not yet seen finished
    fc_cuda_comm *next;  // the watchdog's list
};

static void *sym(void *lib, const char *name)
{
    void *p = lib != NULL ? dlsym(lib, name) : NULL;
    return p != NULL ? p : dlsym(RTLD_DEFAULT, name);
}

static void load_nccl(void)
{
    // The copy torch loaded comes first: two NCCLs in one process do not share state.
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
    const int in_process = lib != NULL || dlsym(RTLD_DEFAULT, "ncclGetUniqueId") != NULL;
    if (!in_process) {
        lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL) {
            const char *e = dlerror();
            snprintf(nccl.why, sizeof(nccl.why), "libnccl.so.2 is not loaded and could not be "
                     "opened (%.150s); import torch with CUDA first, or install nvidia-nccl-cu13",
                     e ? e : "no message");
            return;
        }
    }
    nccl.get_unique_id = (ncclResult_t(*)(ncclUniqueId *))sym(lib, "ncclGetUniqueId");
    nccl.comm_init_rank = (ncclResult_t(*)(ncclComm_t *, int, ncclUniqueId, int))sym(lib, "ncclCommInitRank");
    nccl.comm_init_rank_config = (ncclResult_t(*)(ncclComm_t *, int, ncclUniqueId, int, fc_nccl_config *))sym(
        lib, "ncclCommInitRankConfig");
    nccl.comm_finalize = (ncclResult_t(*)(ncclComm_t))sym(lib, "ncclCommFinalize");
    nccl.comm_destroy = (ncclResult_t(*)(ncclComm_t))sym(lib, "ncclCommDestroy");
    nccl.comm_abort = (ncclResult_t(*)(ncclComm_t))sym(lib, "ncclCommAbort");
    nccl.comm_get_async_error = (ncclResult_t(*)(ncclComm_t, ncclResult_t *))sym(lib, "ncclCommGetAsyncError");
    nccl.send = (ncclResult_t(*)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))sym(lib, "ncclSend");
    nccl.recv = (ncclResult_t(*)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))sym(lib, "ncclRecv");
    nccl.group_start = (ncclResult_t(*)(void))sym(lib, "ncclGroupStart");
    nccl.group_end = (ncclResult_t(*)(void))sym(lib, "ncclGroupEnd");
    nccl.error_string = (const char *(*)(ncclResult_t))sym(lib, "ncclGetErrorString");
    if (!nccl.get_unique_id || !nccl.comm_init_rank || !nccl.comm_destroy || !nccl.comm_abort ||
        !nccl.comm_get_async_error || !nccl.send || !nccl.recv || !nccl.group_start ||
        !nccl.group_end || !nccl.error_string) {
        snprintf(nccl.why, sizeof(nccl.why), "the loaded NCCL lacks a symbol this transport needs "
                 "(ncclSend/ncclRecv need NCCL >= 2.7)");
        return;
    }
    nccl.loaded = 1;
}

static int need_nccl(fc_err *err)
{
    pthread_once(&nccl_once, load_nccl);
    if (!nccl.loaded)
        return fc_fail(err, FC_ERR_NCCL, "NCCL unavailable: %s", nccl.why);
    return FC_OK;
}

// Records file:line and NCCL's message, then jumps to the function's cleanup.
#define FC_CHECK_NCCL(call, err, label)                                                      \
    do {                                                                                     \
        ncclResult_t fc_nr_ = (call);                                                        \
        if (fc_nr_ != ncclSuccess) {                                                         \
            fc_fail((err), FC_ERR_NCCL, "%s:%d: %s failed: %s (ncclResult %d)", __FILE__,     \
                    __LINE__, #call, nccl.error_string(fc_nr_), (int)fc_nr_);                \
            rc = FC_ERR_NCCL;                                                                \
            goto label;                                                                      \
        }                                                                                    \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void nap_us(long us)
{
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

// ---- the end of a communicator

// Local teardown (never waits for peers): the flag first, so the guard kernels queued behind
// the aborted operations poison their receive buffers, then ncclCommAbort, which makes NCCL's
// kernels on the device return. Holds c->mu.
static void abort_locked(fc_cuda_comm *c, const char *why)
{
    if (c->state != FC_COMM_LIVE)
        return;
    *c->abort_flag = 1;
    __sync_synchronize();
    snprintf(c->why, sizeof(c->why), "%s", why);
    fprintf(stderr, "fsdpcomp: NCCL communicator of rank %d of %d on cuda:%d aborted: %s\n",
            c->rank, c->world, c->device, c->why);
    if (c->comm != NULL)
        (void)nccl.comm_abort(c->comm);
    c->comm = NULL;
    c->state = FC_COMM_ABORTED;
    c->count = 0;
}

// Waits while the non-blocking communicator has work in progress (init, a group's enqueue,
// finalize), at most until `deadline`: ncclSuccess, NCCL's error, or ncclInProgress on timeout.
static ncclResult_t settle(fc_cuda_comm *c, ncclResult_t r, double deadline)
{
    for (int spins = 0; r == ncclInProgress; spins++) {
        ncclResult_t async = ncclSuccess;
        ncclResult_t q = nccl.comm_get_async_error(c->comm, &async);
        r = q != ncclSuccess ? q : async;
        if (r != ncclInProgress || (deadline > 0 && now_s() > deadline))
            break;
        nap_us(spins < 100 ? 10 : 1000);
    }
    return r;
}

static double deadline_of(const fc_cuda_comm *c)
{
    return c->timeout_s > 0 ? now_s() + c->timeout_s : 0;
}

// ---- the watchdog: one thread for every communicator of the process

static pthread_mutex_t watch_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t watch_cv = PTHREAD_COND_INITIALIZER;
static fc_cuda_comm *watched = NULL;
static pthread_t watch_thread;
static int watch_started = 0, watch_stopping = 0;

// One look at c: an asynchronous error (a peer failed), or the oldest all-to-all still running
// after timeout_s (a peer stalled or left), aborts it. Skipped while another thread is inside
// it: an enqueue bounds its own waits.
static void watch_one(fc_cuda_comm *c)
{
    if (pthread_mutex_trylock(&c->mu) != 0)
        return;
    if (c->state == FC_COMM_LIVE) {
        ncclResult_t async = ncclSuccess;
        if (nccl.comm_get_async_error(c->comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress) {
            char why[200];
            snprintf(why, sizeof(why), "NCCL reported an asynchronous error (%s): a peer failed",
                     nccl.error_string(async));
            abort_locked(c, why);
        }
        FC_CUDA_IGNORE(cudaSetDevice(c->device));
        while (c->state == FC_COMM_LIVE && c->count > 0) {
            const int i = c->head;
            cudaError_t q = cudaEventQuery(c->done[i]);
            if (q == cudaErrorNotReady) {
                (void)cudaGetLastError();
                if (c->timeout_s > 0 && now_s() - c->queued_at[i] > c->timeout_s) {
                    char why[200];
                    snprintf(why, sizeof(why), "an all-to-all did not complete within the timeout "
                             "(%.0f s): a peer stalled or left", c->timeout_s);
                    abort_locked(c, why);
                }
                break;
            }
            if (q != cudaSuccess)
                (void)cudaGetLastError(); // a broken context: every later CUDA call says so
            c->head = (c->head + 1) % FC_NCCL_INFLIGHT;
            c->count--;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

static void *watch_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&watch_mu);
    while (!watch_stopping) {
        for (fc_cuda_comm *c = watched; c != NULL; c = c->next)
            watch_one(c);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100 * 1000 * 1000; // ten looks a second: a timeout is seconds at least
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&watch_cv, &watch_mu, &until);
    }
    pthread_mutex_unlock(&watch_mu);
    return NULL;
}

// At exit, before the static CUDA runtime tears itself down (its atexit handler was registered
// earlier, so it runs later): the watchdog must not be inside it then.
static void watch_stop(void)
{
    pthread_mutex_lock(&watch_mu);
    const int started = watch_started;
    watch_stopping = 1;
    pthread_cond_broadcast(&watch_cv);
    pthread_mutex_unlock(&watch_mu);
    if (started)
        pthread_join(watch_thread, NULL);
}

// A forked child (a DataLoader worker) has no watchdog thread and may have copied watch_mu
// locked: it starts with an empty list and a fresh lock, and never watches the parent's
// communicators (NCCL does not survive a fork).
static void watch_after_fork(void)
{
    pthread_mutex_init(&watch_mu, NULL);
    pthread_cond_init(&watch_cv, NULL);
    watched = NULL;
    watch_started = 0;
}

static int watch_add(fc_cuda_comm *c, fc_err *err)
{
    int rc = FC_OK;
    pthread_mutex_lock(&watch_mu);
    if (!watch_started && !watch_stopping) {
        if (pthread_create(&watch_thread, NULL, watch_main, NULL) != 0) {
            rc = fc_fail(err, FC_ERR_NCCL, "could not start the NCCL watchdog thread: %s",
                         strerror(errno));
        } else {
            static int hooks_set = 0; // once per process, however often a fork restarts it
            watch_started = 1;
            if (!hooks_set) {
                hooks_set = 1;
                atexit(watch_stop);
                pthread_atfork(NULL, NULL, watch_after_fork);
            }
        }
    }
    if (rc == FC_OK) {
        c->next = watched;
        watched = c;
    }
    pthread_mutex_unlock(&watch_mu);
    return rc;
}

static void watch_remove(fc_cuda_comm *c)
{
    pthread_mutex_lock(&watch_mu);
    for (fc_cuda_comm **p = &watched; *p != NULL; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    pthread_mutex_unlock(&watch_mu);
}

// ---- the API

int fc_cu_nccl_unique_id(uint8_t id[128], fc_err *err)
{
    int rc = FC_OK;
    ncclUniqueId u;
    FC_TRY(need_nccl(err));
    FC_CHECK_NCCL(nccl.get_unique_id(&u), err, error);
    memcpy(id, &u, 128);
error:
    return rc;
}

// The host memory and events of a record (its NCCL communicator is already gone or leaked).
static void free_record(fc_cuda_comm *c)
{
    for (int i = 0; i < FC_NCCL_INFLIGHT; i++)
        if (c->done[i] != NULL)
            FC_CUDA_IGNORE(cudaEventDestroy(c->done[i]));
    if (c->abort_flag != NULL)
        FC_CUDA_IGNORE(cudaFreeHost((void *)c->abort_flag));
    pthread_mutex_destroy(&c->mu);
    free(c);
}

int fc_cu_nccl_comm_init(const uint8_t id[128], int world, int rank, int device, double timeout_s,
                         fc_cuda_comm **out, fc_err *err)
{
    int rc = FC_OK;
    fc_cu_device_guard dg = {0, 0};
    fc_cuda_comm *c = NULL;
    ncclUniqueId u;
    void *flag = NULL;
    *out = NULL;
    FC_TRY(need_nccl(err));
    if (world < 1 || rank < 0 || rank >= world)
        return fc_fail(err, FC_ERR_VALUE, "NCCL communicator: rank %d of world %d", rank, world);
    if (!(timeout_s >= 0))
        return fc_fail(err, FC_ERR_VALUE, "NCCL communicator: timeout_s must be >= 0, got %g", timeout_s);
    FC_TRY(fc_cu_device_enter(&dg, device, err));
    c = (fc_cuda_comm *)calloc(1, sizeof(*c));
    if (c == NULL) {
        rc = fc_fail(err, FC_ERR_NOMEM, "could not allocate an NCCL communicator record");
        goto error;
    }
    pthread_mutex_init(&c->mu, NULL);
    c->world = world;
    c->rank = rank;
    c->device = device;
    c->timeout_s = timeout_s;
    FC_CHECK_CUDA(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped), err, error);
    c->abort_flag = (volatile int *)flag;
    *c->abort_flag = 0;
    flag = NULL;
    memcpy(&u, id, 128);
    if (nccl.comm_init_rank_config != NULL) {
        // Non-blocking: init, each group's enqueue and finalize return at once and are waited
        // for here with a deadline, so a peer that never joins cannot hang this rank.
        fc_nccl_config cfg = {sizeof(fc_nccl_config), FC_NCCL_CONFIG_MAGIC, FC_NCCL_VERSION_2_14, 0,
                              FC_NCCL_UNDEF_INT, FC_NCCL_UNDEF_INT, FC_NCCL_UNDEF_INT, NULL};
        ncclResult_t r = nccl.comm_init_rank_config(&c->comm, world, u, rank, &cfg);
        c->nonblocking = 1;
        if (c->comm != NULL && (r == ncclSuccess || r == ncclInProgress))
            r = settle(c, ncclInProgress, deadline_of(c));
        if (r != ncclSuccess) {
            if (c->comm != NULL)
                (void)nccl.comm_abort(c->comm);
            c->comm = NULL;
            rc = fc_fail(err, FC_ERR_NCCL, r == ncclInProgress
                         ? "ncclCommInitRankConfig: not every rank of %d joined within the timeout "
                           "(%.0f s; config key timeout_s or the process group's)%s"
                         : "ncclCommInitRankConfig failed for %d ranks (%.0f s timeout): %s",
                         world, timeout_s, r == ncclInProgress ? "" : nccl.error_string(r));
            goto error;
        }
    } else { // NCCL < 2.14: blocking, and its init waits for every rank without a deadline
        FC_CHECK_NCCL(nccl.comm_init_rank(&c->comm, world, u, rank), err, error);
    }
    FC_TRY(watch_add(c, err));
    *out = c;
    c = NULL;
error:
    if (flag != NULL)
        FC_CUDA_IGNORE(cudaFreeHost(flag));
    if (c != NULL) {
        if (c->comm != NULL)
            (void)nccl.comm_abort(c->comm);
        free_record(c);
    }
    fc_cu_device_leave(&dg);
    return rc;
}

// Collective: every rank of the communicator calls it. Waits (at most timeout_s) for what was
// queued, then ncclCommFinalize (it flushes and synchronises with the peers) and ncclCommDestroy
// (then local). A timeout or an error aborts the communicator instead and is reported.
int fc_cu_nccl_comm_release(fc_cuda_comm *c, fc_err *err)
{
    int rc = FC_OK;
    fc_cu_device_guard dg = {0, 0};
    char why[240];
    double deadline;
    FC_TRY(need_nccl(err));
    FC_TRY(fc_cu_device_enter(&dg, c->device, err));
    watch_remove(c); // from here on, this thread alone decides
    pthread_mutex_lock(&c->mu);
    deadline = deadline_of(c);
    while (c->state == FC_COMM_LIVE && c->count > 0) {
        cudaError_t q = cudaEventQuery(c->done[c->head]);
        if (q == cudaErrorNotReady) {
            (void)cudaGetLastError();
            if (deadline > 0 && now_s() > deadline) {
                snprintf(why, sizeof(why), "release: queued all-to-alls did not complete within "
                         "the timeout (%.0f s): a peer stalled or left", c->timeout_s);
                abort_locked(c, why);
                rc = fc_fail(err, FC_ERR_NCCL, "%s", c->why);
                break;
            }
            nap_us(1000);
            continue;
        }
        if (q != cudaSuccess)
            (void)cudaGetLastError();
        c->head = (c->head + 1) % FC_NCCL_INFLIGHT;
        c->count--;
    }
    // aborted (and reported then) or released before: nothing is left to end
    if (c->state == FC_COMM_LIVE && nccl.comm_finalize != NULL) {
        ncclResult_t r = nccl.comm_finalize(c->comm);
        if (c->nonblocking)
            r = settle(c, r, deadline);
        if (r != ncclSuccess) {
            snprintf(why, sizeof(why), "release: ncclCommFinalize did not complete (%s; %.0f s "
                     "timeout): a peer did not call release_nccl, or failed",
                     r == ncclInProgress ? "timed out" : nccl.error_string(r), c->timeout_s);
            abort_locked(c, why);
            rc = fc_fail(err, FC_ERR_NCCL, "%s", c->why);
        }
    }
    if (c->state == FC_COMM_LIVE) {
        ncclResult_t r = nccl.comm_destroy(c->comm);
        c->comm = NULL;
        c->state = FC_COMM_RELEASED;
        snprintf(c->why, sizeof(c->why), "the communicator was released (fsdpcomp.release_nccl)");
        if (r != ncclSuccess && r != ncclInProgress)
            rc = fc_fail(err, FC_ERR_NCCL, "ncclCommDestroy failed: %s", nccl.error_string(r));
    }
    pthread_mutex_unlock(&c->mu);
error:
    fc_cu_device_leave(&dg);
    return rc;
}

// From the capsule's destructor: never collective. A live communicator is aborted (local: it
// frees its memory and threads without waiting for peers); with `leak` (the interpreter is
// exiting) it is left to the process's exit, and no CUDA or NCCL call is made at all: the
// runtime may be going down with it, and peers are exiting at their own pace.
void fc_cu_nccl_comm_free(fc_cuda_comm *c, int leak)
{
    if (c == NULL)
        return;
    watch_remove(c);
    if (leak) {
        free(c); // the mutex is unlocked and dies with the memory
        return;
    }
    pthread_mutex_lock(&c->mu);
    if (c->state == FC_COMM_LIVE && c->comm != NULL && nccl.loaded) {
        (void)nccl.comm_abort(c->comm);
        c->comm = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    free_record(c);
}

// Behind every all-to-all on its stream: when the communicator was aborted the payloads never
// (fully) arrived, so the receive buffer is overwritten with FC_MAGIC_ABORTED, which the decode
// rejects (NaN outputs, an NcclError from counters()) instead of summing stale bytes.
__global__ void abort_guard(const volatile int *flag, uint8_t *recv, int64_t bytes)
{
    __shared__ int aborted;
    if (threadIdx.x == 0)
        aborted = *flag;
    __syncthreads();
    if (!aborted)
        return;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += stride)
        recv[i] = (uint8_t)(FC_MAGIC_ABORTED >> (8 * (i & 3))); // little-endian words
}

int fc_cu_nccl_all_to_all(fc_cuda_ctx *ctx, fc_cuda_comm *c, int device, void *stream,
                          const uint8_t *send, const int64_t *send_splits, uint8_t *recv,
                          const int64_t *recv_splits, fc_err *err)
{
    int rc = FC_OK, grouped = 0, locked = 0;
    fc_cu_device_guard dg = {0, 0};
    fc_cu_timer *t = NULL;
    const cudaStream_t s = (cudaStream_t)stream;
    int64_t so = 0, ro = 0;
    FC_TRY(need_nccl(err));
    if (device != c->device)
        return fc_fail(err, FC_ERR_VALUE, "tensors are on cuda:%d but the NCCL communicator was "
                       "made for cuda:%d", device, c->device);
    pthread_mutex_lock(&c->mu);
    locked = 1;
    if (c->state != FC_COMM_LIVE) {
        rc = fc_fail(err, FC_ERR_NCCL, "the NCCL communicator (rank %d of %d) is unusable: %s",
                     c->rank, c->world, c->why);
        goto error;
    }
    FC_TRY(fc_cu_device_enter(&dg, device, err));
    t = fc_cu_timer_start(ctx, FC_TIME_COMM, s);
    FC_CHECK_NCCL(nccl.group_start(), err, error);
    grouped = 1;
    for (int r = 0; r < c->world; r++) {
        // inside a group NCCL only records the operation (a non-blocking one may answer
        // ncclInProgress); what it costs is settled by the group's end
        if (send_splits[r] > 0) {
            ncclResult_t q = nccl.send(send + so, (size_t)send_splits[r], ncclUint8, r, c->comm, s);
            FC_CHECK_NCCL(q == ncclInProgress ? ncclSuccess : q, err, error);
        }
        if (recv_splits[r] > 0) {
            ncclResult_t q = nccl.recv(recv + ro, (size_t)recv_splits[r], ncclUint8, r, c->comm, s);
            FC_CHECK_NCCL(q == ncclInProgress ? ncclSuccess : q, err, error);
        }
        so += send_splits[r];
        ro += recv_splits[r];
    }
    grouped = 0;
    {
        ncclResult_t r = nccl.group_end();
        if (c->nonblocking)
            r = settle(c, r, deadline_of(c)); // the first call to a peer connects to it
        if (r != ncclSuccess) {
            char why[240];
            snprintf(why, sizeof(why), r == ncclInProgress
                     ? "an all-to-all could not be queued within the timeout (%.0f s): a peer "
                       "stalled or left%s"
                     : "an all-to-all failed to queue (%.0f s timeout): %s", c->timeout_s,
                     r == ncclInProgress ? "" : nccl.error_string(r));
            // a non-blocking communicator's errors are its own: it is unusable from here on
            if (c->nonblocking)
                abort_locked(c, why);
            rc = fc_fail(err, FC_ERR_NCCL, "%s", why);
            goto error;
        }
    }
    if (ro > 0) {
        abort_guard<<<ro < (1 << 20) ? 8 : 128, 256, 0, s>>>(c->abort_flag, recv, ro);
        FC_CHECK_LAUNCH(err, error);
    }
    if (c->count < FC_NCCL_INFLIGHT) { // else the older ones in flight cover this one
        const int i = (c->head + c->count) % FC_NCCL_INFLIGHT;
        if (c->done[i] == NULL &&
            cudaEventCreateWithFlags(&c->done[i], cudaEventDisableTiming) != cudaSuccess) {
            (void)cudaGetLastError();
            c->done[i] = NULL;
        }
        if (c->done[i] != NULL && cudaEventRecord(c->done[i], s) == cudaSuccess) {
            c->queued_at[i] = now_s();
            c->count++;
        } else {
            (void)cudaGetLastError();
        }
    }
    fc_cu_timer_stop(t, s);
    t = NULL;
    ctx->last_stream = s;
    ctx->last_device = device;
    ctx->have_last = 1;
error:
    if (grouped)
        (void)nccl.group_end(); // close the group so the next call starts clean
    if (t != NULL)
        fc_cu_timer_stop(t, s);
    if (locked)
        pthread_mutex_unlock(&c->mu);
    fc_cu_device_leave(&dg);
    return rc;
}
