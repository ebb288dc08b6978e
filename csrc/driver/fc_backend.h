/* fc_backend.h: the one call path from the State to the element work: the driver's entries
 * (fc_drive_*: plan, checks, decisions, counters, timing) and the backend table they call, one
 * for CPU tensors (backend_cpu/: fc_backend_cpu.c's table over its loops) and one for CUDA tensors
 * (kernel launches through the CUDA library, fc_cuda_path.c), picked once per call by the
 * tensors' device. */
#ifndef FC_BACKEND_H
#define FC_BACKEND_H

#include "driver/fc_core.h"

struct fc_cuda_call_s; /* fc_cuda_path.h: the prepared CUDA call (library, stream, workspace) */
typedef struct fc_backend fc_backend;

/* One call's backend: the table and, on CUDA, its prepared call (NULL on CPU). */
typedef struct {
    const fc_backend *b;
    struct fc_cuda_call_s *k;
} fc_exec;

/* What a call is, for the backend to make ready before its element work (prepare): a CPU
 * call's scratch grows inside it; a CUDA call needs device buffers from the State's allocator,
 * which only the glue can call, so they are made while it holds the GIL. */
typedef enum {
    FC_PREP_ENCODE,     /* grad: the unit's gradient */
    FC_PREP_DECODE,     /* grad, recv, out: the decode's tensors */
    FC_PREP_COMPRESS,   /* grad: the one chunk x (compress()) */
    FC_PREP_DECOMPRESS, /* grad: the accumulator acc (decompress()) */
    FC_PREP_FETCH       /* the second round: the fetch buffer the decode that picked made */
} fc_prep_kind;

typedef struct {
    fc_prep_kind kind;
    const fc_buf *grad, *recv, *out;
    int world, rank;
    uint32_t unit, chunk;
} fc_prep;

/* The element work over the driver's plan and decisions. Every entry gets the call's decisions
 * from the driver (the open encode call s->enc: wire method, error feedback, sampling; the
 * plan's receive sizes) and returns what it did; none of them counts a call or a payload. */
struct fc_backend {
    int on_host; /* its time and element statistics are the host's (CUDA keeps them on the
                  * device: events, the workspace's counts and residual norms) */
    /* what the call p needs besides its tensors, made before the element work */
    int (*prepare)(fc_core *s, const fc_exec *x, const fc_prep *p, fc_err *err);
    /* the State's counters as read now: *tot the host's (s->ctr) with what this backend kept
     * apart merged in (device timings join s->ctr for good: they are harvested once), *res_sq
     * the sum of the units' residual norms squared */
    int (*read_counters)(fc_core *s, const fc_exec *x, fc_counters *tot, double *res_sq,
                         fc_err *err);
    /* zeroes what read_counters merges in (the host's s->ctr is the caller's) */
    int (*reset_counters)(fc_core *s, const fc_exec *x, fc_err *err);
    /* every chunk of the open call s->enc into send, back to back; sent[c] per chunk */
    int (*encode)(fc_core *s, const fc_exec *x, const fc_buf *grad, fc_buf *send,
                  fc_buf *residual, fc_sent *sent, fc_err *err);
    /* the per-peer parts of the open call s->enc (fc_drive_encode_part), NULL where a backend
     * has none (CUDA): its scratch and per-peer layout once per call, then one piece of `len`
     * elements of chunk `chunk` into p (cap bytes), what went out in *out */
    int (*encode_parts_open)(fc_core *s, const fc_exec *x, const fc_buf *grad, fc_buf *residual,
                             fc_err *err);
    int (*encode_piece)(fc_core *s, const fc_exec *x, const fc_buf *grad, fc_buf *residual,
                        int chunk, int piece, int64_t len, uint8_t *p, int64_t cap, fc_sent *out,
                        fc_err *err);
    /* sum in rank order of the own chunk and the payloads (recvs: the plan's receive sizes),
     * / W, into out; a unit with a second round only picks (the driver keeps the count) */
    int (*decode)(fc_core *s, const fc_exec *x, const fc_buf *recv, const fc_buf *grad,
                  fc_buf *out, int world, int rank, uint32_t unit, const int64_t *recvs,
                  fc_err *err);
    /* one payload of x (fp32) outside the collective, of x + e with a residual (which it
     * replaces: fc_drive_compress); *written its padded size */
    int (*compress)(fc_core *s, const fc_exec *x, const fc_buf *in, fc_buf *payload,
                    fc_buf *residual, uint32_t unit, uint32_t chunk, int world, int rank, int64_t *written,
                    fc_err *err);
    /* acc (fp32) += alpha * D(payload) */
    int (*decompress)(fc_core *s, const fc_exec *x, const fc_buf *payload, fc_buf *acc,
                      float alpha, uint32_t unit, uint32_t chunk, int world, fc_err *err);
    /* the second round (fc_fetch.c checks, splits and counts) */
    int (*fetch_picks)(const fc_core *s, const fc_exec *x, uint32_t unit, uint32_t *out,
                       int64_t kmax, fc_err *err);
    int (*fetch_values)(fc_core *s, const fc_exec *x, const uint32_t *all_picks, int64_t kmax,
                        const fc_buf *grad, fc_buf *residual, int world, int rank, uint32_t unit,
                        float *send, const int64_t *send_splits, fc_err *err);
    int (*fetch_finish)(fc_core *s, const fc_exec *x, const float *recv, const fc_buf *grad,
                        fc_buf *out, int world, int rank, uint32_t unit, fc_err *err);
    /* an 8-bit residual (fc_res8.h): e (fp32) into packed, and back */
    int (*res8_pack)(fc_core *s, const fc_exec *x, const fc_buf *e, fc_buf *packed, uint32_t key,
                     fc_err *err);
    int (*res8_unpack)(fc_core *s, const fc_exec *x, const fc_buf *packed, fc_buf *e, fc_err *err);
    /* error feedback for a residual no codec reads (fc_ef.h, op FC_EF_*): x += ef_decay * res,
     * or res = x - ref; x and ref fp32, res fp32 or bf16, all of x's length */
    int (*ef)(fc_core *s, const fc_exec *x, int op, fc_buf *xb, const fc_buf *ref, fc_buf *res,
              fc_err *err);
};

