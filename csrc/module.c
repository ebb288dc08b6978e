/* module.c: the CPython face of fsdpcomp._C: the State type (one compressor, its residuals
 * and counters), the method table queries, and the one translator from fc_err to exceptions. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

#include "fc_config.h"
#include "fc_core.h"
#include "fc_cuda_path.h"
#include "fc_fetch.h"
#include "fc_simd.h"
#include "fc_tensor.h"
#include "fc_wire.h"

typedef struct {
    PyTypeObject *state_type;
    PyObject *payload_error; /* ValueError subclass: malformed wire data */
    PyObject *cuda_error;    /* RuntimeError subclass */
    PyObject *nccl_error;    /* RuntimeError subclass */
} module_state;

typedef struct {
    PyObject_HEAD
    fc_core core;
    PyObject *allocator; /* callable(numel, dtype_name, like) -> zeroed tensor */
    PyObject *residuals; /* list, one entry per unit: a tensor or None */
    PyObject *config;    /* dict: the resolved config, defaults included */
    int busy;            /* set while a call runs without the GIL */
    PyObject *cuda_ws;   /* the device workspace (a torch tensor), once a CUDA tensor came */
    fc_cuda_ctx *cuda_ctx;
} StateObject;

static module_state *state_of_type(PyTypeObject *tp)
{
    return (module_state *)PyType_GetModuleState(tp);
}

/* The one translator from a C status to a Python exception. Returns NULL for `return`. */
static PyObject *raise_err(module_state *st, const fc_err *err)
{
    PyObject *exc;
    switch (err->code) {
    case FC_ERR_TYPE:
        exc = PyExc_TypeError;
        break;
    case FC_ERR_NOMEM:
        exc = PyExc_MemoryError;
        break;
    case FC_ERR_PAYLOAD:
        exc = st->payload_error;
        break;
    case FC_ERR_CUDA:
        exc = st->cuda_error;
        break;
    case FC_ERR_NCCL:
        exc = st->nccl_error;
        break;
    case FC_ERR_STATE:
        exc = PyExc_RuntimeError;
        break;
    case FC_ERR_PYTHON:
        return NULL; /* already set */
    default:
        exc = PyExc_ValueError;
        break;
    }
    PyErr_SetString(exc, err->msg[0] ? err->msg : "fsdpcomp: unknown error");
    return NULL;
}

#define STATE_ERR(self, err) raise_err(state_of_type(Py_TYPE(self)), (err))

/* ---------------------------------------------------------------- State: lifetime */

static int State_init(StateObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"method", "config", "allocator", NULL};
    const char *name;
    PyObject *config = Py_None, *allocator = Py_None; /* borrowed */
    fc_err err = {0};
    fc_common common;
    _Alignas(64) unsigned char cfg[FC_CFG_MAX];
    PyObject *resolved = NULL;

    if (self->core.method != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "State is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "s|OO:State", kwlist, &name, &config, &allocator))
        return -1;
    const fc_method *m = fc_method_by_name(name);
    if (m == NULL) {
        PyObject *names = PyUnicode_FromString("");
        for (int i = 0; names != NULL && i < fc_method_count(); i++) {
            PyObject *joined = PyUnicode_FromFormat("%U%s'%s'", names, i ? ", " : "",
                                                    fc_method_at(i)->name);
            Py_SETREF(names, joined);
        }
        if (names != NULL)
            PyErr_Format(PyExc_ValueError, "unknown compression method '%s'; valid methods: %U",
                         name, names);
        Py_XDECREF(names);
        return -1;
    }
    if (allocator != Py_None && !PyCallable_Check(allocator)) {
        PyErr_Format(PyExc_TypeError, "allocator must be callable or None, got %s",
                     Py_TYPE(allocator)->tp_name);
        return -1;
    }
    if (fc_config_parse(m, config, &common, cfg, &err) != FC_OK) {
        STATE_ERR(self, &err);
        return -1;
    }
    resolved = PyDict_New();
    if (resolved == NULL || fc_config_to_dict(m->keys, cfg, resolved) < 0 ||
        fc_config_to_dict(fc_common_keys, &common, resolved) < 0)
        goto error;
    self->residuals = PyList_New(0);
    if (self->residuals == NULL)
        goto error;
    fc_core_init(&self->core, m, &common, cfg);
    Py_INCREF(allocator);
    self->allocator = allocator;
    self->config = resolved;
    return 0;
error:
    Py_XDECREF(resolved);
    return -1;
}

static int State_traverse(StateObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->allocator);
    Py_VISIT(self->residuals);
    Py_VISIT(self->config);
    Py_VISIT(self->cuda_ws);
    return 0;
}

static int State_clear(StateObject *self)
{
    Py_CLEAR(self->allocator);
    Py_CLEAR(self->residuals);
    Py_CLEAR(self->config);
    Py_CLEAR(self->cuda_ws);
    return 0;
}

static void State_dealloc(StateObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    State_clear(self);
    fc_core_free(&self->core);
    if (self->cuda_ctx != NULL && fc_cuda_api_loaded() != NULL)
        fc_cuda_api_loaded()->ctx_free(self->cuda_ctx);
    self->cuda_ctx = NULL;
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* ---------------------------------------------------------------- helpers */

static int ready(StateObject *self)
{
    if (self->core.method == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "State.__init__ was not called");
        return 0;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "State is in use by another thread: one state serves "
                        "one training loop");
        return 0;
    }
    return 1;
}

static int check_world(int world, int rank, fc_err *err)
{
    if (world < 1 || world > FC_MAX_WORLD)
        return fc_fail(err, FC_ERR_VALUE, "world must be in [1, %d], got %d", FC_MAX_WORLD, world);
    if (rank < 0 || rank >= world)
        return fc_fail(err, FC_ERR_VALUE, "rank must be in [0, %d), got %d", world, rank);
    return FC_OK;
}

static int check_cpu(const fc_view *v, const char *arg, fc_err *err)
{
    if (v->device_type != kDLCPU)
        return fc_fail(err, FC_ERR_TYPE, "%s is a CUDA tensor: this entry point runs on CPU "
                       "tensors (the CUDA path is encode()/decode())", arg);
    return FC_OK;
}

/* Every tensor of a call lives where the gradient does. */
static int check_same_device(const fc_view *v, const fc_view *grad, const char *arg, fc_err *err)
{
    if (v->device_type != grad->device_type ||
        (v->device_type == kDLCUDA && v->device_id != grad->device_id))
        return fc_fail(err, FC_ERR_TYPE, "%s is on %s:%d but grad is on %s:%d: all tensors of a "
                       "call must share a device", arg, v->device_type == kDLCUDA ? "cuda" : "cpu",
                       v->device_id, grad->device_type == kDLCUDA ? "cuda" : "cpu", grad->device_id);
    return FC_OK;
}

/* Loads the CUDA library, the state's context and device workspace, and the current stream
 * of grad's device. The workspace comes from the allocator (torch's), never cudaMalloc. */
static int cuda_prepare(StateObject *self, PyObject *grad, const fc_view *g, fc_cuda_call *k,
                        fc_err *err)
{
    fc_view wv = {0};
    memset(k, 0, sizeof(*k));
    k->api = fc_cuda_api_get(err);
    if (k->api == NULL)
        return err->code;
    if (self->cuda_ctx == NULL) {
        self->cuda_ctx = k->api->ctx_new();
        if (self->cuda_ctx == NULL)
            return fc_fail(err, FC_ERR_NOMEM, "could not allocate the CUDA context");
    }
    if (self->cuda_ws == NULL) {
        if (self->allocator == Py_None)
            return fc_fail(err, FC_ERR_STATE, "the CUDA path needs an allocator (State(..., "
                           "allocator=...)) for its device workspace; fsdpcomp.CommState provides one");
        PyObject *ws = PyObject_CallFunction(self->allocator, "LsO",
                                             (long long)(FC_CUDA_WS_BYTES / 4), "float32", grad);
        if (ws == NULL)
            return fc_fail(err, FC_ERR_PYTHON, "");
        self->cuda_ws = ws;
    }
    if (fc_view_get(self->cuda_ws, "workspace", FC_DT_F32, &wv, err) != FC_OK)
        return err->code;
    int ok = wv.device_type == kDLCUDA && wv.device_id == g->device_id &&
             wv.buf.numel * 4 >= FC_CUDA_WS_BYTES;
    k->ws = (fc_cuda_ws *)wv.buf.data;
    fc_view_release(&wv); /* the State keeps the tensor alive */
    if (!ok)
        return fc_fail(err, FC_ERR_STATE, "this State's CUDA workspace is not on cuda:%d: one "
                       "State serves one device", g->device_id);
    k->ctx = self->cuda_ctx;
    k->device = g->device_id;
    return fc_view_stream(grad, g, &k->stream, err);
}

static int check_aligned(const fc_view *v, const char *arg, fc_err *err)
{
    if (((uintptr_t)v->buf.data) % FC_ALIGN != 0)
        return fc_fail(err, FC_ERR_VALUE, "%s must start on a %d-byte boundary (a fresh tensor "
                       "does; a sliced view may not)", arg, FC_ALIGN);
    return FC_OK;
}

static int check_unit(StateObject *self, long long unit, int64_t numel, fc_err *err)
{
    if (unit < 0 || unit >= self->core.n_units)
        return fc_fail(err, FC_ERR_VALUE, "unit must be in [0, %d) (from begin()), got %lld",
                       self->core.n_units, unit);
    if (self->core.units[unit].numel != numel)
        return fc_fail(err, FC_ERR_VALUE, "grad has %lld elements but unit %lld has %lld",
                       (long long)numel, unit, (long long)self->core.units[unit].numel);
    return FC_OK;
}

