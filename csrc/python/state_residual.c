/* state_residual.c: the error-feedback residuals a State owns, one tensor per (unit, slot) made by
 * its allocator (state.h's slots: the reduce-scatter's, the all-gather half's, PowerSGD's error),
 * and, for a device only, the fp32 workspace an 8-bit residual (residual_dtype "int8",
 * fc_res8.h) is unpacked into for the length of one call (one per State, reused). The CPU reads
 * and packs an 8-bit residual in place (backend_cpu/fc_res8.c): its scratch stays within 8 B
 * per element of the largest chunk, where a unit-sized workspace is 4 B per element of the
 * unit (4 W per element of a chunk). */
#include "python/state.h" /* first: it includes Python.h */

#include "common/fc_res8.h"

const char *const fc_slot_names[FC_SLOTS] = {"scatter", "gather", "factors"};

int fc_slot_parse(PyObject *name, int *slot)
{
    for (int i = 0; PyUnicode_Check(name) && i < FC_SLOTS; i++)
        if (PyUnicode_CompareWithASCIIString(name, fc_slot_names[i]) == 0) {
            *slot = i;
            return 0;
        }
    PyObject *r = PyObject_Repr(name);
    if (r != NULL)
        PyErr_Format(PyExc_ValueError, "residual slot must be 'scatter', 'gather' or 'factors', got %U", r);
    Py_XDECREF(r);
    return -1;
}

int fc_state_residual_dtype(const StateObject *self)
{
    static const int dtypes[] = {FC_F32, FC_BF16, FC_U8}; /* fc_config.c's residual_dtypes */
    return dtypes[self->core.common.residual_dtype];
}

/* Elements of the tensor that keeps a residual of `numel` values. */
static int64_t stored_numel(int dtype, int64_t numel)
{
    return dtype == FC_U8 ? fc_res8_bytes(numel) : numel;
}

/* h->r viewed from h->res as one of `dtypes` (the stored dtype must be one), checked against
 * numel values on g's device. */
static int view_residual(fc_res_hold *h, unsigned dtypes, const fc_view *g, int64_t numel,
                         const char *what, fc_err *err)
{
    if (fc_view_get(h->res, what, dtypes, &h->r, err) != FC_OK)
        return err->code;
    const int dtype = h->r.buf.dtype;
    if (h->r.buf.numel != stored_numel(dtype, numel))
        return fc_fail(err, FC_ERR_VALUE, "%s has %lld elements, expected %lld%s", what,
                       (long long)h->r.buf.numel, (long long)stored_numel(dtype, numel),
                       dtype == FC_U8 ? " (an 8-bit residual: fc_res8_bytes)" : "");
    if (fc_check_same_device(&h->r, g, what, err) != FC_OK)
        return err->code;
    h->packed = dtype == FC_U8;
    h->buf = &h->r.buf;
    return FC_OK;
}

/* A restored residual at its unit's first call: a tensor from the allocator on grad's device
 * takes its values (torch's copy_, across devices too) and its place in the list. Why: restore()
 * keeps the checkpoint's tensor on the device it was saved from, and a checkpoint saved on a GPU
 * resumes on the CPU, or the other way, or on another GPU; the residual follows the first call
 * that uses it, moved once (the list then holds the moved tensor, counted once in
 * residual_bytes), into memory the State's allocator made as it makes every other residual. */
static int move_restored(StateObject *self, uint32_t unit, int slot, PyObject *grad, fc_err *err)
{
    uint8_t *restored = (Py_ssize_t)unit < self->n_restored ? &self->restored[unit * FC_SLOTS + slot] : NULL;
    if (restored == NULL || !*restored)
        return FC_OK;
    PyObject *old = PyList_GetItem(self->residuals[slot], unit); /* borrowed */
    if (old == Py_None || self->allocator == Py_None) { /* no allocator: kept where it is */
        *restored = 0;
        return FC_OK;
    }
    const int rdt = fc_state_residual_dtype(self);
    PyObject *numel = PyObject_CallMethod(old, "numel", NULL);
    const long long n = numel != NULL ? PyLong_AsLongLong(numel) : -1;
    Py_XDECREF(numel);
    if (n < 0 && PyErr_Occurred())
        return fc_fail(err, FC_ERR_PYTHON, "");
    PyObject *moved = PyObject_CallFunction(self->allocator, "LsO", n, fc_dtype_name(rdt), grad);
    PyObject *done = moved != NULL ? PyObject_CallMethod(moved, "copy_", "O", old) : NULL;
    if (done == NULL) {
        Py_XDECREF(moved);
        return fc_fail(err, FC_ERR_PYTHON, "");
    }
    Py_DECREF(done);
    if (PyList_SetItem(self->residuals[slot], unit, moved) < 0) /* steals moved */
        return fc_fail(err, FC_ERR_PYTHON, "");
    *restored = 0;
    return FC_OK;
}

