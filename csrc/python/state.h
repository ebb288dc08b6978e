/* state.h: what the files of fsdpcomp._C's State type share: the object and module state, the
 * argument checks every call runs before it touches state, and the names the tables refer to. */
#ifndef FC_STATE_H
#define FC_STATE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "driver/fc_core.h"
#include "backend_cuda/fc_cuda_loader.h"
#include "backend_cuda/fc_cuda_path.h"
#include "python/fc_pytype.h"
#include "python/fc_tensor.h"

typedef struct {
    PyTypeObject *state_type;
    PyObject *payload_error; /* ValueError subclass: malformed wire data */
    PyObject *cuda_error;    /* RuntimeError subclass */
} module_state;

/* The residuals a unit can have, each in its own slot of the State (state_residual.c): the
 * reduce-scatter's error feedback (the codec's, per unit), the all-gather half's (an all-reduce's
 * second half, _shard_gather.py: its own shard's), PowerSGD's error e (_powersgd_factors.py).
 * One store, one dtype rule, one byte count and one checkpoint field for all three. */
enum { FC_SLOT_SCATTER, FC_SLOT_GATHER, FC_SLOT_FACTORS, FC_SLOTS };
extern const char *const fc_slot_names[FC_SLOTS]; /* "scatter", "gather", "factors" */
/* A slot named by a Python str: 0, or -1 with ValueError listing the names. */
int fc_slot_parse(PyObject *name, int *slot);

typedef struct {
    PyObject_HEAD
    fc_core core;
    PyObject *allocator; /* callable(numel, dtype_name, like) -> zeroed tensor */
    PyObject *residuals[FC_SLOTS]; /* per slot a list, one entry per unit: a tensor or None */
    /* per (unit, slot), at unit * FC_SLOTS + slot (n_restored units): 1 while the residual is a
     * checkpoint's, not yet moved into the State's own memory on the device of its first call */
    uint8_t *restored;
    Py_ssize_t n_restored;
    PyObject *config;    /* dict: the resolved config, defaults included */
    int busy;            /* set for the whole of a method call (fc_state_enter) */
    PyObject *cuda_ws;   /* the device workspace (a torch tensor), once a CUDA tensor came */
    fc_cuda_ctx *cuda_ctx;
    PyObject *cuda_extra; /* dict of device tensors for the sparse/stateful methods (state_cuda.c) */
    int emulate_cuda;     /* tests only: CPU tensors take the CUDA path (tests/cuda_emu's library) */
    fc_cuda_host cuda_host; /* what the CUDA backend asks of the State (its records freed here) */
    PyObject *res_ws;     /* a device's 8-bit residual's fp32 workspace, reused by every call (state_residual.c) */
    int64_t res_ws_peak;  /* bytes of the largest such workspace: counted in scratch_bytes */
} StateObject;

/* Whether a tensor of a call goes through the CUDA library: a CUDA tensor, or (tests) a CPU one
 * of a State that emulates CUDA. */
static inline int fc_state_on_cuda(const StateObject *self, const fc_view *v)
{
    return v->device_type == kDLCUDA || (self->emulate_cuda && v->device_type == kDLCPU);
}

static inline module_state *state_of_type(PyTypeObject *tp)
{
    return (module_state *)PyType_GetModuleState(tp);
}

static inline module_state *state_of_module(PyObject *mod)
{
    return (module_state *)PyModule_GetState(mod);
}

/* The one translator from a C status to a Python exception (module.c). Returns NULL for
 * `return`. */
PyObject *fc_raise_err(module_state *st, const fc_err *err);
#define STATE_ERR(self, err) fc_raise_err(state_of_type(Py_TYPE(self)), (err))

/* A docstring that a table in another file names: PyDoc_STRVAR without the `static`. */
#define FC_DOCSTRING(name, str) const char name[] = PyDoc_STR(str)

/* ---- state_args.c: the checks and the one exit the calls share */