static int64_t plan_total(const int64_t *splits, int world)
{
    int64_t t = 0;
    for (int r = 0; r < world; r++)
        t += splits[r];
    return t;
}

/* The residual tensor of a unit, allocated through the allocator on first use. New ref. */
static PyObject *residual_for(StateObject *self, uint32_t unit, PyObject *grad, int64_t numel,
                              fc_view *rv, fc_err *err)
{
    PyObject *res = NULL;
    const int rdt = self->core.common.residual_dtype == 0 ? FC_F32 : FC_BF16;
    while (PyList_GET_SIZE(self->residuals) <= (Py_ssize_t)unit)
        if (PyList_Append(self->residuals, Py_None) < 0) {
            fc_fail(err, FC_ERR_PYTHON, "");
            return NULL;
        }
    res = PyList_GET_ITEM(self->residuals, unit); /* borrowed */
    if (res == Py_None) {
        if (self->allocator == Py_None) {
            fc_fail(err, FC_ERR_STATE, "error feedback needs a residual allocator (State(..., "
                    "allocator=...)); fsdpcomp.CommState provides one");
            return NULL;
        }
        res = PyObject_CallFunction(self->allocator, "LsO", (long long)numel, fc_dtype_name(rdt), grad);
        if (res == NULL) {
            fc_fail(err, FC_ERR_PYTHON, "");
            return NULL;
        }
        if (PyList_SetItem(self->residuals, unit, res) < 0) { /* steals res */
            fc_fail(err, FC_ERR_PYTHON, "");
            return NULL;
        }
    }
    Py_INCREF(res);
    if (fc_view_get(res, "residual", 1u << rdt, rv, err) != FC_OK || rv->buf.numel != numel) {
        if (err->code == FC_OK)
            fc_fail(err, FC_ERR_VALUE, "residual of unit %u has %lld elements, expected %lld",
                    unit, (long long)rv->buf.numel, (long long)numel);
        fc_view_release(rv);
        Py_DECREF(res);
        return NULL;
    }
    return res;
}

/* ---------------------------------------------------------------- State: the collective */

PyDoc_STRVAR(State_plan_doc,
"plan(grad, world, rank) -> (send_splits, recv_splits)\n\n"
"Payload bytes this rank sends to and receives from each rank for `grad`: the split sizes of\n"
"the all-to-all. A pure function of method, config, size, dtype and world size.");

static PyObject *State_plan(StateObject *self, PyObject *args)
{
    PyObject *grad, *send = NULL, *recv = NULL;
    int world, rank;
    fc_err err = {0};
    fc_view g;
    int64_t ss[FC_MAX_WORLD], rs[FC_MAX_WORLD];
    if (!ready(self) || !PyArg_ParseTuple(args, "Oii:plan", &grad, &world, &rank))
        return NULL;
    if (check_world(world, rank, &err) != FC_OK || fc_view_get(grad, "grad", FC_DT_FLOATS, &g, &err) != FC_OK)
        return STATE_ERR(self, &err);
    fc_core_plan(&self->core, g.buf.numel, g.buf.dtype, world, rank, ss, rs);
    fc_view_release(&g);
    send = PyTuple_New(world);
    recv = PyTuple_New(world);
    if (send == NULL || recv == NULL)
        goto error;
    for (int r = 0; r < world; r++) {
        PyObject *a = PyLong_FromLongLong(ss[r]), *b = PyLong_FromLongLong(rs[r]);
        if (a == NULL || b == NULL) {
            Py_XDECREF(a);
            Py_XDECREF(b);
            goto error;
        }
        PyTuple_SET_ITEM(send, r, a);
        PyTuple_SET_ITEM(recv, r, b);
    }
    return Py_BuildValue("(NN)", send, recv);
error:
    Py_XDECREF(send);
    Py_XDECREF(recv);
    return NULL;
}

PyDoc_STRVAR(State_begin_doc,
"begin(numel) -> unit\n\n"
"Claims the next unit index of this step (units are keyed by call order within a step) and\n"
"checks that a unit seen before still has the same number of elements.");

static PyObject *State_begin(StateObject *self, PyObject *arg)
{
    fc_err err = {0};
    uint32_t unit;
    if (!ready(self))
        return NULL;
    long long numel = PyLong_AsLongLong(arg);
    if (numel == -1 && PyErr_Occurred())
        return NULL;
    if (numel < 0) {
        PyErr_Format(PyExc_ValueError, "numel must be >= 0, got %lld", numel);
        return NULL;
    }
    if (fc_core_begin(&self->core, (int64_t)numel, &unit, &err) != FC_OK)
        return STATE_ERR(self, &err);
    return PyLong_FromUnsignedLong(unit);
}

PyDoc_STRVAR(State_end_step_doc, "end_step()\n\nMarks the end of a backward pass: the next begin() is unit 0 of the next step.");

static PyObject *State_end_step(StateObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!ready(self))
        return NULL;
    fc_core_end_step(&self->core);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(State_encode_doc,
"encode(grad, send, world, rank, unit) -> tuple[int, ...]\n\n"
"Encodes every outgoing chunk of the flat gradient `grad` into the uint8 buffer `send`\n"
"(sized by plan()), applying and updating the unit's error-feedback residual. Returns the\n"
"bytes written for each rank; the payloads lie back to back. For a method whose size is\n"
"data-dependent (flags['varsize']) these are below plan()'s bounds.");

static PyObject *sizes_tuple(const int64_t *sizes, int world)
{
    PyObject *t = PyTuple_New(world);
    for (int r = 0; t != NULL && r < world; r++) {
        PyObject *v = PyLong_FromLongLong(sizes[r]);
        if (v == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, r, v);
    }
    return t;
}

/* Whether a unit of `numel` elements keeps an error-feedback residual. */
static int uses_residual(StateObject *self, int64_t numel)
{
    return self->core.common.error_feedback &&
           fc_core_unit_method(&self->core, numel) == self->core.method;
}

/* The unit's residual (new ref, its view in *r) on grad's device; NULL with err set. */
static PyObject *ef_residual(StateObject *self, uint32_t unit, PyObject *grad, const fc_view *g,
                             fc_view *r, fc_err *err)
{
    PyObject *res = residual_for(self, unit, grad, g->buf.numel, r, err);
    if (res != NULL && check_same_device(r, g, "residual", err) != FC_OK)
        Py_CLEAR(res); /* r is released by the caller's exit */
    return res;
}

/* What encode() and encode_part() share: grad and send viewed and checked, send as long as
 * plan() says (with `whole`; the C side checks a per-peer buffer against its pieces), and the
 * unit's residual (*res, new ref) when error feedback applies to it. */
static int encode_views(StateObject *self, PyObject *grad, PyObject *send, int world, int rank,
                        long long unit, int whole, fc_view *g, fc_view *s, fc_view *r,
                        PyObject **res, int *use_ef, fc_err *err)
{
    int64_t ss[FC_MAX_WORLD], rs[FC_MAX_WORLD];
    if (fc_view_get(grad, "grad", FC_DT_FLOATS, g, err) != FC_OK ||
        fc_view_get(send, "send", FC_DT_U8, s, err) != FC_OK ||
        check_same_device(s, g, "send", err) || check_aligned(s, "send", err) ||
        check_world(world, rank, err) || check_unit(self, unit, g->buf.numel, err))
        return err->code != FC_OK ? err->code : FC_ERR_VALUE;
    fc_core_plan(&self->core, g->buf.numel, g->buf.dtype, world, rank, ss, rs);
    if (whole && s->buf.numel != plan_total(ss, world))
        return fc_fail(err, FC_ERR_VALUE, "send has %lld bytes, plan() needs %lld",
                       (long long)s->buf.numel, (long long)plan_total(ss, world));
    *use_ef = uses_residual(self, g->buf.numel);
    if (*use_ef && (*res = ef_residual(self, (uint32_t)unit, grad, g, r, err)) == NULL)
        return err->code != FC_OK ? err->code : FC_ERR_PYTHON;
    return FC_OK;
}

static PyObject *State_encode(StateObject *self, PyObject *args)
{
    PyObject *grad, *send, *res = NULL;
    int world, rank, rc = FC_ERR_VALUE; /* until the encode has run */
    long long unit;
    fc_err err = {0};
    fc_view g = {0}, s = {0}, r = {0};
    int64_t sizes[FC_MAX_WORLD];
    int use_ef = 0;
    if (!ready(self) || !PyArg_ParseTuple(args, "OOiiL:encode", &grad, &send, &world, &rank, &unit))
        return NULL;
    fc_cuda_call k;
    if (encode_views(self, grad, send, world, rank, unit, 1, &g, &s, &r, &res, &use_ef, &err) != FC_OK)
        goto error;
    if (g.device_type == kDLCUDA && cuda_prepare(self, grad, &g, &k, &err) != FC_OK)
        goto error;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    if (g.device_type == kDLCUDA) {
        /* the CUDA path has fixed-size methods only: what it writes is the plan */
        int64_t recvs[FC_MAX_WORLD];
        rc = fc_cuda_encode(&self->core, &k, &g.buf, &s.buf, use_ef ? &r.buf : NULL, world, rank,
                            (uint32_t)unit, &err);
        fc_core_plan(&self->core, g.buf.numel, g.buf.dtype, world, rank, sizes, recvs);
    } else {
        rc = fc_core_encode(&self->core, &g.buf, &s.buf, use_ef ? &r.buf : NULL, world, rank,
                            (uint32_t)unit, sizes, &err);
    }
    Py_END_ALLOW_THREADS
    self->busy = 0;
error: /* and success: rc says which */
    fc_view_release(&g);
    fc_view_release(&s);
    fc_view_release(&r);
    Py_XDECREF(res);
    return rc == FC_OK ? sizes_tuple(sizes, world) : STATE_ERR(self, &err);
}