int fc_state_residual(StateObject *self, uint32_t unit, int slot, PyObject *grad, const fc_view *g,
                      fc_res_hold *h, fc_err *err)
{
    const int rdt = fc_state_residual_dtype(self);
    const int64_t numel = g->buf.numel;
    PyObject *list = self->residuals[slot];
    while (PyList_Size(list) <= (Py_ssize_t)unit)
        if (PyList_Append(list, Py_None) < 0)
            return fc_fail(err, FC_ERR_PYTHON, "");
    if (move_restored(self, unit, slot, grad, err) != FC_OK)
        return err->code;
    PyObject *res = PyList_GetItem(list, unit); /* borrowed */
    if (res == Py_None) {
        if (self->allocator == Py_None)
            return fc_fail(err, FC_ERR_STATE, "error feedback needs a residual allocator (State(..., "
                           "allocator=...)); fsdpcomp.CommState provides one");
        res = PyObject_CallFunction(self->allocator, "LsO", (long long)stored_numel(rdt, numel),
                                    fc_dtype_name(rdt), grad);
        if (res == NULL)
            return fc_fail(err, FC_ERR_PYTHON, "");
        if (PyList_SetItem(list, unit, res) < 0) /* steals res */
            return fc_fail(err, FC_ERR_PYTHON, "");
    }
    Py_INCREF(res);
    h->res = res;
    char what[64];
    snprintf(what, sizeof(what), "residual of unit %u (slot %s)", unit, fc_slot_names[slot]);
    return view_residual(h, 1u << rdt, g, numel, what, err);
}

int fc_res_adopt(PyObject *res, const fc_view *x, fc_res_hold *h, fc_err *err)
{
    Py_INCREF(res);
    h->res = res;
    return view_residual(h, FC_DT_F32 | FC_DT_BF16 | FC_DT_U8, x, x->buf.numel, "residual", err);
}

/* The cached workspace (self->res_ws) when it can serve h: on h's residual's device, at least
 * numel long. */
static int workspace_fits(const StateObject *self, const fc_res_hold *h, int64_t numel, fc_view *w,
                          fc_err *err)
{
    if (self->res_ws == NULL)
        return 0;
    if (fc_view_get_own(self->res_ws, "residual workspace", FC_DT_F32, w, err) != FC_OK)
        return -1;
    if (w->buf.numel >= numel && w->device_type == h->r.device_type && w->device_id == h->r.device_id)
        return 1;
    fc_view_release(w);
    return 0;
}

int fc_res_in_place(StateObject *self, const fc_exec *x, fc_res_hold *h, uint32_t unit,
                    uint32_t salt)
{
    h->in_place = h->packed && x->b->on_host;
    if (h->in_place)
        self->core.res8_key = fc_res8_key((uint64_t)self->core.common.seed, self->core.step,
                                          unit, salt);
    return h->in_place;
}

