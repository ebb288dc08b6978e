/* state_type.c: the State type: init, GC and dealloc, its attributes, its method table, and
 * the residual tensors it owns. */
#include "python/state.h" /* first: it includes Python.h */
#include <stdlib.h>

#include "python/fc_config.h"

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
            Py_DECREF(names);
            names = joined;
        }
        if (names != NULL)
            /* fsdpcomp.CommState names every method first (fsdpcomp/_methods.py); a State
             * is one chunk codec, so this lists fsdpcomp.codecs() */
            PyErr_Format(PyExc_ValueError, "unknown chunk codec '%s'; valid codecs: %U", name, names);
        Py_XDECREF(names);
        return -1;
    }
    if (allocator != Py_None && !PyCallable_Check(allocator)) {
        PyErr_Format(PyExc_TypeError, "allocator must be callable or None, got %s",
                     FC_TYPE_NAME(allocator));
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
    for (int slot = 0; slot < FC_SLOTS; slot++)
        if ((self->residuals[slot] = PyList_New(0)) == NULL)
            goto error;
    fc_core_init(&self->core, m, &common, cfg, fc_config_fingerprint(m, &common, cfg));
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
    for (int slot = 0; slot < FC_SLOTS; slot++)
        Py_VISIT(self->residuals[slot]);
    Py_VISIT(self->config);
    Py_VISIT(self->cuda_ws);
    Py_VISIT(self->cuda_extra);
    Py_VISIT(self->res_ws);
    return 0;
}

static int State_clear(StateObject *self)
{
    Py_CLEAR(self->allocator);
    for (int slot = 0; slot < FC_SLOTS; slot++)
        Py_CLEAR(self->residuals[slot]);
    Py_CLEAR(self->config);
    Py_CLEAR(self->cuda_ws);
    Py_CLEAR(self->cuda_extra);
    Py_CLEAR(self->res_ws);
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
    free(self->cuda_host.sent);
    self->cuda_host.sent = NULL;
    free(self->cuda_host.parts);
    self->cuda_host.parts = NULL;
    free(self->restored);
    self->restored = NULL;
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(self);
    Py_DECREF(tp); /* a heap type: each instance holds a reference to it */
}

/* ---------------------------------------------------------------- State: attributes */

static PyObject *State_get_method(StateObject *self, void *Py_UNUSED(c))
{
    if (!fc_state_ready(self))
        return NULL;
    return PyUnicode_FromString(self->core.method->name);
}

static PyObject *State_get_config(StateObject *self, void *Py_UNUSED(c))
{
    if (!fc_state_ready(self))
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
    if (!fc_state_ready(self))
        return NULL;
    unsigned f = self->core.method->flags;
    /* parts: payload sizes follow each unit's parts table (adaptive): plan() needs the unit */
    return Py_BuildValue("{s:O,s:O,s:O,s:O,s:O}", "unbiased", (f & FC_UNBIASED) ? Py_True : Py_False,
                         "linear", (f & FC_LINEAR) ? Py_True : Py_False, "random",
                         (f & FC_RANDOM) ? Py_True : Py_False, "varsize",
                         (f & FC_VARSIZE) ? Py_True : Py_False, "parts",
                         (f & FC_PARTS) ? Py_True : Py_False);
}

static PyObject *State_get_fingerprint(StateObject *self, void *Py_UNUSED(c))
{
    if (!fc_state_ready(self))
        return NULL;
    return PyLong_FromUnsignedLong(self->core.fingerprint);
}

static PyObject *State_get_wire_config(StateObject *self, void *Py_UNUSED(c))
{
    if (!fc_state_ready(self))
        return NULL;
    PyObject *d = PyDict_New();
    if (d != NULL && fc_config_wire_dict(self->core.method, &self->core.common, self->core.cfg, d) < 0)
        Py_CLEAR(d);
    return d;
}

static PyObject *State_get_config_bytes(StateObject *self, void *Py_UNUSED(c))
{
    if (!fc_state_ready(self))
        return NULL;
    return PyBytes_FromStringAndSize((const char *)self->core.cfg, FC_CFG_MAX);
}

