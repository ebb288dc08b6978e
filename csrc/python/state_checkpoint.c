/* state_checkpoint.c: the State's checkpoint calls: units, residuals and unit states out,
 * restore in (everything validated before anything changes). */
#include "python/state.h" /* first: it includes Python.h */
#include <stdlib.h>
#include <string.h>

#include "common/fc_half.h"
#include "common/fc_quant.h"
#include "common/fc_res8.h"

FC_DOCSTRING(fc_state_units_doc, "units() -> list[int]\n\nElements of each unit, in call order.");

PyObject *fc_state_units(StateObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!fc_state_ready(self))
        return NULL;
    PyObject *list = PyList_New(self->core.n_units);
    for (int32_t u = 0; list != NULL && u < self->core.n_units; u++) {
        PyObject *v = PyLong_FromLongLong(self->core.units[u].numel);
        if (v == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SetItem(list, u, v);
    }
    return list;
}

FC_DOCSTRING(fc_state_residuals_doc, "residuals() -> list\n\nThe residual tensor of each unit (None where there is none yet). The tensors are the live ones.");

PyObject *fc_state_residuals(StateObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!fc_state_ready(self))
        return NULL;
    return PyList_GetSlice(self->residuals, 0, PyList_Size(self->residuals));
}

FC_DOCSTRING(fc_state_unit_states_doc,
"unit_states() -> list\n\n"
"The persistent method state of each unit (gradiveq's basis) as fp32 bytes, None where the\n"
"method keeps none or the unit has not run yet. Copies, for checkpoints.");

PyObject *fc_state_unit_states(StateObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!fc_state_ready(self))
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
        PyList_SetItem(list, u, v); /* steals v */
    }
    return list;
}

/* Copies of the checkpointed unit states into table[u].ustate, each validated by the method;
 * nothing of the live state is touched. */