extern const fc_backend fc_backend_cpu;
extern const fc_backend fc_backend_cuda; /* fc_cuda_path.c */

/* The driver's entries, one for CPU and CUDA tensors: sizes[c] the bytes of the payload for
 * rank c (0 for none), back to back in send; below the plan's bounds for FC_VARSIZE methods. */
int fc_drive_encode(fc_core *s, const fc_exec *x, const fc_buf *grad, fc_buf *send,
                    fc_buf *residual, int world, int rank, uint32_t unit, int64_t *sizes,
                    fc_err *err);
int fc_drive_decode(fc_core *s, const fc_exec *x, const fc_buf *recv, const fc_buf *grad,
                    fc_buf *out, int world, int rank, uint32_t unit, fc_err *err);
/* One chunk outside any collective (tests, benchmarks, the all-gather half): in (fp32) to one
 * payload, and acc (fp32) += alpha * its decode. With a residual (fp32, in's length; the
 * all-gather half of an all-reduce) the payload is that of g' = in + e under the collective's
 * range and NaN rules, and e is replaced by g' - D(C(g')); its NaN/Inf are not counted. */
int fc_drive_compress(fc_core *s, const fc_exec *x, const fc_buf *in, fc_buf *payload,
                      fc_buf *residual, uint32_t unit, uint32_t chunk, int world, int rank,
                      int64_t *written, fc_err *err);
int fc_drive_decompress(fc_core *s, const fc_exec *x, const fc_buf *payload, fc_buf *acc,
                        float alpha, uint32_t unit, uint32_t chunk, int world, fc_err *err);

/* An 8-bit residual (residual_dtype "int8") is unpacked into an fp32 workspace e before a call
 * that reads or replaces it, and packed again after: packed holds fc_res8_bytes(e's numel)
 * bytes. The pack's rounding draws from (seed, step, unit, salt: FC_RES8_SALT_*). */
int fc_drive_res8_unpack(fc_core *s, const fc_exec *x, const fc_buf *packed, fc_buf *e,
                         fc_err *err);
int fc_drive_res8_pack(fc_core *s, const fc_exec *x, const fc_buf *e, fc_buf *packed,
                       uint32_t unit, uint32_t salt, fc_err *err);

/* Error feedback for a residual that no codec's encode reads (PowerSGD's error e), by the
 * codecs' rules (common/fc_ef.h): FC_EF_ADD makes x (fp32) g' = x + ef_decay * res, its NaN/Inf
 * counted in nonfinite_in ("zero" mode: e there) and overflowing sums saturated; FC_EF_KEEP
 * stores res = x - ref (ref fp32), never NaN/Inf, a bf16 one saturated. res fp32 or bf16 (an
 * 8-bit one is unpacked around the call, as for every call), every buffer of x's length. */
int fc_drive_ef(fc_core *s, const fc_exec *x, int op, fc_buf *xb, const fc_buf *ref, fc_buf *res,
                fc_err *err);

/* The sum of the units' residual norms squared: unit u's from dev[u] for u < n_dev (a backend
 * that keeps them itself), else the host's; a negative one (rounding noise of a sum corrected
 * at the kept coordinates, fc_fetch.c) counts as 0. */
double fc_drive_residual_sq(const fc_core *s, const double *dev, int32_t n_dev);

/* Whether a unit of `numel` elements keeps an error-feedback residual: the driver's decision,
 * read by the caller that must hand the residual in. */
int fc_drive_uses_residual(const fc_core *s, int64_t numel, int world, int dtype);

/* The same encode one payload at a time, for an exchange that overlaps the wire with the codec
 * (a backend with encode_piece: CPU tensors): piece `piece` of chunk `chunk` into its slot of send (*size 0: no payload).
 * Every part comes once: chunks in any order, a chunk's pieces in order. With one piece per
 * chunk the bytes are those fc_drive_encode writes; the call is counted when its last part is
 * done. fc_drive_part_opens: whether a part of this call opens a new one (none is open, or
 * another one is). */
int fc_drive_part_opens(const fc_core *s, uint32_t unit, int world, int rank, int64_t numel);
int fc_drive_encode_part(fc_core *s, const fc_exec *x, const fc_buf *grad, fc_buf *send,
                         fc_buf *residual, int world, int rank, uint32_t unit, int chunk, int piece, int64_t *size,
                         fc_err *err);

#endif