/* The one exit of a call that borrowed tensor views: released on success and on error alike
 * (c may be NULL); rc says which, and err why. */
static PyObject *views_done(StateObject *self, int rc, const fc_err *err, fc_view *a, fc_view *b,
                            fc_view *c)
{
    fc_view_release(a);
    fc_view_release(b);
    if (c != NULL)
        fc_view_release(c);
    if (rc != FC_OK)
        return STATE_ERR(self, err);
    Py_RETURN_NONE;
}

/* grad and out of decode() and finish(): float tensors, a writable out, world and unit valid. */
static int grad_out_views(StateObject *self, PyObject *grad, PyObject *out, int world, int rank,
                          long long unit, fc_view *g, fc_view *o, fc_err *err)
{
    if (fc_view_get(grad, "grad", FC_DT_FLOATS, g, err) != FC_OK ||
        fc_view_get(out, "output", FC_DT_FLOATS, o, err) != FC_OK || check_world(world, rank, err) ||
        check_unit(self, unit, g->buf.numel, err))
        return err->code != FC_OK ? err->code : FC_ERR_VALUE;
    if (o->read_only)
        return fc_fail(err, FC_ERR_VALUE, "output is read-only");
    return FC_OK;
}

PyDoc_STRVAR(State_decode_doc,
"decode(recv, grad, out, world, rank, unit)\n\n"
"Sums, in fp32 and in rank order, this rank's exact chunk of `grad` and the payloads in\n"
"`recv`, divides by `world` and writes every element of `out`. A unit with a second round\n"
"(fetch_kmax() > 0) only picks its coordinates here: fetch() and finish() write `out`.");