/* 1 when the State was initialised; else 0, exception set. */
int fc_state_ready(StateObject *self);
/* One State, one thread: marks it busy (0 with RuntimeError when it already is). Every method
 * of the table enters before it does anything that can release the GIL (a DLPack export, the
 * residual allocator, a stream query, the C work) and leaves on its way out (state_type.c). */
int fc_state_enter(StateObject *self);
int fc_check_world(int world, int rank, fc_err *err);
/* An element count from the caller: in [lo, FC_MAX_NUMEL], named `arg` when it is not. */
int fc_check_numel(long long n, long long lo, const char *arg, fc_err *err);
/* For the entry points that run on CPU tensors only. */
int fc_check_cpu(const fc_view *v, const char *arg, fc_err *err);
/* Every tensor of a call lives where the gradient does. */
int fc_check_same_device(const fc_view *v, const fc_view *grad, const char *arg, fc_err *err);
int fc_check_aligned(const fc_view *v, const char *arg, fc_err *err);
/* unit is one begin() gave out, and grad has its number of elements. */
int fc_state_check_unit(StateObject *self, long long unit, int64_t numel, fc_err *err);
/* A call that writes `out` from received data and grad (decode, decode_part, finish): its
 * arguments (data, grad, out, world, rank, unit[, src, piece]), their views and its status. */
typedef struct {
    PyObject *data, *grad, *out; /* borrowed from the arguments */
    int world, rank, src, piece;
    long long unit;
    fc_view v, g, o; /* v: data's, viewed by the caller's own rule */
    fc_err err;
} fc_out_call;
/* Parses args by fmt ("OOOiiL:name"; decode_part's "OOOiiLii:name") into c, views grad and out
 * (float tensors, out writable) and checks world, rank and unit. -1: the arguments are not
 * those (a Python error is set, nothing to release); else the status, c->err saying why. */
int fc_state_out_call(StateObject *self, PyObject *args, const char *fmt, fc_out_call *c);
/* Its one exit: the views released on success and on error alike; None or the error. */
PyObject *fc_state_out_done(StateObject *self, int rc, fc_out_call *c);
/* The one exit of a call that borrowed tensor views: released on success and on error alike
 * (c may be NULL); rc says which, and err why. */
PyObject *fc_state_views_done(StateObject *self, int rc, const fc_err *err, fc_view *a, fc_view *b,
                              fc_view *c);
/* A tuple of `world` ints. New ref. */
PyObject *fc_sizes_tuple(const int64_t *sizes, int world);

/* ---- state_type.c: lifecycle, attributes, the method table */

extern PyType_Spec fc_state_spec;

/* ---- state_residual.c: the residuals the State owns, and an 8-bit one's unpacked workspace */

/* A unit's residual for the length of one call: the tensor kept (res, view r) and what the
 * backend reads and replaces (buf): r's buffer, or for an 8-bit residual an fp32 workspace
 * (ws, view w) unpacked from it before the work and packed back after it. */
typedef struct {
    PyObject *res, *ws;
    fc_view r, w;
    fc_buf *buf;
    int packed;
    int in_place; /* packed, and read and packed in place by the backend: no workspace */
} fc_res_hold;

/* The dtype a State keeps residuals in (FC_F32, FC_BF16, or FC_U8: packed, fc_res8.h). */
int fc_state_residual_dtype(const StateObject *self);
/* The residual tensor of (unit, slot), of g's numel values, allocated through the allocator on
 * first use (a checkpoint's, restored: moved into a tensor from the allocator on grad's device,
 * once), checked against grad's device: h->res and h->r (and h->buf = &h->r.buf). 0, or a
 * status with err set. */
int fc_state_residual(StateObject *self, uint32_t unit, int slot, PyObject *grad, const fc_view *g,
                      fc_res_hold *h, fc_err *err);
/* A caller's residual (compress()): fp32 of x's numel, or packed uint8 of fc_res8_bytes(numel). */
int fc_res_adopt(PyObject *res, const fc_view *x, fc_res_hold *h, fc_err *err);
/* Whether x's backend reads and packs h's 8-bit residual where it lies (the CPU: fc_res8.c,
 * no unit-sized copy; a device's is unpacked into the workspace around the call): then sets the
 * core's rounding key for (unit, salt), and fc_res_workspace/unpack/pack do nothing. */
