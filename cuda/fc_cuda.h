/* fc_cuda.h: the plain-C contract between fsdpcomp._C and the lazily loaded _fsdpcomp_cuda.so:
 * argument structs, the device workspace layout and one function table. _C never links CUDA;
 * it dlopen()s the library and calls fc_cuda_get_api(FC_CUDA_ABI). */
#ifndef FC_CUDA_H
#define FC_CUDA_H

#include <stdint.h>
#include "fc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FC_CUDA_ABI 1
#define FC_CUDA_MAX_WORLD 1024 /* equals FC_MAX_WORLD of the CPU driver */
#define FC_CUDA_MAX_UNITS 4096 /* units whose residual norm the device keeps */
#define FC_CUDA_MAX_CFG 16

/* A method's parsed config as (name, value) pairs: the CUDA side looks keys up by name, so it
 * shares no struct layout with the C method files. */
typedef struct {
    const char *name;
    double value;
} fc_cuda_kv;

typedef struct {
    int id; /* wire id of the method (fc_method.id) */
    int n_cfg;
    fc_cuda_kv cfg[FC_CUDA_MAX_CFG];
} fc_cuda_method_cfg;

/* Chunk geometry of one unit: chunk c is [c*per, ...) and only the last non-empty chunk may be
 * shorter, so every payload offset follows from these few numbers (no table on the device). */
typedef struct {
    int64_t numel, per;
    int world, rank, skip_own;
    int64_t pay_full, body_full; /* payload (padded) and body bytes of a chunk of `per` */
    int64_t pay_last, body_last; /* the same for the last non-empty chunk */
} fc_cuda_geom;

/* Counters and per-call scratch the kernels update on the device; it lives in a zeroed torch
 * tensor of FC_CUDA_WS_BYTES owned by the state, and is read only when counters are read. */
typedef struct {
    unsigned long long nonfinite_in, nonfinite_out;
    double err_sq, ref_sq, cos_sum;
    unsigned long long samples;
    unsigned int payload_error;  /* first malformed payload seen: a FC_PAYLOAD_* code, 0 none */
    int payload_error_rank;
    unsigned int payload_error_unit, payload_error_step;
    double call_sum[3];          /* this call's sampled ||e||^2, ||x||^2, x.e */
    double unit_sq[FC_CUDA_MAX_UNITS];
    unsigned int bad[FC_CUDA_MAX_WORLD]; /* non-finite count per chunk of this call */
} fc_cuda_ws;

#define FC_CUDA_WS_BYTES ((int64_t)((sizeof(fc_cuda_ws) + 255) / 256 * 256))

enum {
    FC_PAYLOAD_MAGIC = 1,
    FC_PAYLOAD_VERSION = 2,
    FC_PAYLOAD_METHOD = 3,
    FC_PAYLOAD_DTYPE = 4,
    FC_PAYLOAD_ORDER = 5, /* unit or step differ */
    FC_PAYLOAD_NUMEL = 6,
    FC_PAYLOAD_BODY = 7,
    FC_PAYLOAD_CODES = 8 /* a code the encoder cannot write (the CPU decoder's PayloadError) */
};

/* The sparse methods' own rejections (the CPU decoders' PayloadErrors), kept apart from the
 * codes above: indices out of range, not ascending, or a bitmap with another count; a count or
 * size that does not fit the chunk (thresholdv), or sign bits set past the count; second-round
 * picks out of range or not ascending. */
enum { FC_PAYLOAD_INDEX = 16, FC_PAYLOAD_COUNT = 17, FC_PAYLOAD_PICKS = 18 };

/* What the sparse, aggregate and stateful methods (cuda/fc_cu_sparse*.cu and their method files)
 * get beyond a dense method's arguments. Device memory here comes from torch tensors the State
 * holds (csrc/state_cuda.c), never from cudaMalloc. */
typedef struct fc_cuda_sent fc_cuda_sent;