int fc_res_workspace(StateObject *self, PyObject *grad, int64_t numel, fc_res_hold *h,
                     fc_err *err)
{
    if (!h->packed || h->in_place)
        return FC_OK;
    /* One workspace per State, reused by every call (one call at a time: fc_state_enter), so a
     * warm call asks the allocator for nothing; it grows to the largest unit seen, on the device
     * of the last call that needed another. */
    const int fits = workspace_fits(self, h, numel, &h->w, err);
    if (fits < 0)
        return err->code;
    if (fits) {
        h->ws = Py_NewRef(self->res_ws);
    }
    else {
        if (self->allocator == Py_None)
            return fc_fail(err, FC_ERR_STATE, "an 8-bit residual is unpacked into a workspace from the "
                           "allocator (State(..., allocator=...)); fsdpcomp.CommState provides one");
        h->ws = PyObject_CallFunction(self->allocator, "LsO", (long long)numel, "float32", grad);
        if (h->ws == NULL)
            return fc_fail(err, FC_ERR_PYTHON, "");
        if (fc_view_get_own(h->ws, "residual workspace", FC_DT_F32, &h->w, err) != FC_OK)
            return err->code;
        PyObject *old = self->res_ws; /* Py_XSETREF's order, outside the limited API */
        self->res_ws = Py_NewRef(h->ws);
        Py_XDECREF(old);
        if (4 * numel > self->res_ws_peak)
            self->res_ws_peak = 4 * numel;
    }
    h->w.buf.numel = numel; /* the call's part of it */
    h->buf = &h->w.buf;
    return FC_OK;
}

int fc_res_unpack(StateObject *self, const fc_exec *x, fc_res_hold *h, fc_err *err)
{
    return h->packed && !h->in_place ? fc_drive_res8_unpack(&self->core, x, &h->r.buf, &h->w.buf, err) : FC_OK;
}

int fc_res_pack(StateObject *self, const fc_exec *x, fc_res_hold *h, uint32_t unit, uint32_t salt,
                fc_err *err)
{
    return h->packed && !h->in_place ? fc_drive_res8_pack(&self->core, x, &h->w.buf, &h->r.buf, unit, salt, err)
                     : FC_OK;
}

void fc_res_release(fc_res_hold *h)
{
    fc_view_release(&h->r);
    fc_view_release(&h->w);
    Py_CLEAR(h->res);
    Py_CLEAR(h->ws);
    h->buf = NULL;
}

/* ---------------------------------------------------------------- the calls for Python's users */

FC_DOCSTRING(fc_state_residual_of_doc,
"residual(unit, slot, like) -> Tensor\n\n"
"The live residual of (unit, slot) ('scatter', 'gather' or 'factors') for a call on `like`\n"
"(its number of values and its device), in this State's residual_dtype (int8: packed uint8):\n"
"made zero by the allocator at first use, a checkpoint's moved to like's device once. The\n"
"caller works on it in place (the all-gather half passes it to compress()); the State keeps\n"
"it, counts it and checkpoints it.");

PyObject *fc_state_residual_of(StateObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"unit", "slot", "like", NULL};
    unsigned unit;
    int slot;
    PyObject *slot_obj, *like;
    fc_err err = {0};
    fc_view v = {0};
    fc_res_hold h = {0};
    if (!fc_state_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "IOO:residual", kwlist, &unit, &slot_obj, &like) ||
        fc_slot_parse(slot_obj, &slot) < 0)
        return NULL;
    if ((long long)unit >= (long long)self->core.n_units)
        return PyErr_Format(PyExc_ValueError, "residual: unit %u is not one begin() gave out (%d units)",
                            unit, (int)self->core.n_units);
    if (fc_view_get(like, "like", FC_DT_F32 | FC_DT_BF16 | FC_DT_F16, &v, &err) != FC_OK ||
        fc_state_residual(self, unit, slot, like, &v, &h, &err) != FC_OK) {
        fc_view_release(&v);
        fc_res_release(&h);
        return STATE_ERR(self, &err);
    }
    PyObject *out = Py_NewRef(h.res);
    fc_view_release(&v);
    fc_res_release(&h);
    return out;
}

FC_DOCSTRING(fc_state_residual_numel_doc,
"residual_numel(numel) -> int\n\n"
"Elements of the tensor that keeps a residual of `numel` values in this State's residual_dtype:\n"
"numel for fp32 and bf16, the bytes of the packed uint8 tensor for int8 (one fp32 scale per\n"
"block of 64 values, then one code per value).");

PyObject *fc_state_residual_numel(StateObject *self, PyObject *arg)
{
    long long n = PyLong_AsLongLong(arg);
    fc_err err = {0};
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (!fc_state_ready(self) || fc_check_numel(n, 0, "numel", &err) != FC_OK)
        return err.code != FC_OK ? STATE_ERR(self, &err) : NULL;
    return PyLong_FromLongLong(stored_numel(fc_state_residual_dtype(self), n));
}