int fc_res_in_place(StateObject *self, const fc_exec *x, fc_res_hold *h, uint32_t unit,
                    uint32_t salt);
/* For an 8-bit residual, the fp32 workspace of its numel (the State's one, made through the
 * allocator when it first needs it or grows): h->buf then points at it. Holds the GIL; fc_res_unpack fills it. */
int fc_res_workspace(StateObject *self, PyObject *grad, int64_t numel, fc_res_hold *h,
                     fc_err *err);
/* Without the GIL: unpack before the work, pack after it; no-ops for an fp32/bf16 residual. */
int fc_res_unpack(StateObject *self, const fc_exec *x, fc_res_hold *h, fc_err *err);
int fc_res_pack(StateObject *self, const fc_exec *x, fc_res_hold *h, uint32_t unit, uint32_t salt,
                fc_err *err);
void fc_res_release(fc_res_hold *h);
/* The calls for the residuals Python works on (the all-gather half's, PowerSGD's error): the
 * live tensor of a slot, sizes, pack, unpack. */
PyObject *fc_state_residual_of(StateObject *self, PyObject *args, PyObject *kwds);
PyObject *fc_state_residual_numel(StateObject *self, PyObject *arg);
PyObject *fc_state_residual_values(StateObject *self, PyObject *arg);
PyObject *fc_state_pack_residual(StateObject *self, PyObject *args, PyObject *kwds);
PyObject *fc_state_unpack_residual(StateObject *self, PyObject *args);
extern const char fc_state_residual_of_doc[], fc_state_residual_numel_doc[], fc_state_residual_values_doc[],
    fc_state_pack_residual_doc[], fc_state_unpack_residual_doc[];

/* ---- state_ef.c: error feedback for a residual no codec reads (PowerSGD's e) */
PyObject *fc_state_ef_add(StateObject *self, PyObject *args, PyObject *kwds);
PyObject *fc_state_ef_keep(StateObject *self, PyObject *args, PyObject *kwds);
extern const char fc_state_ef_add_doc[], fc_state_ef_keep_doc[];

/* ---- state_exec.c, state_cuda.c: a call's backend, and what a call on CUDA tensors prepares */

/* The backend of a call on the tensor `like` (its view v), picked once by its device: the
 * CPU's, or the CUDA library's with the call prepared into *k (x->k = k); then what the call p
 * needs made ready by that backend (p NULL: nothing beyond the tensors). */
int fc_state_exec(StateObject *self, PyObject *like, const fc_view *v, const fc_prep *p,
                  fc_cuda_call *k, fc_exec *x, fc_err *err);
/* The backend that holds the State's counters beside the host's: the CUDA library's once the
 * State did work on a device (kernels or comm marks), else the CPU's. */
int fc_state_exec_counters(StateObject *self, fc_cuda_call *k, fc_exec *x, fc_err *err);
/* fc_cuda_host.buffer: a device tensor from the allocator, kept in self->cuda_extra. */
int fc_state_cuda_buffer(void *owner, void *like, const char *name, uint32_t unit,
                         int64_t bytes, void **ptr, int64_t *have, int *fresh, fc_err *err);
/* The unit's covariance summed on the device this step, into the host state (sync_vector). */
int fc_state_cuda_sync_pull(StateObject *self, uint32_t unit, fc_err *err);
/* After sync_apply (the host has the new state) and restore (every unit's may be new): the
 * device copies are dropped, and remade from the host's at their next call. */
void fc_state_cuda_sync_done(StateObject *self, uint32_t unit);
void fc_state_cuda_forget_units(StateObject *self);
PyObject *fc_state_emulate_cuda(StateObject *self, PyObject *arg);
extern const char fc_state_emulate_cuda_doc[];

/* ---- the methods, each defined (with its docstring) in the file of its job */