static PyObject *State_decode(StateObject *self, PyObject *args)
{
    PyObject *recv, *grad, *out;
    int world, rank, rc = FC_ERR_VALUE; /* until the decode has run */
    long long unit;
    fc_err err = {0};
    fc_view v = {0}, g = {0}, o = {0};
    if (!ready(self) || !PyArg_ParseTuple(args, "OOOiiL:decode", &recv, &grad, &out, &world, &rank, &unit))
        return NULL;
    if (fc_view_get(recv, "recv", FC_DT_U8, &v, &err) != FC_OK ||
        grad_out_views(self, grad, out, world, rank, unit, &g, &o, &err) != FC_OK ||
        check_same_device(&v, &g, "recv", &err) || check_same_device(&o, &g, "output", &err) ||
        check_aligned(&v, "recv", &err))
        goto error;
    fc_cuda_call k;
    if (g.device_type == kDLCUDA && cuda_prepare(self, grad, &g, &k, &err) != FC_OK)
        goto error;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    if (g.device_type == kDLCUDA)
        rc = fc_cuda_decode(&self->core, &k, &v.buf, &g.buf, &o.buf, world, rank, (uint32_t)unit, &err);
    else
        rc = fc_core_decode(&self->core, &v.buf, &g.buf, &o.buf, world, rank, (uint32_t)unit, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
error: /* and success: rc says which */
    return views_done(self, rc, &err, &v, &g, &o);
}

/* ---------------------------------------------------------------- State: one peer at a time */

PyDoc_STRVAR(State_per_peer_ok_doc,
"per_peer_ok(numel, world) -> bool\n\n"
"Whether a unit of `numel` elements can be exchanged one payload at a time with\n"
"encode_part()/decode_part(): fixed-size payloads, no second round, no compressed-domain sum.");

static PyObject *State_per_peer_ok(StateObject *self, PyObject *args)
{
    long long numel;
    int world;
    if (!ready(self) || !PyArg_ParseTuple(args, "Li:per_peer_ok", &numel, &world))
        return NULL;
    if (numel < 0 || world < 1 || world > FC_MAX_WORLD) {
        PyErr_Format(PyExc_ValueError, "per_peer_ok: numel must be >= 0 and world in [1, %d]",
                     FC_MAX_WORLD);
        return NULL;
    }
    return PyBool_FromLong(fc_core_per_peer_ok(&self->core, (int64_t)numel, world));
}

PyDoc_STRVAR(State_pieces_doc,
"pieces(grad, world, rank) -> (send, recv)\n\n"
"The parts of the per-peer exchange: send[c] the byte sizes of the pieces this rank sends for\n"
"chunk c, recv[s] those it receives from rank s, back to back per chunk in the send and\n"
"receive buffers. A chunk without payload (the own one, an empty one) is one part of 0 bytes.");

static PyObject *pieces_tuple(StateObject *self, int64_t numel, int dtype, int world, int rank,
                              int as_sender)
{
    PyObject *t = PyTuple_New(world);
    for (int c = 0; t != NULL && c < world; c++) {
        int64_t sizes[FC_MAX_PIECES];
        int count;
        /* as the sender: chunk c from this rank; as the receiver: this rank's chunk from rank c */
        fc_core_piece_plan(&self->core, numel, dtype, world, as_sender ? rank : c,
                           as_sender ? c : rank, sizes, &count);
        PyObject *p = sizes_tuple(sizes, count);
        if (p == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, c, p);
    }
    return t;
}

static PyObject *State_pieces(StateObject *self, PyObject *args)
{
    PyObject *grad;
    int world, rank;
    fc_err err = {0};
    fc_view g = {0};
    if (!ready(self) || !PyArg_ParseTuple(args, "Oii:pieces", &grad, &world, &rank))
        return NULL;
    if (fc_view_get(grad, "grad", FC_DT_FLOATS, &g, &err) != FC_OK ||
        check_world(world, rank, &err) != FC_OK) {
        fc_view_release(&g);
        return STATE_ERR(self, &err);
    }
    const int64_t numel = g.buf.numel;
    const int dtype = g.buf.dtype;
    fc_view_release(&g);
    PyObject *send = pieces_tuple(self, numel, dtype, world, rank, 1);
    PyObject *recv = send == NULL ? NULL : pieces_tuple(self, numel, dtype, world, rank, 0);
    PyObject *out = recv == NULL ? NULL : PyTuple_Pack(2, send, recv);
    Py_XDECREF(send);
    Py_XDECREF(recv);
    return out;
}

PyDoc_STRVAR(State_encode_part_doc,
"encode_part(grad, send, world, rank, unit, chunk, piece) -> int\n\n"
"encode() one part at a time: writes piece `piece` of the payload for rank `chunk` into its\n"
"slot of `send` (laid out as pieces() says) and returns its size (0: no payload). Chunks may\n"
"come in any order, a chunk's pieces in order, every part once; the call is counted when its\n"
"last part is done. With one piece per chunk the bytes are encode()'s. CPU tensors.");

static PyObject *State_encode_part(StateObject *self, PyObject *args)
{
    PyObject *grad, *send, *res = NULL;
    int world, rank, chunk, piece, rc = FC_ERR_VALUE; /* until the encode has run */
    long long unit;
    fc_err err = {0};
    fc_view g = {0}, s = {0}, r = {0};
    int64_t size = 0;
    int use_ef = 0;
    if (!ready(self) ||
        !PyArg_ParseTuple(args, "OOiiLii:encode_part", &grad, &send, &world, &rank, &unit, &chunk,
                          &piece))
        return NULL;
    if (encode_views(self, grad, send, world, rank, unit, 0, &g, &s, &r, &res, &use_ef, &err) != FC_OK ||
        check_cpu(&g, "grad", &err))
        goto error;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = fc_core_encode_part(&self->core, &g.buf, &s.buf, use_ef ? &r.buf : NULL, world, rank,
                             (uint32_t)unit, chunk, piece, &size, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
error: /* and success: rc says which */
    fc_view_release(&g);
    fc_view_release(&s);
    fc_view_release(&r);
    Py_XDECREF(res);
    return rc == FC_OK ? PyLong_FromLongLong(size) : STATE_ERR(self, &err);
}

PyDoc_STRVAR(State_decode_part_doc,
"decode_part(payload, grad, out, world, rank, unit, src, piece)\n\n"
"decode() one part at a time, as they arrive: src = rank first (one empty part unless\n"
"compress_own_chunk), then rank+1, rank+2, ... mod world, each sender's pieces in order. The\n"
"sum runs in that fixed order (for world > 2 it rounds differently from decode()'s rank\n"
"order); the last part writes `out`. CPU tensors.");

static PyObject *State_decode_part(StateObject *self, PyObject *args)
{
    PyObject *payload, *grad, *out;
    int world, rank, src, piece, rc = FC_ERR_VALUE; /* until the decode has run */
    long long unit;
    fc_err err = {0};
    fc_view v = {0}, g = {0}, o = {0};
    if (!ready(self) || !PyArg_ParseTuple(args, "OOOiiLii:decode_part", &payload, &grad, &out,
                                          &world, &rank, &unit, &src, &piece))
        return NULL;
    if (fc_view_get(payload, "payload", FC_DT_U8, &v, &err) != FC_OK ||
        grad_out_views(self, grad, out, world, rank, unit, &g, &o, &err) != FC_OK ||
        check_cpu(&g, "grad", &err) || check_cpu(&v, "payload", &err) ||
        check_cpu(&o, "output", &err) || (v.buf.numel > 0 && check_aligned(&v, "payload", &err)))
        goto error;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = fc_core_decode_part(&self->core, &v.buf, &g.buf, &o.buf, world, rank, (uint32_t)unit, src,
                             piece, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
error: /* and success: rc says which */
    return views_done(self, rc, &err, &v, &g, &o);
}

/* ---------------------------------------------------------------- State: second round */

PyDoc_STRVAR(State_fetch_kmax_doc,
"fetch_kmax(numel, world) -> int\n\n"
"Coordinates each owner picks for the second round of a unit of `numel` elements (the\n"
"all-gather's size per rank); 0 when the unit has no second round.");

static PyObject *State_fetch_kmax(StateObject *self, PyObject *args)
{
    long long numel;
    int world;
    fc_err err = {0};
    if (!ready(self) || !PyArg_ParseTuple(args, "Li:fetch_kmax", &numel, &world))
        return NULL;
    if (numel < 0) {
        PyErr_Format(PyExc_ValueError, "numel must be >= 0, got %lld", numel);
        return NULL;
    }
    if (check_world(world, 0, &err) != FC_OK)
        return STATE_ERR(self, &err);
    return PyLong_FromLongLong(fc_core_fetch_kmax(&self->core, numel, world));
}

/* A uint8 CPU tensor viewed as `count` uint32 (picks) or fp32 (values), aligned. */
static int words_view(PyObject *t, const char *arg, fc_view *v, fc_err *err)
{
    if (fc_view_get(t, arg, FC_DT_U8, v, err) != FC_OK || check_cpu(v, arg, err) != FC_OK ||
        check_aligned(v, arg, err) != FC_OK)
        return err->code;
    if (v->buf.numel % 4 != 0)
        return fc_fail(err, FC_ERR_VALUE, "%s has %lld bytes, not a whole number of 4-byte words",
                       arg, (long long)v->buf.numel);
    return FC_OK;
}

PyDoc_STRVAR(State_fetch_picks_doc,
"fetch_picks(unit, picks)\n\n"
"After decode() of a unit with a second round: writes this rank's picked coordinates, padded\n"
"with 0xFFFFFFFF, into `picks` (a uint8 view of fetch_kmax() uint32 words).");

static PyObject *State_fetch_picks(StateObject *self, PyObject *args)
{
    PyObject *picks;
    long long unit;
    fc_err err = {0};
    fc_view v = {0};
    if (!ready(self) || !PyArg_ParseTuple(args, "LO:fetch_picks", &unit, &picks))
        return NULL;
    if (words_view(picks, "picks", &v, &err) != FC_OK || unit < 0 || unit > UINT32_MAX ||
        fc_fetch_picks(&self->core, (uint32_t)unit, (uint32_t *)v.buf.data, v.buf.numel / 4,
                       &err) != FC_OK) {
        if (err.code == FC_OK)
            fc_fail(&err, FC_ERR_VALUE, "unit must be a unit index, got %lld", unit);
        fc_view_release(&v);
        return STATE_ERR(self, &err);
    }
    fc_view_release(&v);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(State_fetch_doc,
"fetch(all_picks, grad, send, world, rank, unit) -> (send_splits, recv_splits)\n\n"
"all_picks: every owner's picks (world x fetch_kmax() uint32, as uint8). Writes this rank's\n"
"exact error-fed values at each owner's picks into `send` (uint8 view of fp32), back to back,\n"
"takes them out of the residual and counts their bytes; splits are in fp32 values.");

static PyObject *State_fetch(StateObject *self, PyObject *args)
{
    PyObject *picks, *grad, *send, *res = NULL, *result = NULL;
    int world, rank, rc = FC_ERR_VALUE; /* until the values are gathered */
    long long unit;
    fc_err err = {0};
    fc_view pv = {0}, g = {0}, sv = {0}, r = {0};
    int64_t ss[FC_MAX_WORLD], rs[FC_MAX_WORLD];
    if (!ready(self) || !PyArg_ParseTuple(args, "OOOiiL:fetch", &picks, &grad, &send, &world,
                                          &rank, &unit))
        return NULL;
    if (words_view(picks, "all_picks", &pv, &err) != FC_OK ||
        fc_view_get(grad, "grad", FC_DT_FLOATS, &g, &err) != FC_OK || check_cpu(&g, "grad", &err) ||
        words_view(send, "send", &sv, &err) != FC_OK || check_world(world, rank, &err) ||
        check_unit(self, unit, g.buf.numel, &err))
        goto error;
    const int64_t kmax = fc_core_fetch_kmax(&self->core, g.buf.numel, world);
    if (pv.buf.numel != 4 * kmax * world) {
        fc_fail(&err, FC_ERR_VALUE, "all_picks has %lld bytes, %d ranks of %lld picks need %lld",
                (long long)pv.buf.numel, world, (long long)kmax, (long long)(4 * kmax * world));
        goto error;
    }
    const int use_ef = self->core.common.error_feedback &&
                       fc_core_unit_method(&self->core, g.buf.numel) == self->core.method;
    if (use_ef && (res = residual_for(self, (uint32_t)unit, grad, g.buf.numel, &r, &err)) == NULL)
        goto error;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = fc_fetch_values(&self->core, (const uint32_t *)pv.buf.data, kmax, &g.buf,
                         use_ef ? &r.buf : NULL, world, rank, (uint32_t)unit, (float *)sv.buf.data,
                         sv.buf.numel / 4, ss, rs, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (rc == FC_OK) {
        PyObject *st = sizes_tuple(ss, world), *rt = sizes_tuple(rs, world);
        result = st != NULL && rt != NULL ? PyTuple_Pack(2, st, rt) : NULL;
        Py_XDECREF(st);
        Py_XDECREF(rt);
    }
error: /* and success: rc says which */
    fc_view_release(&pv);
    fc_view_release(&g);
    fc_view_release(&sv);
    fc_view_release(&r);
    Py_XDECREF(res);
    return rc == FC_OK ? result : STATE_ERR(self, &err);
}

PyDoc_STRVAR(State_finish_doc,
"finish(recv, grad, out, world, rank, unit)\n\n"
"The second round's end: sums the senders' values (`recv`, uint8 view of fp32, as fetch()'s\n"
"recv_splits) at this rank's picks with its exact own chunk, in rank order, and writes `out`.");

static PyObject *State_finish(StateObject *self, PyObject *args)
{
    PyObject *recv, *grad, *out;
    int world, rank, rc = FC_ERR_VALUE; /* until the finish has run */
    long long unit;
    fc_err err = {0};
    fc_view v = {0}, g = {0}, o = {0};
    if (!ready(self) || !PyArg_ParseTuple(args, "OOOiiL:finish", &recv, &grad, &out, &world,
                                          &rank, &unit))
        return NULL;
    if (words_view(recv, "recv", &v, &err) != FC_OK ||
        grad_out_views(self, grad, out, world, rank, unit, &g, &o, &err) != FC_OK ||
        check_cpu(&g, "grad", &err) || check_cpu(&o, "output", &err))
        goto error;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = fc_fetch_finish(&self->core, (const float *)v.buf.data, v.buf.numel / 4, &g.buf, &o.buf,
                         world, rank, (uint32_t)unit, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
error: /* and success: rc says which */
    return views_done(self, rc, &err, &v, &g, &o);
}

/* ---------------------------------------------------------------- State: one chunk */

PyDoc_STRVAR(State_payload_bytes_doc,
"payload_bytes(n) -> int\n\nBytes of one fp32 chunk of n elements on the wire: header, body and padding.");

static PyObject *State_payload_bytes(StateObject *self, PyObject *arg)
{
    if (!ready(self))
        return NULL;
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "n must be >= 0, got %lld", n);
        return NULL;
    }
    return PyLong_FromLongLong(fc_payload_bytes(&self->core, self->core.method, n, FC_F32));
}

PyDoc_STRVAR(State_layout_doc,
"layout(n) -> dict\n\nThe documented payload formula for an fp32 chunk of n elements:\n"
"value_bytes, meta_bytes, index_bytes, header_bytes (header + padding) and total.");

static PyObject *State_layout(StateObject *self, PyObject *arg)
{
    if (!ready(self))
        return NULL;
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n <= 0) {
        PyErr_Format(PyExc_ValueError, "n must be > 0, got %lld", n);
        return NULL;
    }
    fc_chunk c;
    memset(&c, 0, sizeof(c));
    c.cfg = self->core.cfg;
    c.n = n;
    c.world = 1;
    c.wire_dtype = FC_F32;
    fc_layout l;
    self->core.method->layout(&c, &l);
    int64_t total = fc_payload_bytes(&self->core, self->core.method, n, FC_F32);
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L,s:L}", "value_bytes", (long long)l.value_bytes,
                         "meta_bytes", (long long)l.meta_bytes, "index_bytes",
                         (long long)l.index_bytes, "header_bytes",
                         (long long)(total - fc_layout_bytes(&l)), "kept", (long long)l.kept,
                         "total", (long long)total);
}

PyDoc_STRVAR(State_compress_doc,
"compress(x, payload, unit=0, chunk=0, world=1, rank=0) -> int\n\n"
"Encodes the fp32 CPU tensor x as one payload into the uint8 tensor `payload`; returns its\n"
"size. The RNG stream is keyed by (seed, rank, step, unit, chunk) as in the collective.");

static PyObject *State_compress(StateObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"x", "payload", "unit", "chunk", "world", "rank", NULL};
    PyObject *x, *payload;
    unsigned int unit = 0, chunk = 0;
    int world = 1, rank = 0, rc = FC_ERR_VALUE; /* until the encode has run */
    int64_t written = 0;
    fc_err err = {0};
    fc_view xv = {0}, pv = {0};
    if (!ready(self) || !PyArg_ParseTupleAndKeywords(args, kwds, "OO|IIii:compress", kwlist, &x,
                                                     &payload, &unit, &chunk, &world, &rank))
        return NULL;
    if (fc_view_get(x, "x", FC_DT_F32, &xv, &err) || fc_view_get(payload, "payload", FC_DT_U8, &pv, &err) ||
        check_cpu(&xv, "x", &err) || check_cpu(&pv, "payload", &err) ||
        check_aligned(&pv, "payload", &err) || check_world(world, rank, &err))
        goto error;
    if (xv.buf.numel == 0) {
        fc_fail(&err, FC_ERR_VALUE, "x must have at least one element");
        goto error;
    }
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = fc_core_compress(&self->core, (const float *)xv.buf.data, xv.buf.numel,
                          (uint8_t *)pv.buf.data, pv.buf.numel, unit, chunk, world, rank, &written, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
error: /* and success: rc says which */
    fc_view_release(&xv);
    fc_view_release(&pv);
    return rc == FC_OK ? PyLong_FromLongLong(written) : STATE_ERR(self, &err);
}

PyDoc_STRVAR(State_decompress_doc,
"decompress(payload, acc, alpha=1.0, unit=0, chunk=0, world=1)\n\n"
"Validates one payload for a chunk of acc.numel() elements and adds alpha times its decode to\n"
"the fp32 CPU tensor acc. A malformed payload raises PayloadError and leaves acc untouched\n"
"when the header is at fault.");

static PyObject *State_decompress(StateObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"payload", "acc", "alpha", "unit", "chunk", "world", NULL};
    PyObject *payload, *acc;
    double alpha = 1.0;
    unsigned int unit = 0, chunk = 0;
    int world = 1, rc = FC_ERR_VALUE; /* until the decode has run */
    fc_err err = {0};
    fc_view pv = {0}, av = {0};
    if (!ready(self) || !PyArg_ParseTupleAndKeywords(args, kwds, "OO|dIIi:decompress", kwlist,
                                                     &payload, &acc, &alpha, &unit, &chunk, &world))
        return NULL;
    if (fc_view_get(payload, "payload", FC_DT_U8, &pv, &err) || fc_view_get(acc, "acc", FC_DT_F32, &av, &err) ||
        check_cpu(&pv, "payload", &err) || check_cpu(&av, "acc", &err) ||
        check_aligned(&pv, "payload", &err) || check_world(world, 0, &err))
        goto error;
    if (av.buf.numel == 0) {
        fc_fail(&err, FC_ERR_VALUE, "acc must have at least one element");
        goto error;
    }
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = fc_core_decompress(&self->core, (const uint8_t *)pv.buf.data, pv.buf.numel, av.buf.numel,
                            (float)alpha, (float *)av.buf.data, unit, chunk, world, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
error: /* and success: rc says which */
    return views_done(self, rc, &err, &pv, &av, NULL);
}

/* ---------------------------------------------------------------- State: unit-state sync */

PyDoc_STRVAR(State_sync_vector_doc,
"sync_vector(unit) -> bytes | None\n\n"
"After this step's decode of `unit`: the fp32 values the ranks must sum (all-reduce) and hand\n"
"to sync_apply(), or None when the method has nothing to sync this step (gradiveq's basis).");

static PyObject *State_sync_vector(StateObject *self, PyObject *arg)
{
    if (!ready(self))
        return NULL;
    long long unit = PyLong_AsLongLong(arg);
    if (unit == -1 && PyErr_Occurred())
        return NULL;
    if (unit < 0 || unit >= self->core.n_units) {
        PyErr_Format(PyExc_ValueError, "unit must be in [0, %d), got %lld", self->core.n_units, unit);
        return NULL;
    }
    float *data;
    int64_t len;
    fc_core_sync_span(&self->core, (uint32_t)unit, &data, &len);
    if (len == 0)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)(len * 4));
}