static PyGetSetDef State_getset[] = {
    {"method", (getter)State_get_method, NULL, "the method's name", NULL},
    {"config", (getter)State_get_config, NULL, "the resolved config (a copy)", NULL},
    {"step", (getter)State_get_step, NULL, "backward passes completed (end_step calls)", NULL},
    {"cursor", (getter)State_get_cursor, NULL, "the next unit index within this step", NULL},
    {"flags", (getter)State_get_flags, NULL, "the method's properties", NULL},
    {"fingerprint", (getter)State_get_fingerprint, NULL,
     "32-bit hash of the method and the config keys that decide the wire (every header carries it)",
     NULL},
    {"wire_config", (getter)State_get_wire_config, NULL,
     "the config keys that decide the wire, as the ranks compare them (a new dict)", NULL},
    {"_config_bytes", (getter)State_get_config_bytes, NULL,
     "the method's parsed config struct (csrc/methods/fc_cfg.h) as the CUDA library receives it (tests)",
     NULL},
    {NULL},
};

/* ---------------------------------------------------------------- State: one thread at a time */

/* Every method runs between fc_state_enter and leaving: the State is marked busy before its
 * first call that can release the GIL (a DLPack export, the allocator, the C work) and until it
 * returns, so a second thread is refused at the door instead of finding a half-updated State. */
#define GUARD2(fn)                                                         \
    static PyObject *fn##_guarded(StateObject *self, PyObject *arg)       \
    {                                                                      \
        if (!fc_state_enter(self))                                         \
            return NULL;                                                   \
        PyObject *r = fn(self, arg);                                       \
        self->busy = 0;                                                    \
        return r;                                                          \
    }
#define GUARD3(fn)                                                                   \
    static PyObject *fn##_guarded(StateObject *self, PyObject *args, PyObject *kwds) \
    {                                                                                \
        if (!fc_state_enter(self))                                                   \
            return NULL;                                                             \
        PyObject *r = fn(self, args, kwds);                                          \
        self->busy = 0;                                                              \
        return r;                                                                    \
    }

GUARD2(fc_state_plan)
GUARD3(fc_state_begin)
GUARD2(fc_state_end_step)
GUARD2(fc_state_encode)
GUARD2(fc_state_decode)
GUARD2(fc_state_per_peer_ok)
GUARD2(fc_state_pieces)
GUARD2(fc_state_encode_part)
GUARD2(fc_state_decode_part)
GUARD3(fc_state_payload_bytes)
GUARD2(fc_state_layout)
GUARD3(fc_state_compress)
GUARD3(fc_state_decompress)
GUARD2(fc_state_sync_vector)
GUARD2(fc_state_sync_apply)
GUARD2(fc_state_counters)
GUARD2(fc_state_reset_counters)
GUARD3(fc_state_add_comm)
GUARD2(fc_state_comm_mark)
GUARD2(fc_state_cuda_geometry)
GUARD3(fc_state_add_param_gather)
GUARD2(fc_state_units)
GUARD2(fc_state_set_parts)
GUARD2(fc_state_residuals)
GUARD2(fc_state_restore)
GUARD2(fc_state_unit_states)
GUARD2(fc_state_fetch_kmax)
GUARD2(fc_state_fetch_picks)
GUARD2(fc_state_fetch)
GUARD2(fc_state_finish)
GUARD2(fc_state_emulate_cuda)
GUARD3(fc_state_residual_of)
GUARD3(fc_state_ef_add)
GUARD3(fc_state_ef_keep)
GUARD2(fc_state_residual_numel)
GUARD2(fc_state_residual_values)
GUARD3(fc_state_check_residual)
GUARD3(fc_state_pack_residual)
GUARD2(fc_state_unpack_residual)