FC_DOCSTRING(fc_state_residual_values_doc,
"residual_values(stored) -> int\n\n"
"The values a residual tensor of `stored` elements holds in this State's residual_dtype:\n"
"residual_numel's inverse (ValueError for a packed size no residual has).");

PyObject *fc_state_residual_values(StateObject *self, PyObject *arg)
{
    long long n = PyLong_AsLongLong(arg);
    fc_err err = {0};
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (!fc_state_ready(self) || fc_check_numel(n, 0, "stored", &err) != FC_OK)
        return err.code != FC_OK ? STATE_ERR(self, &err) : NULL;
    const int64_t values = fc_state_residual_dtype(self) == FC_U8 ? fc_res8_numel(n) : n;
    if (values < 0)
        return PyErr_Format(PyExc_ValueError, "residual_values: no 8-bit residual is %lld bytes long", n);
    return PyLong_FromLongLong(values);
}

FC_DOCSTRING(fc_state_pack_residual_doc,
"pack_residual(e, packed, unit=0)\n\n"
"An fp32 residual e into the uint8 tensor `packed` (residual_numel(e.numel()) bytes, e's device)\n"
"by the int8 residual's rule: stochastic rounding drawn from (seed, step, unit); for a home the\n"
"State does not keep itself (PowerSGD's error). unpack_residual(packed, e) reverses it.");

FC_DOCSTRING(fc_state_unpack_residual_doc,
"unpack_residual(packed, e)\n\n"
"The residual pack_residual() packed, into the fp32 tensor e (on packed's device).");

/* pack_residual and unpack_residual: e and packed viewed and checked, through e's backend. */
static PyObject *residual_transfer(StateObject *self, PyObject *e_obj, PyObject *p_obj,
                                   unsigned unit, int pack)
{
    fc_err err = {0};
    fc_view e = {0};
    fc_res_hold h = {0};
    fc_cuda_call k;
    fc_exec x;
    int rc = FC_ERR_VALUE;
    if (fc_view_get(e_obj, "e", FC_DT_F32, &e, &err) != FC_OK ||
        fc_view_get(p_obj, "packed", FC_DT_U8, &h.r, &err) != FC_OK ||
        fc_check_same_device(&h.r, &e, "packed", &err) != FC_OK ||
        fc_state_exec(self, e_obj, &e, NULL, &k, &x, &err) != FC_OK)
        goto error;
    if ((pack ? h.r.read_only : e.read_only) != 0) {
        fc_fail(&err, FC_ERR_VALUE, "%s is read-only", pack ? "packed" : "e");
        goto error;
    }
    if (h.r.buf.numel != fc_res8_bytes(e.buf.numel)) {
        fc_fail(&err, FC_ERR_VALUE, "packed has %lld bytes, a residual of %lld values needs %lld",
                (long long)h.r.buf.numel, (long long)e.buf.numel,
                (long long)fc_res8_bytes(e.buf.numel));
        goto error;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = pack ? fc_drive_res8_pack(&self->core, &x, &e.buf, &h.r.buf, unit, FC_RES8_SALT_POWERSGD, &err)
              : fc_drive_res8_unpack(&self->core, &x, &h.r.buf, &e.buf, &err);
    Py_END_ALLOW_THREADS
error: /* and success: rc says which */
    fc_view_release(&e);
    fc_res_release(&h);
    if (rc != FC_OK)
        return STATE_ERR(self, &err);
    Py_RETURN_NONE;
}

PyObject *fc_state_pack_residual(StateObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"e", "packed", "unit", NULL};
    PyObject *e, *packed;
    unsigned unit = 0;
    if (!fc_state_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "OO|I:pack_residual", kwlist, &e, &packed, &unit))
        return NULL;
    return residual_transfer(self, e, packed, unit, 1);
}

PyObject *fc_state_unpack_residual(StateObject *self, PyObject *args)
{
    PyObject *e, *packed;
    if (!fc_state_ready(self) || !PyArg_ParseTuple(args, "OO:unpack_residual", &packed, &e))
        return NULL;
    return residual_transfer(self, e, packed, 0, 0);
}