PyDoc_STRVAR(State_sync_apply_doc,
"sync_apply(unit, summed)\n\nHands the sum over ranks of sync_vector(unit) (an fp32 CPU tensor) back.");

static PyObject *State_sync_apply(StateObject *self, PyObject *args)
{
    PyObject *t;
    long long unit;
    fc_err err = {0};
    fc_view v = {0};
    if (!ready(self) || !PyArg_ParseTuple(args, "LO:sync_apply", &unit, &t))
        return NULL;
    if (unit < 0 || unit >= self->core.n_units) {
        PyErr_Format(PyExc_ValueError, "unit must be in [0, %d), got %lld", self->core.n_units, unit);
        return NULL;
    }
    if (fc_view_get(t, "summed", FC_DT_F32, &v, &err) != FC_OK || check_cpu(&v, "summed", &err) ||
        fc_core_sync_apply(&self->core, (uint32_t)unit, (const float *)v.buf.data, v.buf.numel, &err)) {
        fc_view_release(&v);
        return STATE_ERR(self, &err);
    }
    fc_view_release(&v);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- State: counters */

PyDoc_STRVAR(State_counters_doc, "counters() -> dict\n\nEverything counted since the last reset_counters().");

static PyObject *State_counters(StateObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!ready(self))
        return NULL;
    fc_counters tot = self->core.ctr;
    const fc_counters *k = &tot;
    double res_sq = 0;
    long long res_bytes = 0;
    static fc_cuda_ws dws; /* large: static, and only touched with the GIL held */
    const int on_cuda = self->cuda_ctx != NULL && self->cuda_ws != NULL;
    if (on_cuda) {
        fc_err err = {0};
        fc_view wv = {0};
        double sec[FC_TIME_KINDS];
        const fc_cuda_api *api = fc_cuda_api_get(&err);
        if (api == NULL || fc_view_get(self->cuda_ws, "workspace", FC_DT_F32, &wv, &err) != FC_OK)
            return STATE_ERR(self, &err);
        int rc = api->read_counters(self->cuda_ctx, (const fc_cuda_ws *)wv.buf.data, &dws, sec, &err);
        fc_view_release(&wv);
        if (rc != FC_OK)
            return STATE_ERR(self, &err);
        /* harvested event times become part of the host totals */
        self->core.ctr.compress_s += sec[FC_TIME_COMPRESS];
        self->core.ctr.comm_s += sec[FC_TIME_COMM];
        self->core.ctr.decompress_s += sec[FC_TIME_DECOMPRESS];
        tot = self->core.ctr;
        tot.nonfinite_in += (int64_t)dws.nonfinite_in;
        tot.nonfinite_out += (int64_t)dws.nonfinite_out;
        tot.err_sq += dws.err_sq;
        tot.ref_sq += dws.ref_sq;
        tot.cos_sum += dws.cos_sum;
        tot.stats_samples += (int64_t)dws.samples;
        if (dws.payload_error != 0) {
            static const char *const what[] = {"", "bad magic", "wrong wire version",
                                               "another method", "another dtype",
                                               "another unit or step (ranks called the hook in "
                                               "different orders)", "another element count",
                                               "a body that does not fit its slot"};
            unsigned code = dws.payload_error < 8 ? dws.payload_error : 0;
            fc_fail(&err, FC_ERR_PAYLOAD, "a CUDA decode rejected the payload from rank %d "
                    "(header says unit %u, step %u): %s; its output was set to NaN "
                    "(reset_counters() clears this)", dws.payload_error_rank,
                    dws.payload_error_unit, dws.payload_error_step, what[code]);
            return STATE_ERR(self, &err);
        }
    }
    for (int32_t u = 0; u < self->core.n_units; u++)
        res_sq += on_cuda && u < FC_CUDA_MAX_UNITS ? dws.unit_sq[u] : self->core.units[u].residual_sq;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(self->residuals); i++) {
        PyObject *t = PyList_GET_ITEM(self->residuals, i); /* borrowed */
        if (t != Py_None)
            res_bytes += (long long)self->core.units[i].numel *
                         (self->core.common.residual_dtype == 0 ? 4 : 2);
    }
    double ratio = k->bytes_sent > 0 ? (double)k->bytes_raw / (double)k->bytes_sent : 1.0;
    double rel = k->ref_sq > 0 ? sqrt(k->err_sq / k->ref_sq) : 0.0;
    PyObject *rel_o = k->stats_samples ? PyFloat_FromDouble(rel) : (Py_INCREF(Py_None), Py_None);
    PyObject *cos_o = k->stats_samples ? PyFloat_FromDouble(k->cos_sum / (double)k->stats_samples)
                                       : (Py_INCREF(Py_None), Py_None);
    if (rel_o == NULL || cos_o == NULL) {
        Py_XDECREF(rel_o);
        Py_XDECREF(cos_o);
        return NULL;
    }
    return Py_BuildValue(
        "{s:s,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:d,s:d,s:L,s:L,s:L,s:d,s:d,s:d,s:d,s:L,"
        "s:N,s:N,s:L,s:d,s:L,s:I,s:i}",
        "method", self->core.method->name,
        "calls", (long long)k->calls,
        "calls_uncompressed", (long long)k->calls_uncompressed,
        "elements", (long long)k->elements,
        "chunks_sent", (long long)k->chunks_sent,
        "bytes_raw", (long long)k->bytes_raw,
        "bytes_sent", (long long)k->bytes_sent,
        "bytes_compressed", (long long)(k->bytes_sent),
        "header_bytes", (long long)k->header_bytes,
        "meta_bytes", (long long)k->meta_bytes,
        "index_bytes", (long long)k->index_bytes,
        "ratio", ratio,
        "density", k->sent_elements ? (double)k->kept / (double)k->sent_elements : 1.0,
        "value_bytes", (long long)k->value_bytes,
        "nonfinite_in", (long long)k->nonfinite_in,
        "nonfinite_out", (long long)k->nonfinite_out,
        "compress_time_s", k->compress_s,
        "decompress_time_s", k->decompress_s,
        "comm_time_s", k->comm_s,
        "extra_collective_time_s", k->extra_collective_s,
        "extra_collectives", (long long)k->extra_collectives,
        "grad_rel_error", rel_o,
        "grad_cos_sim", cos_o,
        "error_samples", (long long)k->stats_samples,
        "residual_norm", sqrt(res_sq),
        "residual_bytes", res_bytes,
        "step", self->core.step,
        "units", self->core.n_units);
}

