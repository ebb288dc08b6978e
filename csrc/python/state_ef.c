/* state_ef.c: error feedback for a residual no codec's encode reads (PowerSGD's error e, kept in
 * the State's "factors" slot): g' = g + ef_decay e before the method's own arithmetic, and
 * e = g' - what the mean delivered after it, by the codecs' NaN/Inf and saturation rules
 * (common/fc_ef.h) and counters, on the CPU or the device, in every residual_dtype (an 8-bit one
 * read and packed in place on the CPU, unpacked into the State's workspace around a device's
 * call, as for a codec). So no numerics of a
 * residual are written in Python. */
#include "python/state.h" /* first: it includes Python.h */

#include "common/fc_ef.h"
#include "common/fc_res8.h"

/* ef_add and ef_keep: x (and ref) viewed, the slot's residual held (ADD: none yet -> nothing to
 * add, None returned), the backend's op between the 8-bit unpack and pack. */
static PyObject *ef_call(StateObject *self, int op, PyObject *x_obj, PyObject *ref_obj, unsigned unit,
                         PyObject *slot_obj)
{
    int slot = FC_SLOT_FACTORS, rc = FC_ERR_VALUE;
    fc_err err = {0};
    fc_view xv = {0}, rv = {0};
    fc_res_hold h = {0};
    fc_cuda_call k;
    fc_exec ex;
    if (slot_obj != NULL && fc_slot_parse(slot_obj, &slot) < 0)
        return NULL;
    if ((long long)unit >= (long long)self->core.n_units)
        return PyErr_Format(PyExc_ValueError, "%s: unit %u is not one begin() gave out (%d units)",
                            op == FC_EF_ADD ? "ef_add" : "ef_keep", unit, (int)self->core.n_units);
    PyObject *list = self->residuals[slot]; /* a restored residual is in it already */
    if (op == FC_EF_ADD && (PyList_Size(list) <= (Py_ssize_t)unit || PyList_GetItem(list, unit) == Py_None))
        Py_RETURN_NONE; /* the unit's first step: no residual yet, g' = g */
    if (fc_view_get(x_obj, "x", FC_DT_F32, &xv, &err) != FC_OK)
        goto error;
    if (xv.read_only) {
        fc_fail(&err, FC_ERR_VALUE, "x is read-only");
        goto error;
    }
    if (op == FC_EF_KEEP && (fc_view_get(ref_obj, "ref", FC_DT_F32, &rv, &err) != FC_OK ||
                             fc_check_same_device(&rv, &xv, "ref", &err) != FC_OK))
        goto error;
    if (fc_state_exec(self, x_obj, &xv, NULL, &k, &ex, &err) != FC_OK ||
        fc_state_residual(self, unit, slot, x_obj, &xv, &h, &err) != FC_OK)
        goto error;
    (void)fc_res_in_place(self, &ex, &h, unit, FC_RES8_SALT_POWERSGD);
    if (fc_res_workspace(self, x_obj, xv.buf.numel, &h, &err) != FC_OK)
        goto error;
    Py_BEGIN_ALLOW_THREADS
    rc = op == FC_EF_ADD ? fc_res_unpack(self, &ex, &h, &err) : FC_OK;
    if (rc == FC_OK)
        rc = fc_drive_ef(&self->core, &ex, op, &xv.buf, op == FC_EF_KEEP ? &rv.buf : NULL, h.buf, &err);
    if (rc == FC_OK && op == FC_EF_KEEP)
        rc = fc_res_pack(self, &ex, &h, unit, FC_RES8_SALT_POWERSGD, &err);
    Py_END_ALLOW_THREADS
error: /* and success: rc says which */
    fc_view_release(&xv);
    fc_view_release(&rv);
    fc_res_release(&h);
    if (rc != FC_OK)
        return STATE_ERR(self, &err);
    Py_RETURN_NONE;
}

FC_DOCSTRING(fc_state_ef_add_doc,
"ef_add(x, unit, slot='factors')\n\n"
"x (fp32, in place) = x + ef_decay * e, e the residual of (unit, slot): a codec's g' = g + e\n"
"with its rules (a NaN/Inf of x counted in nonfinite_in, and in \"zero\" mode e sent there; a sum\n"
"of finite values beyond fp32 saturated and counted). Nothing where the slot holds no residual\n"
"yet (the unit's first step). For a method whose arithmetic is its own (PowerSGD).");

PyObject *fc_state_ef_add(StateObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"x", "unit", "slot", NULL};
    PyObject *x, *slot = NULL;
    unsigned unit;
    if (!fc_state_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "OI|O:ef_add", kwlist, &x, &unit, &slot))
        return NULL;
    return ef_call(self, FC_EF_ADD, x, NULL, unit, slot);
}

FC_DOCSTRING(fc_state_ef_keep_doc,
"ef_keep(x, ref, unit, slot='factors')\n\n"
"The residual of (unit, slot) = x - ref (x: g', ref: what the mean delivered of it, both fp32 of\n"
"one length on one device), by a codec's residual rule: 0 where x is not finite, never NaN/Inf,\n"
"a value beyond fp32 saturated (counted); stored in residual_dtype (int8: packed, its rounding\n"
"drawn from (seed, step, unit)). The residual is made at its first keep.");

PyObject *fc_state_ef_keep(StateObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"x", "ref", "unit", "slot", NULL};
    PyObject *x, *ref, *slot = NULL;
    unsigned unit;
    if (!fc_state_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "OOI|O:ef_keep", kwlist, &x, &ref, &unit, &slot))
        return NULL;
    return ef_call(self, FC_EF_KEEP, x, ref, unit, slot);
}