static int load_unit_states(StateObject *self, PyObject *states, fc_unit *table, Py_ssize_t n)
{
    if (PyList_Size(states) > n) {
        PyErr_Format(PyExc_ValueError, "restore: %zd unit states for %zd units",
                     PyList_Size(states), n);
        return -1;
    }
    for (Py_ssize_t u = 0; u < PyList_Size(states); u++) {
        PyObject *t = PyList_GetItem(states, u); /* borrowed */
        if (t == Py_None)
            continue;
        fc_view v = {0};
        fc_err err = {0};
        if (fc_view_get(t, "unit state", FC_DT_F32, &v, &err) != FC_OK ||
            fc_check_cpu(&v, "unit state", &err) != FC_OK ||
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

/* A residual the driver could have written: every element finite (CPU tensors; the Python
 * side checks device ones with torch). 0, or -1 with ValueError naming residuals[u]. */
static int check_residual_values(const fc_view *v, Py_ssize_t u, int64_t numel)
{
    if (v->device_type != kDLCPU)
        return 0;
    /* an 8-bit residual's scales (fc_res8.h) are fp32 and finite; any code is a valid one */
    const int64_t count = v->buf.dtype == FC_U8 ? fc_res8_blocks(numel) : v->buf.numel;
    for (int64_t i = 0; i < count; i++) {
        const float x = v->buf.dtype != FC_BF16 ? ((const float *)v->buf.data)[i]
                                               : fc_bf16_to_f32(((const uint16_t *)v->buf.data)[i]);
        if (!(fc_abs_bits(x) < FC_INF_BITS)) {
            PyErr_Format(PyExc_ValueError, "restore: residuals[%zd] element %lld is %s: a residual "
                         "never holds NaN/Inf (a corrupted checkpoint?)", u, (long long)i,
                         fc_abs_bits(x) > FC_INF_BITS ? "nan" : x > 0 ? "inf" : "-inf");
            return -1;
        }
    }
    return 0;
}

FC_DOCSTRING(fc_state_restore_doc,
"restore(units, residuals, step, unit_states=None)\n\n"
"Loads a checkpoint: the unit sizes, one residual (tensor or None) per unit, the step (in\n"
"[0, 2^32)), and the units' method states (fp32 CPU tensors or None, from unit_states(); None\n"
"restarts them from the seed). Everything is validated before anything is changed: sizes,\n"
"dtypes, finite residuals, the step's range. The residuals are kept as given until their unit's\n"
"first call, which moves each into a tensor from the allocator on that call's device (a\n"
"checkpoint saved on a GPU resumes on the CPU, and the other way).");

PyObject *fc_state_restore(StateObject *self, PyObject *args)
{
    PyObject *units, *residuals, *states = Py_None, *new_list = NULL, *step_obj;
    unsigned long long step;
    fc_unit *table = NULL;
    uint8_t *restored = NULL;
    Py_ssize_t n = 0;
    if (!fc_state_ready(self) || !PyArg_ParseTuple(args, "O!O!O|O:restore", &PyList_Type, &units, &PyList_Type,
                                                   &residuals, &step_obj, &states))
        return NULL;
    {
        int overflow = 0;
        long long s = PyLong_Check(step_obj) ? PyLong_AsLongLongAndOverflow(step_obj, &overflow) : -1;
        if (PyErr_Occurred())
            return NULL;
        if (!PyLong_Check(step_obj) || PyBool_Check(step_obj) || overflow || s < 0 ||
            s > (long long)UINT32_MAX) {
            PyObject *r = PyObject_Repr(step_obj);
            if (r != NULL)
                PyErr_Format(PyExc_ValueError, "restore: step must be in [0, 2^32) (an int), got %U", r);
            Py_XDECREF(r);
            return NULL;
        }
        step = (unsigned long long)s;
    }
    if (states != Py_None && !PyList_Check(states)) {
        PyErr_Format(PyExc_TypeError, "restore: unit_states must be a list or None, got %s",
                     FC_TYPE_NAME(states));
        return NULL;
    }
    n = PyList_Size(units);
    const int rdt = fc_state_residual_dtype(self);
    if (PyList_Size(residuals) > n) {
        PyErr_Format(PyExc_ValueError, "restore: %zd residuals for %zd units", PyList_Size(residuals), n);
        return NULL;
    }
    table = (fc_unit *)calloc((size_t)(n > 0 ? n : 1), sizeof(fc_unit));
    restored = (uint8_t *)calloc((size_t)(n > 0 ? n : 1), 1);
    new_list = PyList_New(0);
    if (table == NULL || restored == NULL || new_list == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t u = 0; u < n; u++) {
        long long numel = PyLong_AsLongLong(PyList_GetItem(units, u));
        if ((numel == -1 && PyErr_Occurred()) || numel < 0 || numel > FC_MAX_NUMEL) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "restore: units[%zd] must be an int in [0, 2^44]", u);
            goto error;
        }
        table[u].numel = numel;
        PyObject *r = u < PyList_Size(residuals) ? PyList_GetItem(residuals, u) : Py_None;
        if (r != Py_None) {
            fc_view v;
            fc_err err = {0};
            if (fc_view_get(r, "residual", 1u << rdt, &v, &err) != FC_OK) {
                STATE_ERR(self, &err);
                goto error;
            }
            const int64_t got = v.buf.numel, want = rdt == FC_U8 ? fc_res8_bytes(numel) : numel;
            const int bad = got == want && check_residual_values(&v, u, numel);
            fc_view_release(&v);
            if (bad)
                goto error;
            if (got != want) {
                PyErr_Format(PyExc_ValueError, "restore: residual %zd has %lld elements, unit has "
                             "%lld%s", u, (long long)got, numel,
                             rdt == FC_U8 ? " (an 8-bit residual holds fc_res8_bytes of them)" : "");
                goto error;
            }
        }
        if (PyList_Append(new_list, r) < 0)
            goto error;
        restored[u] = r != Py_None; /* the checkpoint's tensor, on the device it was saved from:
                                       state_residual.c moves it at the unit's first call */
    }
    if (states != Py_None && load_unit_states(self, states, table, n) < 0)
        goto error;
    fc_core_free_unit_states(&self->core); /* units without a saved state restart from the seed */
    fc_state_cuda_forget_units(self);      /* and their device copies follow the new ones */
    free(self->core.units);
    self->core.units = table;
    self->core.n_units = self->core.cap_units = (int32_t)(n > 0 ? n : 1);
    self->core.n_units = (int32_t)n;
    self->core.step = (uint32_t)step;
    self->core.cursor = 0;
    free(self->restored);
    self->restored = restored;
    self->n_restored = n;
    PyObject *old = self->residuals; /* Py_SETREF's order: the field is never left dangling */
    self->residuals = new_list;
    Py_DECREF(old);
    Py_RETURN_NONE;
error:
    for (Py_ssize_t u = 0; table != NULL && u < n; u++)
        free(table[u].ustate);
    free(table);
    free(restored);
    Py_XDECREF(new_list);
    return NULL;
}