typedef struct {
    void *scratch; /* scratch_bytes() bytes of device scratch for this call, 256-byte aligned */
    int64_t scratch_bytes;
    float *ustate; /* the unit's method state on the device (gradiveq: basis, then covariance) */
    int learn;     /* encode adds this step's covariance into ustate (gradiveq's learn steps) */
    uint8_t *fetch; /* second round: picks and encode's chunk flags, kept from call to call */
    int64_t fetch_k; /* second round: the owner's picks (decode), 0 without a second round */
    /* Data-dependent sizes (thresholdv). Encode: payloads back to back in `send` (the headers
     * the driver wrote at the plan's slots are overwritten), and `sent` (host, world entries)
     * filled as soon as the sizes are known: the one wait on the GPU in a hook call, since the
     * sizes must reach the host for the size exchange. Decode: `recv` holds packed_bytes of
     * payloads back to back, and `slot` is 0 (the method checks the headers it walks). */
    fc_cuda_sent *sent;
    int64_t packed_bytes;
} fc_cuda_extra;

typedef struct {
    fc_cuda_method_cfg m;
    int device;
    void *stream; /* cudaStream_t current at the hook call */
    fc_cuda_geom geo;
    const void *grad;
    int grad_dtype; /* fc_dtype; also the wire dtype of `none` */
    void *residual; /* NULL: no error feedback */
    int res_dtype;
    uint8_t *send;
    uint32_t unit, step;
    uint64_t seed;
    int nonfinite_zero;
    int sample; /* accumulate error statistics from the first sent chunk */
    fc_cuda_ws *ws;
    fc_cuda_extra x; /* the sparse, aggregate and stateful methods' part (zero for the others) */
} fc_cuda_encode_args;

typedef struct {
    fc_cuda_method_cfg m;
    int device;
    void *stream;
    fc_cuda_geom geo; /* of the unit; the own chunk is chunk `rank` */
    const uint8_t *recv;
    int64_t slot; /* payload bytes of each received slot */
    const void *grad;
    int grad_dtype;
    void *out;
    int out_dtype;
    int64_t out_numel;
    uint32_t unit, step;
    uint64_t seed;
    fc_cuda_ws *ws;
    fc_cuda_extra x; /* as in fc_cuda_encode_args */
} fc_cuda_decode_args;

/* What a data-dependent encode wrote for one chunk (0s for a chunk without payload): the host
 * needs the sizes for the size exchange, and counts the layout. */
struct fc_cuda_sent {
    int64_t size; /* payload bytes, padded */
    int64_t value_bytes, meta_bytes, index_bytes, kept;
};

/* The second round's fetch buffer (device): encode's per-chunk non-finite flags (uint32 each),
 * the sum of squares the round takes out of the residual (a double), then the owner's picks. */
#define FC_CUDA_FETCH_TAKEN (4 * FC_CUDA_MAX_WORLD)
#define FC_CUDA_FETCH_PICKS (FC_CUDA_FETCH_TAKEN + 16)

/* The second round of a two-round method (sketch's second_round, fc_fetch.c on the CPU). The
 * picks of a chunk of n are min(kmax, n): kmax is those of the longest chunk. */
typedef struct {
    fc_cuda_method_cfg m;
    int device;
    void *stream;
    fc_cuda_geom geo;       /* of the unit */
    int64_t kmax;           /* picks per rank in the all-gather */
    const void *grad;
    int grad_dtype;
    void *residual;         /* NULL: no error feedback */
    int res_dtype;
    int nonfinite_zero;
    uint8_t *fetch;         /* the State's fetch buffer: own picks, encode's chunk flags */
    int64_t n_picks;        /* the own chunk's picks (decode's) */
    uint32_t *picks;        /* fetch_picks: the kmax words of this rank in the all-gather */
    const uint32_t *all_picks; /* fetch_values: world x kmax, every owner's picks */
    float *values;          /* fetch_values: out, back to back per owner; fetch_finish: in */
    void *out;              /* fetch_finish */
    int out_dtype;
    int64_t out_numel;
    uint32_t unit;
    fc_cuda_ws *ws;
} fc_cuda_fetch_args;