PyDoc_STRVAR(State_reset_counters_doc, "reset_counters()\n\nZeroes every counter (residuals and units are kept).");

static PyObject *State_reset_counters(StateObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!ready(self))
        return NULL;
    if (self->cuda_ctx != NULL && self->cuda_ws != NULL) {
        fc_err err = {0};
        fc_view wv = {0};
        const fc_cuda_api *api = fc_cuda_api_get(&err);
        if (api == NULL || fc_view_get(self->cuda_ws, "workspace", FC_DT_F32, &wv, &err) != FC_OK)
            return STATE_ERR(self, &err);
        int rc = api->reset_counters(self->cuda_ctx, (fc_cuda_ws *)wv.buf.data, &err);
        fc_view_release(&wv);
        if (rc != FC_OK)
            return STATE_ERR(self, &err);
    }
    memset(&self->core.ctr, 0, sizeof(self->core.ctr));
    Py_RETURN_NONE;
}

PyDoc_STRVAR(State_add_comm_doc,
"add_comm(seconds, bytes_sent=0, bytes_raw=0, extra=False)\n\n"
"Adds a collective measured by the caller: its time, and for collectives beyond the\n"
"all-to-all (size exchanges, the all-gather of an all-reduce) its bytes.");

static PyObject *State_add_comm(StateObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"seconds", "bytes_sent", "bytes_raw", "extra", NULL};
    double seconds;
    long long sent = 0, raw = 0;
    int extra = 0;
    if (!ready(self) || !PyArg_ParseTupleAndKeywords(args, kwds, "d|LLp:add_comm", kwlist, &seconds,
                                                     &sent, &raw, &extra))
        return NULL;
    if (!(seconds >= 0) || sent < 0 || raw < 0) {
        PyErr_SetString(PyExc_ValueError, "add_comm: seconds and byte counts must be >= 0");
        return NULL;
    }
    fc_counters *k = &self->core.ctr;
    if (extra) {
        k->extra_collectives++;
        k->extra_collective_s += seconds;
    }
    k->comm_s += seconds;
    k->bytes_sent += sent;
    k->bytes_raw += raw;
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- State: NCCL transport */

#define NCCL_CAPSULE "fsdpcomp.nccl_comm"

static int splits_from(PyObject *seq, const char *arg, int world, int64_t *out, int64_t *total)
{
    PyObject *fast = PySequence_Fast(seq, arg);
    if (fast == NULL)
        return -1;
    int rc = 0;
    *total = 0;
    if (PySequence_Fast_GET_SIZE(fast) != world) {
        PyErr_Format(PyExc_ValueError, "%s has %zd entries, the communicator has %d ranks", arg,
                     PySequence_Fast_GET_SIZE(fast), world);
        rc = -1;
    }
    for (int r = 0; rc == 0 && r < world; r++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, r));
        if ((v == -1 && PyErr_Occurred()) || v < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s[%d] must be a non-negative int", arg, r);
            rc = -1;
        } else {
            out[r] = v;
            *total += v;
        }
    }
    Py_DECREF(fast);
    return rc;
}

PyDoc_STRVAR(State_nccl_all_to_all_doc,
"nccl_all_to_all(comm, send, recv, send_splits, recv_splits)\n\n"
"Queues the all-to-all of payloads as grouped ncclSend/ncclRecv on the current stream of the\n"
"buffers' device (no host sync); its time is read from CUDA events with counters().");

static PyObject *State_nccl_all_to_all(StateObject *self, PyObject *args)
{
    PyObject *cap, *send, *recv, *ss_o, *rs_o;
    fc_err err = {0};
    fc_view s = {0}, r = {0};
    int rc = FC_ERR_VALUE; /* until the collective has run */
    int64_t ss[FC_MAX_WORLD], rs[FC_MAX_WORLD], st = 0, rt = 0;
    void *stream = NULL;
    if (!ready(self) || !PyArg_ParseTuple(args, "OOOOO:nccl_all_to_all", &cap, &send, &recv, &ss_o, &rs_o))
        return NULL;
    fc_cuda_comm *comm = (fc_cuda_comm *)PyCapsule_GetPointer(cap, NCCL_CAPSULE);
    if (comm == NULL)
        return NULL;
    PyObject *ctx_o = (PyObject *)PyCapsule_GetContext(cap); /* borrowed: (world, rank) */
    if (ctx_o == NULL || !PyTuple_Check(ctx_o)) {
        PyErr_SetString(PyExc_TypeError, "comm must come from fsdpcomp._C.nccl_comm_init");
        return NULL;
    }
    int world = (int)PyLong_AsLong(PyTuple_GET_ITEM(ctx_o, 0));
    if (splits_from(ss_o, "send_splits", world, ss, &st) < 0 ||
        splits_from(rs_o, "recv_splits", world, rs, &rt) < 0)
        return NULL;
    const fc_cuda_api *api = fc_cuda_api_get(&err);
    if (api == NULL)
        return STATE_ERR(self, &err);
    if (fc_view_get(send, "send", FC_DT_U8, &s, &err) || fc_view_get(recv, "recv", FC_DT_U8, &r, &err) ||
        check_same_device(&r, &s, "recv", &err))
        goto error;
    if (s.device_type != kDLCUDA) {
        fc_fail(&err, FC_ERR_TYPE, "send must be a CUDA tensor for the NCCL transport");
        goto error;
    }
    if (s.buf.numel != st || r.buf.numel != rt) {
        fc_fail(&err, FC_ERR_VALUE, "send/recv have %lld/%lld bytes, the splits sum to %lld/%lld",
                (long long)s.buf.numel, (long long)r.buf.numel, (long long)st, (long long)rt);
        goto error;
    }
    if (self->cuda_ctx == NULL) {
        self->cuda_ctx = api->ctx_new();
        if (self->cuda_ctx == NULL) {
            fc_fail(&err, FC_ERR_NOMEM, "could not allocate the CUDA context");
            goto error;
        }
    }
    if (fc_view_stream(send, &s, &stream, &err) != FC_OK)
        goto error;
    Py_BEGIN_ALLOW_THREADS
    rc = api->nccl_all_to_all(self->cuda_ctx, comm, s.device_id, stream, (const uint8_t *)s.buf.data,
                              ss, (uint8_t *)r.buf.data, rs, &err);
    Py_END_ALLOW_THREADS
error: /* and success: rc says which */
    return views_done(self, rc, &err, &s, &r, NULL);
}

/* ---------------------------------------------------------------- State: checkpoints */

PyDoc_STRVAR(State_units_doc, "units() -> list[int]\n\nElements of each unit, in call order.");

static PyObject *State_units(StateObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!ready(self))
        return NULL;
    PyObject *list = PyList_New(self->core.n_units);
    for (int32_t u = 0; list != NULL && u < self->core.n_units; u++) {
        PyObject *v = PyLong_FromLongLong(self->core.units[u].numel);
        if (v == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, u, v);
    }
    return list;
}

PyDoc_STRVAR(State_residuals_doc, "residuals() -> list\n\nThe residual tensor of each unit (None where there is none yet). The tensors are the live ones.");

static PyObject *State_residuals(StateObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!ready(self))
        return NULL;
    return PyList_GetSlice(self->residuals, 0, PyList_GET_SIZE(self->residuals));
}

PyDoc_STRVAR(State_unit_states_doc,
"unit_states() -> list\n\n"
"The persistent method state of each unit (gradiveq's basis) as fp32 bytes, None where the\n"
"method keeps none or the unit has not run yet. Copies, for checkpoints.");

static PyObject *State_unit_states(StateObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!ready(self))
        return NULL;
    PyObject *list = PyList_New(self->core.n_units);
    for (int32_t u = 0; list != NULL && u < self->core.n_units; u++) {
        const fc_unit *un = &self->core.units[u];
        int64_t nf = fc_core_unit_floats(&self->core, un->numel);
        PyObject *v = un->ustate != NULL && nf > 0
                          ? PyBytes_FromStringAndSize((const char *)un->ustate, (Py_ssize_t)(nf * 4))
                          : (Py_INCREF(Py_None), Py_None);
        if (v == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, u, v); /* steals v */
    }
    return list;
}

/* Copies of the checkpointed unit states into table[u].ustate, each validated by the method;
 * nothing of the live state is touched. */
static int load_unit_states(StateObject *self, PyObject *states, fc_unit *table, Py_ssize_t n)
{
    if (PyList_GET_SIZE(states) > n) {
        PyErr_Format(PyExc_ValueError, "restore: %zd unit states for %zd units",
                     PyList_GET_SIZE(states), n);
        return -1;
    }
    for (Py_ssize_t u = 0; u < PyList_GET_SIZE(states); u++) {
        PyObject *t = PyList_GET_ITEM(states, u); /* borrowed */
        if (t == Py_None)
            continue;
        fc_view v = {0};
        fc_err err = {0};
        if (fc_view_get(t, "unit state", FC_DT_F32, &v, &err) != FC_OK ||
            check_cpu(&v, "unit state", &err) != FC_OK ||
            fc_core_check_unit_state(&self->core, table[u].numel, (const float *)v.buf.data,
                                     v.buf.numel, &err) != FC_OK) {
            fc_err named = {0};
            fc_view_release(&v);
            fc_fail(&named, err.code, "restore: unit state %zd: %s", u, err.msg);
            STATE_ERR(self, err.code == FC_ERR_PYTHON ? &err : &named);
            return -1;
        }
        table[u].ustate = (float *)malloc((size_t)v.buf.numel * 4);
        if (table[u].ustate == NULL) {
            fc_view_release(&v);
            PyErr_NoMemory();
            return -1;
        }
        memcpy(table[u].ustate, v.buf.data, (size_t)v.buf.numel * 4);
        fc_view_release(&v);
    }
    return 0;
}

