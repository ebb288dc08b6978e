// fc_cu_nccl.cu: the NCCL transport: torch's own libnccl (found already loaded, never linked
// here), one communicator per process group, and the all-to-all of payloads as grouped
// ncclSend/ncclRecv on the hook's stream.
#include <dlfcn.h>
#include <pthread.h>
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


typedef struct {
    int loaded;
    char why[400];
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*comm_abort)(ncclComm_t);
    ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    const char *(*error_string)(ncclResult_t);
    ncclResult_t (*get_version)(int *);
} nccl_syms;

static nccl_syms nccl;
static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;

struct fc_cuda_comm {
    ncclComm_t comm;
    int world, rank, device;
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
    nccl.comm_destroy = (ncclResult_t(*)(ncclComm_t))sym(lib, "ncclCommDestroy");
    nccl.comm_abort = (ncclResult_t(*)(ncclComm_t))sym(lib, "ncclCommAbort");
    nccl.comm_get_async_error = (ncclResult_t(*)(ncclComm_t, ncclResult_t *))sym(lib, "ncclCommGetAsyncError");
    nccl.send = (ncclResult_t(*)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))sym(lib, "ncclSend");
    nccl.recv = (ncclResult_t(*)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))sym(lib, "ncclRecv");
    nccl.group_start = (ncclResult_t(*)(void))sym(lib, "ncclGroupStart");
    nccl.group_end = (ncclResult_t(*)(void))sym(lib, "ncclGroupEnd");
    nccl.error_string = (const char *(*)(ncclResult_t))sym(lib, "ncclGetErrorString");
    nccl.get_version = (ncclResult_t(*)(int *))sym(lib, "ncclGetVersion");
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

int fc_cu_nccl_comm_init(const uint8_t id[128], int world, int rank, int device, fc_cuda_comm **out,
                         fc_err *err)
{
    int rc = FC_OK;
    fc_cu_device_guard dg = {0, 0};
    fc_cuda_comm *c = NULL;
    ncclUniqueId u;
    *out = NULL;
    FC_TRY(need_nccl(err));
    if (world < 1 || rank < 0 || rank >= world)
        return fc_fail(err, FC_ERR_VALUE, "NCCL communicator: rank %d of world %d", rank, world);
    FC_TRY(fc_cu_device_enter(&dg, device, err));
    c = (fc_cuda_comm *)calloc(1, sizeof(*c));
    if (c == NULL) {
        rc = fc_fail(err, FC_ERR_NOMEM, "could not allocate an NCCL communicator record");
        goto error;
    }
    memcpy(&u, id, 128);
    FC_CHECK_NCCL(nccl.comm_init_rank(&c->comm, world, u, rank), err, error);
    c->world = world;
    c->rank = rank;
    c->device = device;
    *out = c;
    c = NULL;
error:
    free(c);
    fc_cu_device_leave(&dg);
    return rc;
}

void fc_cu_nccl_comm_free(fc_cuda_comm *c)
{
    if (c == NULL)
        return;
    if (c->comm != NULL && nccl.loaded) {
        ncclResult_t async = ncclSuccess;
        nccl.comm_get_async_error(c->comm, &async);
        // An errored communicator may never finish a destroy: abort it instead.
        if (async != ncclSuccess && async != ncclInProgress)
            nccl.comm_abort(c->comm);
        else
            nccl.comm_destroy(c->comm);
    }
    free(c);
}

int fc_cu_nccl_all_to_all(fc_cuda_ctx *ctx, fc_cuda_comm *c, int device, void *stream,
                          const uint8_t *send, const int64_t *send_splits, uint8_t *recv,
                          const int64_t *recv_splits, fc_err *err)
{
    int rc = FC_OK, grouped = 0;
    fc_cu_device_guard dg = {0, 0};
    fc_cu_timer *t = NULL;
    const cudaStream_t s = (cudaStream_t)stream;
    ncclResult_t async = ncclSuccess;
    int64_t so = 0, ro = 0;
    FC_TRY(need_nccl(err));
    if (device != c->device)
        return fc_fail(err, FC_ERR_VALUE, "tensors are on cuda:%d but the NCCL communicator was "
                       "made for cuda:%d", device, c->device);
    // A communicator that failed or was aborted (e.g. on a timeout elsewhere) stays failed.
    FC_CHECK_NCCL(nccl.comm_get_async_error(c->comm, &async), err, error);
    if (async != ncclSuccess && async != ncclInProgress) {
        rc = fc_fail(err, FC_ERR_NCCL, "the NCCL communicator is in error: %s (ncclResult %d); "
                     "it was aborted or a peer failed", nccl.error_string(async), (int)async);
        goto error;
    }
    FC_TRY(fc_cu_device_enter(&dg, device, err));
    t = fc_cu_timer_start(ctx, FC_TIME_COMM, s);
    FC_CHECK_NCCL(nccl.group_start(), err, error);
    grouped = 1;
    for (int r = 0; r < c->world; r++) {
        if (send_splits[r] > 0)
            FC_CHECK_NCCL(nccl.send(send + so, (size_t)send_splits[r], ncclUint8, r, c->comm, s), err, error);
        if (recv_splits[r] > 0)
            FC_CHECK_NCCL(nccl.recv(recv + ro, (size_t)recv_splits[r], ncclUint8, r, c->comm, s), err, error);
        so += send_splits[r];
        ro += recv_splits[r];
    }
    grouped = 0;
    FC_CHECK_NCCL(nccl.group_end(), err, error);
    fc_cu_timer_stop(t, s);
    t = NULL;
    ctx->last_stream = s;
    ctx->last_device = device;
    ctx->have_last = 1;
error:
    if (grouped)
        nccl.group_end(); // close the group so the next call starts clean
    if (t != NULL)
        fc_cu_timer_stop(t, s);
    fc_cu_device_leave(&dg);
    return rc;
}