/* Timings are kept per kind and read lazily through cudaEvent elapsed times. */
enum { FC_TIME_COMPRESS = 0, FC_TIME_COMM = 1, FC_TIME_DECOMPRESS = 2, FC_TIME_KINDS = 3 };

typedef struct fc_cuda_ctx fc_cuda_ctx; /* per State: events, last stream */
typedef struct fc_cuda_comm fc_cuda_comm; /* one NCCL communicator */

typedef struct {
    int abi;
    const char *build; /* archs and NCCL header origin, for error messages */
    /* 1 if the method id has kernels */
    int (*has_method)(int id);
    fc_cuda_ctx *(*ctx_new)(void);
    void (*ctx_free)(fc_cuda_ctx *ctx);
    /* the whole encode of a unit: counts, payloads, headers, residuals */
    int (*encode)(fc_cuda_ctx *ctx, const fc_cuda_encode_args *a, fc_err *err);
    /* sum in rank order of the own exact chunk and the payloads, / W, cast, into out */
    int (*decode)(fc_cuda_ctx *ctx, const fc_cuda_decode_args *a, fc_err *err);
    /* copies the workspace to host (waits for the last stream) and harvests finished timings */
    int (*read_counters)(fc_cuda_ctx *ctx, const fc_cuda_ws *dev_ws, fc_cuda_ws *host_ws,
                         double seconds[FC_TIME_KINDS], fc_err *err);
    /* zeroes the cumulative part of the workspace on the last stream */
    int (*reset_counters)(fc_cuda_ctx *ctx, fc_cuda_ws *dev_ws, fc_err *err);
    /* NCCL: 128-byte unique id, communicator, grouped send/recv on the given stream */
    int (*nccl_unique_id)(uint8_t id[128], fc_err *err);
    int (*nccl_comm_init)(const uint8_t id[128], int world, int rank, int device,
                          fc_cuda_comm **out, fc_err *err);
    void (*nccl_comm_free)(fc_cuda_comm *comm);
    int (*nccl_all_to_all)(fc_cuda_ctx *ctx, fc_cuda_comm *comm, int device, void *stream,
                           const uint8_t *send, const int64_t *send_splits, uint8_t *recv,
                           const int64_t *recv_splits, fc_err *err);

    /* ---- the sparse, aggregate and stateful methods (cuda/fc_cu_sparse_api.cu) ---- */
    /* Device scratch (a.x.scratch) an encode (dec NULL) or a decode (enc NULL) of these
     * arguments needs; 0 for a method that needs none. */
    int (*scratch_bytes)(const fc_cuda_encode_args *enc, const fc_cuda_decode_args *dec,
                         int64_t *bytes, fc_err *err);
    /* The second round: the own picks into a->picks (padded to kmax with 0xFFFFFFFF); this
     * rank's exact values at every owner's picks into a->values (taken out of the residual);
     * the senders' values summed with the own chunk into a->out. */
    int (*fetch_picks)(fc_cuda_ctx *ctx, const fc_cuda_fetch_args *a, fc_err *err);
    int (*fetch_values)(fc_cuda_ctx *ctx, const fc_cuda_fetch_args *a, fc_err *err);
    int (*fetch_finish)(fc_cuda_ctx *ctx, const fc_cuda_fetch_args *a, fc_err *err);
    /* bytes between host and device memory on `stream` of `device` (stream NULL: the
     * context's last one): to_host = 1 copies device -> host and waits; 0 copies host ->
     * device, queued (the host memory may be reused on return); 2 copies device -> device. */
    int (*copy)(fc_cuda_ctx *ctx, int device, void *stream, void *dst, const void *src,
                int64_t bytes, int to_host, fc_err *err);
} fc_cuda_api;

typedef const fc_cuda_api *(*fc_cuda_get_api_fn)(int abi);

#ifdef __cplusplus
}
#endif

#endif