PyDoc_STRVAR(State_restore_doc,
"restore(units, residuals, step, unit_states=None)\n\n"
"Loads a checkpoint: the unit sizes, one residual (tensor or None) per unit, the step, and\n"
"the units' method states (fp32 CPU tensors or None, from unit_states(); None restarts them\n"
"from the seed). Everything is validated before anything is changed.");

static PyObject *State_restore(StateObject *self, PyObject *args)
{
    PyObject *units, *residuals, *states = Py_None, *new_list = NULL;
    unsigned long step;
    fc_unit *table = NULL;
    Py_ssize_t n = 0;
    if (!ready(self) || !PyArg_ParseTuple(args, "O!O!k|O:restore", &PyList_Type, &units, &PyList_Type,
                                          &residuals, &step, &states))
        return NULL;
    if (states != Py_None && !PyList_Check(states)) {
        PyErr_Format(PyExc_TypeError, "restore: unit_states must be a list or None, got %s",
                     Py_TYPE(states)->tp_name);
        return NULL;
    }
    n = PyList_GET_SIZE(units);
    const int rdt = self->core.common.residual_dtype == 0 ? FC_F32 : FC_BF16;
    if (PyList_GET_SIZE(residuals) > n) {
        PyErr_Format(PyExc_ValueError, "restore: %zd residuals for %zd units", PyList_GET_SIZE(residuals), n);
        return NULL;
    }
    table = (fc_unit *)calloc((size_t)(n > 0 ? n : 1), sizeof(fc_unit));
    new_list = PyList_New(0);
    if (table == NULL || new_list == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t u = 0; u < n; u++) {
        long long numel = PyLong_AsLongLong(PyList_GET_ITEM(units, u));
        if ((numel == -1 && PyErr_Occurred()) || numel < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "restore: units[%zd] must be a non-negative int", u);
            goto error;
        }
        table[u].numel = numel;
        PyObject *r = u < PyList_GET_SIZE(residuals) ? PyList_GET_ITEM(residuals, u) : Py_None;
        if (r != Py_None) {
            fc_view v;
            fc_err err = {0};
            if (fc_view_get(r, "residual", 1u << rdt, &v, &err) != FC_OK) {
                STATE_ERR(self, &err);
                goto error;
            }
            int64_t got = v.buf.numel;
            fc_view_release(&v);
            if (got != numel) {
                PyErr_Format(PyExc_ValueError, "restore: residual %zd has %lld elements, unit has %lld",
                             u, (long long)got, numel);
                goto error;
            }
        }
        if (PyList_Append(new_list, r) < 0)
            goto error;
    }
    if (states != Py_None && load_unit_states(self, states, table, n) < 0)
        goto error;
    fc_core_free_unit_states(&self->core); /* units without a saved state restart from the seed */
    free(self->core.units);
    self->core.units = table;
    self->core.n_units = self->core.cap_units = (int32_t)(n > 0 ? n : 1);
    self->core.n_units = (int32_t)n;
    self->core.step = (uint32_t)step;
    self->core.cursor = 0;
    Py_SETREF(self->residuals, new_list);
    Py_RETURN_NONE;
error:
    for (Py_ssize_t u = 0; table != NULL && u < n; u++)
        free(table[u].ustate);
    free(table);
    Py_XDECREF(new_list);
    return NULL;
}

/* ---------------------------------------------------------------- State: attributes */

static PyObject *State_get_method(StateObject *self, void *Py_UNUSED(c))
{
    if (!ready(self))
        return NULL;
    return PyUnicode_FromString(self->core.method->name);
}

static PyObject *State_get_config(StateObject *self, void *Py_UNUSED(c))
{
    if (!ready(self))
        return NULL;
    return PyDict_Copy(self->config);
}

static PyObject *State_get_step(StateObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromUnsignedLong(self->core.step);
}

static PyObject *State_get_cursor(StateObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromUnsignedLong(self->core.cursor);
}

static PyObject *State_get_flags(StateObject *self, void *Py_UNUSED(c))
{
    if (!ready(self))
        return NULL;
    unsigned f = self->core.method->flags;
    return Py_BuildValue("{s:O,s:O,s:O,s:O}", "unbiased", (f & FC_UNBIASED) ? Py_True : Py_False,
                         "linear", (f & FC_LINEAR) ? Py_True : Py_False, "random",
                         (f & FC_RANDOM) ? Py_True : Py_False, "varsize",
                         (f & FC_VARSIZE) ? Py_True : Py_False);
}

static PyGetSetDef State_getset[] = {
    {"method", (getter)State_get_method, NULL, "the method's name", NULL},
    {"config", (getter)State_get_config, NULL, "the resolved config (a copy)", NULL},
    {"step", (getter)State_get_step, NULL, "backward passes completed (end_step calls)", NULL},
    {"cursor", (getter)State_get_cursor, NULL, "the next unit index within this step", NULL},
    {"flags", (getter)State_get_flags, NULL, "the method's properties", NULL},
    {NULL},
};

static PyMethodDef State_methods[] = {
    {"plan", (PyCFunction)State_plan, METH_VARARGS, State_plan_doc},
    {"begin", (PyCFunction)State_begin, METH_O, State_begin_doc},
    {"end_step", (PyCFunction)State_end_step, METH_NOARGS, State_end_step_doc},
    {"encode", (PyCFunction)State_encode, METH_VARARGS, State_encode_doc},
    {"decode", (PyCFunction)State_decode, METH_VARARGS, State_decode_doc},
    {"per_peer_ok", (PyCFunction)State_per_peer_ok, METH_VARARGS, State_per_peer_ok_doc},
    {"pieces", (PyCFunction)State_pieces, METH_VARARGS, State_pieces_doc},
    {"encode_part", (PyCFunction)State_encode_part, METH_VARARGS, State_encode_part_doc},
    {"decode_part", (PyCFunction)State_decode_part, METH_VARARGS, State_decode_part_doc},
    {"payload_bytes", (PyCFunction)State_payload_bytes, METH_O, State_payload_bytes_doc},
    {"layout", (PyCFunction)State_layout, METH_O, State_layout_doc},
    {"compress", (PyCFunction)(void (*)(void))State_compress, METH_VARARGS | METH_KEYWORDS, State_compress_doc},
    {"decompress", (PyCFunction)(void (*)(void))State_decompress, METH_VARARGS | METH_KEYWORDS, State_decompress_doc},
    {"sync_vector", (PyCFunction)State_sync_vector, METH_O, State_sync_vector_doc},
    {"sync_apply", (PyCFunction)State_sync_apply, METH_VARARGS, State_sync_apply_doc},
    {"counters", (PyCFunction)State_counters, METH_NOARGS, State_counters_doc},
    {"reset_counters", (PyCFunction)State_reset_counters, METH_NOARGS, State_reset_counters_doc},
    {"add_comm", (PyCFunction)(void (*)(void))State_add_comm, METH_VARARGS | METH_KEYWORDS, State_add_comm_doc},
    {"units", (PyCFunction)State_units, METH_NOARGS, State_units_doc},
    {"residuals", (PyCFunction)State_residuals, METH_NOARGS, State_residuals_doc},
    {"restore", (PyCFunction)State_restore, METH_VARARGS, State_restore_doc},
    {"unit_states", (PyCFunction)State_unit_states, METH_NOARGS, State_unit_states_doc},
    {"fetch_kmax", (PyCFunction)State_fetch_kmax, METH_VARARGS, State_fetch_kmax_doc},
    {"fetch_picks", (PyCFunction)State_fetch_picks, METH_VARARGS, State_fetch_picks_doc},
    {"fetch", (PyCFunction)State_fetch, METH_VARARGS, State_fetch_doc},
    {"finish", (PyCFunction)State_finish, METH_VARARGS, State_finish_doc},
    {"nccl_all_to_all", (PyCFunction)State_nccl_all_to_all, METH_VARARGS, State_nccl_all_to_all_doc},
    {NULL},
};

PyDoc_STRVAR(State_doc,
"State(method, config=None, allocator=None)\n\n"
"One compressor with its validated config, error-feedback residuals and counters. The\n"
"allocator, callable(numel, dtype_name, like_tensor) -> zeroed tensor, provides residual\n"
"memory from torch's allocator.");

static PyType_Slot State_slots[] = {
    {Py_tp_doc, (void *)State_doc},
    {Py_tp_init, State_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, State_dealloc},
    {Py_tp_traverse, State_traverse},
    {Py_tp_clear, State_clear},
    {Py_tp_methods, State_methods},
    {Py_tp_getset, State_getset},
    {0, NULL},
};

