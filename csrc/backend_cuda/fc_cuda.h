/* fc_cuda.h: the plain-C contract between fsdpcomp._C and the lazily loaded _fsdpcomp_cuda.so:
 * argument structs, the device workspace layout and one function table. _C never links CUDA;
 * it dlopen()s the library and calls fc_cuda_get_api(FC_CUDA_ABI). */
#ifndef FC_CUDA_H
#define FC_CUDA_H

#include <stdint.h>
#include "methods/fc_cfg.h"
#include "common/fc_method_id.h"
#include "common/fc_status.h"
#include "common/fc_wire.h" /* FC_PAYLOAD_*: why a payload is refused */

#ifdef __cplusplus
extern "C" {
#endif

/* 2: compress/decompress, comm marks, NCCL timeout and release, geometry probe; 3: the sparse,
 * aggregate and stateful methods' scratch, second round and copies (and their argument fields);
 * 4: the config fingerprint in the args (wire version 3), the decode's nonfinite mode, the
 * workspace's saturated count; 5: the method's config as its fc_cfg.h struct, not by key name, and
 * every argument struct opens with one call header (fc_cuda_head); 6: compress() takes a residual
 * (the all-gather half of an all-reduce: g' = x + e, e replaced), the header rules are
 * fc_wire.h's fc_header_make/fc_header_verdict; 7: res8, the 8-bit residual's pack and unpack;
 * 8: the encode arguments' ef_decay (g' = g + ef_decay * e), and the `dct` method's kernels;
 * 9: the NCCL transport's entries gone (nccl_*: every collective is torch.distributed's), with
 * FC_ERR_NCCL and FC_PAYLOAD_ABORTED (the fc_status.h and fc_wire.h codes after them renumbered);
 * 10: the one-pass encode's per-call scratch at the end of the workspace (enc_ticket, enc_bad,
 * enc_unit_sq, enc_sum), the fields before them where they were; 11: ef, error feedback for a
 * residual no codec reads (PowerSGD's e: common/fc_ef.h); 12: the parts list of a method that
 * cuts its chunks into spans of other methods (adaptive: fc_cuda_extra.parts, fc_cuda_part) */
#define FC_CUDA_ABI 12
#define FC_CUDA_MAX_WORLD 1024 /* equals FC_MAX_WORLD of the CPU driver */
#define FC_CUDA_MAX_UNITS 4096 /* units whose residual norm the device keeps: error feedback on a
                                * unit past them is refused (fc_cu_driver.cu encode) */

/* A method's parsed config: its struct of csrc/methods/fc_cfg.h (fc_int8_cfg, ...) as the C side parsed
 * it, zeros for `none` below min_numel; the kernels read it as that struct. */
typedef struct {
    int id; /* wire id of the method (fc_method.id) */
    FC_ALIGN8 unsigned char cfg[FC_CFG_MAX];
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
    unsigned long long saturated; /* what the driver's kernels saturate (g + e, residuals, the
                                   * fp32 sum, narrow outputs, cast codes); not the block
                                   * codecs' own (docs/design.md, The CUDA path) */
    double call_sum[3];          /* this call's sampled ||e||^2, ||x||^2, x.e */
    int sample_chunk;            /* this call's sampled chunk, picked on the device after the
                                  * non-finite count: the first sent one that carries no NaN/Inf
                                  * (the CPU's rule), -1 when every sent chunk does */
    unsigned int passed;         /* this decode's payloads brought NaN/Inf (a header flagged, or
                                  * a second round's value): every output's go through; the own
                                  * chunk's pass at their own elements (fc_output_passes), and
                                  * a fused decode keeps its flag in registers instead */
    double unit_sq[FC_CUDA_MAX_UNITS];
    unsigned int bad[FC_CUDA_MAX_WORLD]; /* non-finite count per chunk of this call */
    /* ABI 10: what a one-pass encode (cuda/fc_cu_onepass.cuh) keeps while it runs. Its last block
     * reads it and leaves it zero, so no call clears it first (the decode and the methods that
     * count apart use bad[] above, which a call clears) */
    unsigned int enc_ticket;               /* blocks of this encode done: the last one finishes */
    unsigned int enc_bad[FC_CUDA_MAX_WORLD]; /* 1: chunk c of this encode held NaN/Inf */
    double enc_unit_sq;                    /* this encode's ||e||^2, the unit's unit_sq at its end */
    double enc_sum[FC_CUDA_MAX_WORLD][3];  /* a sampled encode's ||e||^2, ||x||^2, x.e per chunk */
} fc_cuda_ws;

#define FC_CUDA_WS_BYTES ((int64_t)((sizeof(fc_cuda_ws) + 255) / 256 * 256))

/* The sparse methods' own rejections (the CPU decoders' PayloadErrors), kept apart from the
 * codes above: indices out of range, not ascending, or a bitmap with another count; a count or
 * size that does not fit the chunk (thresholdv), or sign bits set past the count; second-round
 * picks out of range or not ascending. */
enum { FC_PAYLOAD_INDEX = 16, FC_PAYLOAD_COUNT = 17, FC_PAYLOAD_PICKS = 18 };

/* What the sparse, aggregate and stateful methods (cuda/fc_cu_sparse*.cu and their method files)
 * get beyond a dense method's arguments. Device memory here comes from torch tensors the State
 * holds (csrc/python/state_cuda.c), never from cudaMalloc. */
typedef struct fc_cuda_sent fc_cuda_sent;

/* ABI 12: one span of a parts method's chunk (adaptive, csrc/methods/m_adaptive.c), as the host
 * walked the unit's parts table: the library runs the rung's own kernels on it (a single payload
 * of the span, cuda/fc_cu_parts.cu) and puts its body in place. Host memory, read during the call
 * only. */
typedef struct {
    fc_cuda_method_cfg m; /* the rung's method and parsed config */
    int chunk;            /* the chunk of the call's geometry it lies in */
    int64_t lo, n;        /* its elements: [lo, lo + n) of that chunk */
    int64_t at, bytes;    /* its body: bytes [at, at + bytes) of the chunk's body, at 8-aligned */
    uint32_t mix;         /* XORed into key0 of its streams (the seed's low word): its own draws */
} fc_cuda_part;

typedef struct {
    void *scratch; /* scratch_bytes() bytes of device scratch for this call, 256-byte aligned */
    int64_t scratch_bytes;
    float *ustate; /* the unit's method state on the device (gradiveq: basis, then covariance) */
    int learn;     /* encode adds this step's covariance into ustate (gradiveq's learn steps) */
    uint8_t *fetch; /* second round: picks and encode's chunk flags, kept from call to call;
                     * NULL when no second round follows (the unit's kmax is 0) */
    int64_t fetch_k; /* second round: the owner's picks (decode), 0 without a second round */
    /* Data-dependent sizes (thresholdv). Encode: payloads back to back in `send` (the headers
     * the driver wrote at the plan's slots are overwritten), and `sent` (host, world entries)
     * filled as soon as the sizes are known: the one wait on the GPU in a hook call, since the
     * sizes must reach the host for the size exchange. Decode: `recv` holds packed_bytes of
     * payloads back to back, and `slot` is 0 (the method checks the headers it walks). */
    fc_cuda_sent *sent;
    int64_t packed_bytes;
    /* ABI 12: a parts method's spans (host memory), in chunk order and, within a chunk, in body
     * order: every sent chunk's for an encode, the own chunk's for a decode, chunk 0's for
     * compress()/decompress(). NULL for every other method. The chunks' body sizes follow from
     * them (the last span's at + bytes), and so do an encode's payload sizes and offsets. */
    const fc_cuda_part *parts;
    int64_t n_parts;
} fc_cuda_extra;

/* The call header: what every call from the driver carries, filled in one place
 * (csrc/backend_cuda/fc_cuda_path.c's call_head) and first in every argument struct below. */
typedef struct {
    fc_cuda_method_cfg m;
    int varsize;  /* the method's body size is data-dependent (FC_VARSIZE): the geometry's are
                   * upper bounds */
    int device;
    void *stream; /* cudaStream_t current at the hook call */
    fc_cuda_geom geo; /* of the unit; decode's own chunk is chunk `rank` */
    const void *grad; /* the unit's gradient (compress(): its input; decompress(): unread) */
    int grad_dtype;   /* fc_dtype; also the wire dtype of `none` */
    uint32_t unit, step;
    uint32_t chunk_base; /* the RNG's chunk id of chunk 0: 0 in the collective; compress()'s and
                          * decompress()'s `chunk`, whose single payload is chunk 0 of a
                          * one-chunk geometry (decode: the own chunk's id is chunk_base + rank) */
    uint64_t seed;
    uint32_t fingerprint; /* fc_core.fingerprint: every header carries it, decode checks it */
    int nonfinite_zero;   /* this rank's NaN/Inf are taken as 0 ("zero" mode) */
    fc_cuda_ws *ws;
    fc_cuda_extra x; /* the sparse, aggregate and stateful methods' part (zero for the others) */
} fc_cuda_head;

typedef struct {
    fc_cuda_head h;
    void *residual; /* NULL: no error feedback */
    int res_dtype;
    uint8_t *send;
    int sample; /* accumulate error statistics from the first sent chunk without NaN/Inf */
    float ef_decay; /* ABI 8: g' = g + ef_decay * e, the float product of the CPU's load_chunk
                     * (the `ef_decay` key as a float; 1: plain error feedback). Read only with a
                     * residual: compress()'s too */
} fc_cuda_encode_args;

typedef struct {
    fc_cuda_head h;
    const uint8_t *recv;
    int64_t slot; /* payload bytes of each received slot */
    void *out;
    int out_dtype;
    int64_t out_numel;
    float alpha; /* decompress() only: out (fp32) += alpha * D(the one payload in recv) */
} fc_cuda_decode_args;

/* What a data-dependent encode wrote for one chunk (0s for a chunk without payload): the host
 * needs the sizes for the size exchange, and counts the layout. */
struct fc_cuda_sent {
    int64_t size; /* payload bytes, padded */
    int64_t value_bytes, meta_bytes, index_bytes, kept;
    int64_t none; /* 1: written as `none`, no larger than the method's own payload (the CPU's
                   * per-payload fallback of a data-dependent method; the header says so) */
};

/* The second round's fetch buffer (device): encode's per-chunk non-finite flags (uint32 each),
 * the sum of squares the round takes out of the residual (a double), then the owner's picks. */
#define FC_CUDA_FETCH_TAKEN (4 * FC_CUDA_MAX_WORLD)
#define FC_CUDA_FETCH_PICKS (FC_CUDA_FETCH_TAKEN + 16)

/* The second round of a two-round method (sketch's second_round, fc_fetch.c on the CPU). The
 * picks of a chunk of n are min(kmax, n): kmax is those of the longest chunk. */
/* Error feedback outside a codec (ABI 11): head (device, stream, workspace, nonfinite mode) */
typedef struct {
    fc_cuda_head h;
    int op;          /* FC_EF_ADD or FC_EF_KEEP (common/fc_ef.h) */
    float *x;        /* n fp32 values: g, made g' (ADD); g' (KEEP) */
    const float *ref; /* KEEP: what the mean delivered of each */
    void *residual;  /* n values of res_dtype (fp32 or bf16) */
    int res_dtype;
    int64_t n;
    float ef_decay;
} fc_cuda_ef_args;

typedef struct {
    fc_cuda_head h;         /* h.x.fetch: the State's fetch buffer (own picks, encode's flags) */
    int64_t kmax;           /* picks per rank in the all-gather */
    void *residual;         /* NULL: no error feedback */
    int res_dtype;
    int64_t n_picks;        /* the own chunk's picks (decode's) */
    uint32_t *picks;        /* fetch_picks: the kmax words of this rank in the all-gather */
    const uint32_t *all_picks; /* fetch_values: world x kmax, every owner's picks */
    float *values;          /* fetch_values: out, back to back per owner; fetch_finish: in */
    void *out;              /* fetch_finish */
    int out_dtype;
    int64_t out_numel;
} fc_cuda_fetch_args;

/* Timings are kept per kind and read lazily through cudaEvent elapsed times. EXTRA is the time
 * of collectives beyond the all-to-all (size exchanges, all-gathers, second rounds): it counts
 * in comm_time_s too. */
enum {
    FC_TIME_COMPRESS = 0,
    FC_TIME_COMM = 1,
    FC_TIME_DECOMPRESS = 2,
    FC_TIME_EXTRA = 3,
    FC_TIME_KINDS = 4
};

/* One row of the geometry probe (tests): what the kernels compute for chunk c. */
enum {
    FC_GEO_START = 0, /* fc_cu_span */
    FC_GEO_LEN = 1,
    FC_GEO_SENT = 2,     /* fc_cu_sent */
    FC_GEO_SEND_OFF = 3, /* fc_cu_send_off, -1 when not sent */
    FC_GEO_BODY = 4,     /* fc_cu_body_bytes, -1 when not sent */
    FC_GEO_RECV_OFF = 5, /* fc_cu_recv_off of rank c, -1 for the own slot kept exact */
    FC_GEO_COLS = 6
};

typedef struct fc_cuda_ctx fc_cuda_ctx; /* per State: events, last stream */

typedef struct {
    int abi;
    const char *build; /* archs, for error messages */
    /* 1 if the method id has kernels */
    int (*has_method)(int id);
    fc_cuda_ctx *(*ctx_new)(void);
    void (*ctx_free)(fc_cuda_ctx *ctx);
    /* the whole encode of a unit: counts, payloads, headers, residuals */
    int (*encode)(fc_cuda_ctx *ctx, const fc_cuda_encode_args *a, fc_err *err);
    /* sum in rank order of the own exact chunk and the payloads, / W, cast, into out */
    int (*decode)(fc_cuda_ctx *ctx, const fc_cuda_decode_args *a, fc_err *err);
    /* copies the workspace to host (waits for the last stream; both NULL: none) and harvests
     * the timings, waiting for them; no Python: the caller releases the GIL around it */
    int (*read_counters)(fc_cuda_ctx *ctx, const fc_cuda_ws *dev_ws, fc_cuda_ws *host_ws,
                         double seconds[FC_TIME_KINDS], fc_err *err);
    /* zeroes the cumulative part of the workspace on the last stream */
    int (*reset_counters)(fc_cuda_ctx *ctx, fc_cuda_ws *dev_ws, fc_err *err);

    /* ---- ABI 2: the driver's additions (kept together) */
    /* one payload of a.geo's chunk 0 (compress()): NaN/Inf passed and flagged, not counted; with
     * a.residual (ABI 6) that of g' = x + ef_decay * e (ABI 8: a.ef_decay) by the collective's
     * rules, e replaced, the saturated sums counted; no sample; *written is the payload's padded
     * size (read back from its header for a method whose size is data-dependent: that waits for
     * the stream) */
    int (*compress)(fc_cuda_ctx *ctx, const fc_cuda_encode_args *a, int64_t *written, fc_err *err);
    /* out (fp32, a.out_numel elements) += a.alpha * D(the one payload in a.recv) */
    int (*decompress)(fc_cuda_ctx *ctx, const fc_cuda_decode_args *a, fc_err *err);
    /* an event on `stream` before (end 0) or after (end 1) a collective issued elsewhere
     * (torch.distributed), timed as `kind` (FC_TIME_COMM or FC_TIME_EXTRA) */
    int (*comm_mark)(fc_cuda_ctx *ctx, int device, void *stream, int end, int kind, fc_err *err);
    /* host only, no CUDA call (tests): rows[c * FC_GEO_COLS + FC_GEO_*] for every chunk c as
     * the kernels compute it, `slot` the receive slot size */
    void (*probe_geometry)(const fc_cuda_geom *geo, int64_t slot, int64_t *rows);

    /* ---- ABI 3: the sparse, aggregate and stateful methods (cuda/fc_cu_sparse_api.cu) */
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

    /* ---- ABI 7: the 8-bit residual (csrc/common/fc_res8.h), queued on `stream` of `device`: pack 1
     * rounds e (n fp32 values) into packed with the draws of `key`; pack 0 unpacks packed into e */
    int (*res8)(fc_cuda_ctx *ctx, int device, void *stream, int pack, float *e, int64_t n,
                uint8_t *packed, uint32_t key, fc_err *err);

    /* ---- ABI 11: common/fc_ef.h's op on a.x (fp32, a.n), queued on the head's stream: FC_EF_ADD
     * x += ef_decay * residual, FC_EF_KEEP residual = x - ref; counted in the head's workspace */
    int (*ef)(fc_cuda_ctx *ctx, const fc_cuda_ef_args *a, fc_err *err);
} fc_cuda_api;

typedef const fc_cuda_api *(*fc_cuda_get_api_fn)(int abi);

#ifdef __cplusplus
}
#endif

#endif