static PyMethodDef State_methods[] = {
    {"plan", (PyCFunction)fc_state_plan_guarded, METH_VARARGS, fc_state_plan_doc},
    {"begin", (PyCFunction)(void (*)(void))fc_state_begin_guarded, METH_VARARGS | METH_KEYWORDS, fc_state_begin_doc},
    {"set_parts", (PyCFunction)fc_state_set_parts_guarded, METH_VARARGS, fc_state_set_parts_doc},
    {"end_step", (PyCFunction)fc_state_end_step_guarded, METH_NOARGS, fc_state_end_step_doc},
    {"encode", (PyCFunction)fc_state_encode_guarded, METH_VARARGS, fc_state_encode_doc},
    {"decode", (PyCFunction)fc_state_decode_guarded, METH_VARARGS, fc_state_decode_doc},
    {"per_peer_ok", (PyCFunction)fc_state_per_peer_ok_guarded, METH_VARARGS, fc_state_per_peer_ok_doc},
    {"pieces", (PyCFunction)fc_state_pieces_guarded, METH_VARARGS, fc_state_pieces_doc},
    {"encode_part", (PyCFunction)fc_state_encode_part_guarded, METH_VARARGS, fc_state_encode_part_doc},
    {"decode_part", (PyCFunction)fc_state_decode_part_guarded, METH_VARARGS, fc_state_decode_part_doc},
    {"payload_bytes", (PyCFunction)(void (*)(void))fc_state_payload_bytes_guarded, METH_VARARGS | METH_KEYWORDS, fc_state_payload_bytes_doc},
    {"layout", (PyCFunction)fc_state_layout_guarded, METH_O, fc_state_layout_doc},
    {"compress", (PyCFunction)(void (*)(void))fc_state_compress_guarded, METH_VARARGS | METH_KEYWORDS, fc_state_compress_doc},
    {"decompress", (PyCFunction)(void (*)(void))fc_state_decompress_guarded, METH_VARARGS | METH_KEYWORDS, fc_state_decompress_doc},
    {"sync_vector", (PyCFunction)fc_state_sync_vector_guarded, METH_O, fc_state_sync_vector_doc},
    {"sync_apply", (PyCFunction)fc_state_sync_apply_guarded, METH_VARARGS, fc_state_sync_apply_doc},
    {"counters", (PyCFunction)fc_state_counters_guarded, METH_NOARGS, fc_state_counters_doc},
    {"reset_counters", (PyCFunction)fc_state_reset_counters_guarded, METH_NOARGS, fc_state_reset_counters_doc},
    {"add_comm", (PyCFunction)(void (*)(void))fc_state_add_comm_guarded, METH_VARARGS | METH_KEYWORDS, fc_state_add_comm_doc},
    {"comm_mark", (PyCFunction)fc_state_comm_mark_guarded, METH_VARARGS, fc_state_comm_mark_doc},
    {"_cuda_geometry", (PyCFunction)fc_state_cuda_geometry_guarded, METH_VARARGS, fc_state_cuda_geometry_doc},
    {"add_param_gather", (PyCFunction)(void (*)(void))fc_state_add_param_gather_guarded, METH_VARARGS | METH_KEYWORDS,
     fc_state_add_param_gather_doc},
    {"units", (PyCFunction)fc_state_units_guarded, METH_NOARGS, fc_state_units_doc},
    {"residuals", (PyCFunction)fc_state_residuals_guarded, METH_VARARGS, fc_state_residuals_doc},
    {"residual", (PyCFunction)(void (*)(void))fc_state_residual_of_guarded, METH_VARARGS | METH_KEYWORDS,
     fc_state_residual_of_doc},
    {"ef_add", (PyCFunction)(void (*)(void))fc_state_ef_add_guarded, METH_VARARGS | METH_KEYWORDS,
     fc_state_ef_add_doc},
    {"ef_keep", (PyCFunction)(void (*)(void))fc_state_ef_keep_guarded, METH_VARARGS | METH_KEYWORDS,
     fc_state_ef_keep_doc},
    {"restore", (PyCFunction)fc_state_restore_guarded, METH_VARARGS, fc_state_restore_doc},
    {"unit_states", (PyCFunction)fc_state_unit_states_guarded, METH_NOARGS, fc_state_unit_states_doc},
    {"fetch_kmax", (PyCFunction)fc_state_fetch_kmax_guarded, METH_VARARGS, fc_state_fetch_kmax_doc},
    {"fetch_picks", (PyCFunction)fc_state_fetch_picks_guarded, METH_VARARGS, fc_state_fetch_picks_doc},
    {"fetch", (PyCFunction)fc_state_fetch_guarded, METH_VARARGS, fc_state_fetch_doc},
    {"finish", (PyCFunction)fc_state_finish_guarded, METH_VARARGS, fc_state_finish_doc},
    {"_emulate_cuda", (PyCFunction)fc_state_emulate_cuda_guarded, METH_O, fc_state_emulate_cuda_doc},
    {"residual_numel", (PyCFunction)fc_state_residual_numel_guarded, METH_O, fc_state_residual_numel_doc},
    {"residual_values", (PyCFunction)fc_state_residual_values_guarded, METH_O, fc_state_residual_values_doc},
    {"check_residual", (PyCFunction)(void (*)(void))fc_state_check_residual_guarded, METH_VARARGS | METH_KEYWORDS,
     fc_state_check_residual_doc},
    {"pack_residual", (PyCFunction)(void (*)(void))fc_state_pack_residual_guarded, METH_VARARGS | METH_KEYWORDS,
     fc_state_pack_residual_doc},
    {"unpack_residual", (PyCFunction)fc_state_unpack_residual_guarded, METH_VARARGS, fc_state_unpack_residual_doc},
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

PyType_Spec fc_state_spec = {
    .name = "fsdpcomp._C.State",
    .basicsize = sizeof(StateObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = State_slots,
};