/* state_units.c: units and steps, the unit-state sync */
PyObject *fc_state_begin(StateObject *self, PyObject *args, PyObject *kwargs);
PyObject *fc_state_end_step(StateObject *self, PyObject *ignored);
PyObject *fc_state_sync_vector(StateObject *self, PyObject *arg);
PyObject *fc_state_sync_apply(StateObject *self, PyObject *args);
extern const char fc_state_begin_doc[], fc_state_end_step_doc[], fc_state_sync_vector_doc[],
    fc_state_sync_apply_doc[];

/* state_codec.c: the collective, one peer at a time */
PyObject *fc_state_plan(StateObject *self, PyObject *args);
PyObject *fc_state_encode(StateObject *self, PyObject *args);
PyObject *fc_state_decode(StateObject *self, PyObject *args);
PyObject *fc_state_per_peer_ok(StateObject *self, PyObject *args);
PyObject *fc_state_pieces(StateObject *self, PyObject *args);
PyObject *fc_state_encode_part(StateObject *self, PyObject *args);
PyObject *fc_state_decode_part(StateObject *self, PyObject *args);
extern const char fc_state_plan_doc[], fc_state_encode_doc[], fc_state_decode_doc[],
    fc_state_per_peer_ok_doc[], fc_state_pieces_doc[], fc_state_encode_part_doc[],
    fc_state_decode_part_doc[];

/* state_chunk.c: one chunk outside the collective */
PyObject *fc_state_payload_bytes(StateObject *self, PyObject *args, PyObject *kwds);
PyObject *fc_state_layout(StateObject *self, PyObject *arg);
PyObject *fc_state_compress(StateObject *self, PyObject *args, PyObject *kwds);
PyObject *fc_state_decompress(StateObject *self, PyObject *args, PyObject *kwds);
extern const char fc_state_payload_bytes_doc[], fc_state_layout_doc[], fc_state_compress_doc[],
    fc_state_decompress_doc[];

/* state_fetch.c: the second round */
PyObject *fc_state_fetch_kmax(StateObject *self, PyObject *args);
PyObject *fc_state_fetch_picks(StateObject *self, PyObject *args);
PyObject *fc_state_fetch(StateObject *self, PyObject *args);
PyObject *fc_state_finish(StateObject *self, PyObject *args);
extern const char fc_state_fetch_kmax_doc[], fc_state_fetch_picks_doc[], fc_state_fetch_doc[],
    fc_state_finish_doc[];

/* state_counters.c */
PyObject *fc_state_counters(StateObject *self, PyObject *ignored);
PyObject *fc_state_reset_counters(StateObject *self, PyObject *ignored);
PyObject *fc_state_add_comm(StateObject *self, PyObject *args, PyObject *kwds);
PyObject *fc_state_comm_mark(StateObject *self, PyObject *args);
PyObject *fc_state_cuda_geometry(StateObject *self, PyObject *args);
PyObject *fc_state_add_param_gather(StateObject *self, PyObject *args, PyObject *kwds);
extern const char fc_state_counters_doc[], fc_state_reset_counters_doc[], fc_state_add_comm_doc[],
    fc_state_comm_mark_doc[], fc_state_cuda_geometry_doc[], fc_state_add_param_gather_doc[];

/* state_parts.c: adaptive's parts tables */
PyObject *fc_state_set_parts(StateObject *self, PyObject *args);
extern const char fc_state_set_parts_doc[];

/* state_checkpoint.c */
PyObject *fc_state_units(StateObject *self, PyObject *ignored);
PyObject *fc_state_residuals(StateObject *self, PyObject *args);
PyObject *fc_state_unit_states(StateObject *self, PyObject *ignored);
PyObject *fc_state_restore(StateObject *self, PyObject *args);
PyObject *fc_state_check_residual(StateObject *self, PyObject *args, PyObject *kwds);
extern const char fc_state_units_doc[], fc_state_residuals_doc[], fc_state_unit_states_doc[],
    fc_state_restore_doc[], fc_state_check_residual_doc[];

#endif