static PyType_Spec State_spec = {
    .name = "fsdpcomp._C.State",
    .basicsize = sizeof(StateObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = State_slots,
};

/* ---------------------------------------------------------------- module functions */

PyDoc_STRVAR(methods_doc, "methods() -> tuple[str, ...]\n\nThe registered compressor names.");

static PyObject *mod_methods(PyObject *mod, PyObject *Py_UNUSED(ignored))
{
    (void)mod;
    PyObject *t = PyTuple_New(fc_method_count());
    for (int i = 0; t != NULL && i < fc_method_count(); i++) {
        PyObject *s = PyUnicode_FromString(fc_method_at(i)->name);
        if (s == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

PyDoc_STRVAR(method_info_doc,
"method_info(name) -> dict\n\nid, summary, properties and config keys (name, type, default,\n"
"range, choices, doc) of one method; method_info('') describes the common keys.");

static PyObject *mod_method_info(PyObject *mod, PyObject *arg)
{
    (void)mod;
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL)
        return NULL;
    if (name[0] == '\0')
        return fc_keys_info(fc_common_keys);
    const fc_method *m = fc_method_by_name(name);
    if (m == NULL) {
        PyErr_Format(PyExc_ValueError, "unknown compression method '%s'", name);
        return NULL;
    }
    unsigned f = m->flags;
    return Py_BuildValue("{s:s,s:i,s:s,s:O,s:O,s:O,s:O,s:O,s:N}", "name", m->name, "id", m->id,
                         "summary", m->summary, "unbiased", (f & FC_UNBIASED) ? Py_True : Py_False,
                         "linear", (f & FC_LINEAR) ? Py_True : Py_False, "random",
                         (f & FC_RANDOM) ? Py_True : Py_False, "varsize",
                         (f & FC_VARSIZE) ? Py_True : Py_False, "error_feedback_default",
                         (f & FC_EF_DEFAULT) ? Py_True : Py_False, "keys", fc_keys_info(m->keys));
}

static module_state *state_of_module(PyObject *mod)
{
    return (module_state *)PyModule_GetState(mod);
}

PyDoc_STRVAR(cuda_info_doc,
"cuda_info() -> dict\n\nLoads the CUDA library if it is not yet loaded and says whether that\n"
"worked: {'available': bool, 'path': str, 'error': str or None, 'build': str or None}.");

static PyObject *mod_cuda_info(PyObject *mod, PyObject *Py_UNUSED(ignored))
{
    (void)mod;
    fc_err err = {0};
    const fc_cuda_api *api = fc_cuda_api_get(&err);
    return Py_BuildValue("{s:O,s:s,s:z,s:z}", "available", api ? Py_True : Py_False, "path",
                         fc_cuda_lib_path(), "error", api ? NULL : err.msg, "build",
                         api ? api->build : NULL);
}

PyDoc_STRVAR(cuda_loaded_doc, "cuda_loaded() -> bool\n\nWhether the CUDA library is loaded (never loads it).");

static PyObject *mod_cuda_loaded(PyObject *mod, PyObject *Py_UNUSED(ignored))
{
    (void)mod;
    return PyBool_FromLong(fc_cuda_api_loaded() != NULL);
}

PyDoc_STRVAR(reference_kernels_doc,
"_reference_kernels(on) -> bool\n\nTests only: True sends every CPU encode/decode to the scalar\n"
"reference loops instead of the fast paths (which must give the same bytes); returns the\n"
"previous setting. Process-wide; not for use while other threads compress.");

static PyObject *mod_reference_kernels(PyObject *mod, PyObject *arg)
{
    (void)mod;
    const int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    const int prev = fc_cpu_reference;
    fc_cpu_reference = on;
    return PyBool_FromLong(prev);
}

PyDoc_STRVAR(nccl_unique_id_doc, "nccl_unique_id() -> bytes\n\nA fresh ncclUniqueId (128 bytes), made on rank 0 and shared with the group.");

static PyObject *mod_nccl_unique_id(PyObject *mod, PyObject *Py_UNUSED(ignored))
{
    fc_err err = {0};
    uint8_t id[128];
    const fc_cuda_api *api = fc_cuda_api_get(&err);
    if (api == NULL || api->nccl_unique_id(id, &err) != FC_OK)
        return raise_err(state_of_module(mod), &err);
    return PyBytes_FromStringAndSize((const char *)id, 128);
}

static void comm_capsule_free(PyObject *cap)
{
    fc_cuda_comm *c = (fc_cuda_comm *)PyCapsule_GetPointer(cap, NCCL_CAPSULE);
    PyObject *ctx = (PyObject *)PyCapsule_GetContext(cap);
    if (c != NULL && fc_cuda_api_loaded() != NULL)
        fc_cuda_api_loaded()->nccl_comm_free(c);
    Py_XDECREF(ctx);
    PyErr_Clear();
}

PyDoc_STRVAR(nccl_comm_init_doc,
"nccl_comm_init(unique_id, world, rank, device) -> comm\n\n"
"ncclCommInitRank on `device` (blocks until every rank of the group has joined). The returned\n"
"capsule destroys the communicator when dropped.");

static PyObject *mod_nccl_comm_init(PyObject *mod, PyObject *args)
{
    const char *id;
    Py_ssize_t id_len;
    int world, rank, device, rc;
    fc_err err = {0};
    fc_cuda_comm *comm = NULL;
    PyObject *cap = NULL, *ctx = NULL;
    if (!PyArg_ParseTuple(args, "y#iii:nccl_comm_init", &id, &id_len, &world, &rank, &device))
        return NULL;
    if (id_len != 128) {
        PyErr_Format(PyExc_ValueError, "unique_id must be 128 bytes, got %zd", id_len);
        return NULL;
    }
    if (world < 1 || world > FC_MAX_WORLD || rank < 0 || rank >= world || device < 0) {
        PyErr_Format(PyExc_ValueError, "nccl_comm_init: rank %d of world %d on device %d is out of "
                     "range (world <= %d)", rank, world, device, FC_MAX_WORLD);
        return NULL;
    }
    const fc_cuda_api *api = fc_cuda_api_get(&err);
    if (api == NULL)
        return raise_err(state_of_module(mod), &err);
    Py_BEGIN_ALLOW_THREADS
    rc = api->nccl_comm_init((const uint8_t *)id, world, rank, device, &comm, &err);
    Py_END_ALLOW_THREADS
    if (rc != FC_OK)
        return raise_err(state_of_module(mod), &err);
    ctx = Py_BuildValue("(ii)", world, rank);
    cap = ctx ? PyCapsule_New(comm, NCCL_CAPSULE, comm_capsule_free) : NULL;
    if (cap == NULL || PyCapsule_SetContext(cap, ctx) < 0) {
        if (cap == NULL)
            api->nccl_comm_free(comm);
        Py_XDECREF(cap);
        Py_XDECREF(ctx);
        return NULL;
    }
    return cap; /* the context tuple is owned by the capsule now */
}

static PyMethodDef module_functions[] = {
    {"methods", mod_methods, METH_NOARGS, methods_doc},
    {"method_info", mod_method_info, METH_O, method_info_doc},
    {"cuda_info", mod_cuda_info, METH_NOARGS, cuda_info_doc},
    {"cuda_loaded", mod_cuda_loaded, METH_NOARGS, cuda_loaded_doc},
    {"_reference_kernels", mod_reference_kernels, METH_O, reference_kernels_doc},
    {"nccl_unique_id", mod_nccl_unique_id, METH_NOARGS, nccl_unique_id_doc},
    {"nccl_comm_init", mod_nccl_comm_init, METH_VARARGS, nccl_comm_init_doc},
    {NULL},
};

/* ---------------------------------------------------------------- module lifecycle */

static int module_exec(PyObject *mod)
{
    module_state *st = (module_state *)PyModule_GetState(mod);
    st->state_type = (PyTypeObject *)PyType_FromModuleAndSpec(mod, &State_spec, NULL);
    if (st->state_type == NULL || PyModule_AddType(mod, st->state_type) < 0)
        return -1;
    st->payload_error = PyErr_NewExceptionWithDoc(
        "fsdpcomp._C.PayloadError", "A payload on the wire is malformed, truncated or from a rank "
        "that is out of step.", PyExc_ValueError, NULL);
    st->cuda_error = PyErr_NewExceptionWithDoc("fsdpcomp._C.CudaError", "A CUDA call failed.",
                                               PyExc_RuntimeError, NULL);
    st->nccl_error = PyErr_NewExceptionWithDoc("fsdpcomp._C.NcclError", "An NCCL call failed.",
                                               PyExc_RuntimeError, NULL);
    if (st->payload_error == NULL || st->cuda_error == NULL || st->nccl_error == NULL)
        return -1;
    if (PyModule_AddObjectRef(mod, "PayloadError", st->payload_error) < 0 ||
        PyModule_AddObjectRef(mod, "CudaError", st->cuda_error) < 0 ||
        PyModule_AddObjectRef(mod, "NcclError", st->nccl_error) < 0)
        return -1;
    if (PyModule_AddIntConstant(mod, "HEADER_BYTES", FC_HEADER_BYTES) < 0 ||
        PyModule_AddIntConstant(mod, "ALIGN", FC_ALIGN) < 0 ||
        PyModule_AddIntConstant(mod, "WIRE_VERSION", FC_WIRE_VERSION) < 0 ||
        PyModule_AddIntConstant(mod, "MAX_WORLD", FC_MAX_WORLD) < 0)
        return -1;
    return 0;
}

static int module_traverse(PyObject *mod, visitproc visit, void *arg)
{
    module_state *st = (module_state *)PyModule_GetState(mod);
    Py_VISIT(st->state_type);
    Py_VISIT(st->payload_error);
    Py_VISIT(st->cuda_error);
    Py_VISIT(st->nccl_error);
    return 0;
}

static int module_clear(PyObject *mod)
{
    module_state *st = (module_state *)PyModule_GetState(mod);
    Py_CLEAR(st->state_type);
    Py_CLEAR(st->payload_error);
    Py_CLEAR(st->cuda_error);
    Py_CLEAR(st->nccl_error);
    return 0;
}

static void module_free(void *mod)
{
    module_clear((PyObject *)mod);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

PyDoc_STRVAR(module_doc, "fsdpcomp._C: compressors, residuals, counters and the compressed "
                         "reduce-scatter, in C.");

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fsdpcomp._C",
    .m_doc = module_doc,
    .m_size = sizeof(module_state),
    .m_methods = module_functions,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__C(void)
{
    return PyModuleDef_Init(&module_def);
}
