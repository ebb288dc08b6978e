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

FC_DOCSTRING(fc_state_residuals_doc,
"residuals(slot='scatter') -> list\n\n"
"The residual tensor of each unit in one slot ('scatter': the reduce-scatter's, 'gather': the\n"
"all-gather half's, 'factors': PowerSGD's error), one entry per unit (None where there is none\n"
"yet), so a checkpoint of it reads back as it was saved. The tensors are the live ones.");

PyObject *fc_state_residuals(StateObject *self, PyObject *args)
{
    PyObject *slot_obj = NULL;
    int slot = FC_SLOT_SCATTER;
    if (!fc_state_ready(self) || !PyArg_ParseTuple(args, "|O:residuals", &slot_obj) ||
        (slot_obj != NULL && fc_slot_parse(slot_obj, &slot) < 0))
        return NULL;
    PyObject *kept = self->residuals[slot];
    const Py_ssize_t n = self->core.n_units, have = PyList_Size(kept);
    PyObject *list = PyList_New(n);
    for (Py_ssize_t u = 0; list != NULL && u < n; u++)
        PyList_SetItem(list, u, Py_NewRef(u < have ? PyList_GetItem(kept, u) : Py_None));
    return list;
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

/* A NaN/Inf at element i of what: ValueError (-1). */
static int refuse_nonfinite(const char *what, const char *part, int64_t i, float x)
{
    PyErr_Format(PyExc_ValueError, "%s%s %lld is %s: a residual never holds NaN/Inf (a corrupted "
                 "checkpoint?)", what, part, (long long)i,
                 fc_abs_bits(x) > FC_INF_BITS ? "nan" : x > 0 ? "inf" : "-inf");
    return -1;
}

/* Every value of a residual on the host finite: fp32 and bf16 elements, an 8-bit residual's
 * scales (fc_res8.h; any code is a valid one). 0, or -1 with ValueError naming what. */
static int check_host_values(const fc_view *v, int64_t numel, const char *what)
{
    const int packed = v->buf.dtype == FC_U8;
    const int64_t count = packed ? fc_res8_blocks(numel) : v->buf.numel;
    for (int64_t i = 0; i < count; i++) {
        const float x = v->buf.dtype != FC_BF16 ? ((const float *)v->buf.data)[i]
                                               : fc_bf16_to_f32(((const uint16_t *)v->buf.data)[i]);
        if (!(fc_abs_bits(x) < FC_INF_BITS))
            return refuse_nonfinite(what, packed ? "'s scale of block" : " element", i, x);
    }
    return 0;
}

/* The one check of a residual a checkpoint brings, whichever home keeps it (the State's per
 * unit, the all-gather half's, PowerSGD's error): a tensor of one of `dtypes`, holding numel
 * values (-1: as many as its size holds; a packed size no residual has is refused), every value
 * finite and, packed, every block's scale finite. A device tensor (and, under emulation, any)
 * is copied to the host for the values: a restore's cost, once, not a call's. Returns the
 * values' count, or -1 with TypeError/ValueError naming what. */
static int64_t check_residual(StateObject *self, PyObject *r, unsigned dtypes, int64_t numel,
                              const char *what)
{
    fc_view v = {0};
    fc_err err = {0};
    if (fc_view_get(r, what, dtypes, &v, &err) != FC_OK) {
        STATE_ERR(self, &err);
        return -1;
    }
    const int packed = v.buf.dtype == FC_U8;
    const int64_t stored = v.buf.numel, values = packed ? fc_res8_numel(stored) : stored;
    const int on_host = v.device_type == kDLCPU && !self->emulate_cuda;
    fc_view_release(&v);
    if (values < 0) {
        PyErr_Format(PyExc_ValueError, "%s has %zd bytes: no 8-bit residual is that long (4 bytes "
                     "per 64 values, then one per value)", what, (Py_ssize_t)stored);
        return -1;
    }
    if (numel >= 0 && values != numel) {
        PyErr_Format(PyExc_ValueError, "%s has %zd elements, its unit needs %lld%s", what,
                     (Py_ssize_t)stored, (long long)(packed ? fc_res8_bytes(numel) : numel),
                     packed ? " (an 8-bit residual of that many values: fc_res8_bytes)" : "");
        return -1;
    }
    PyObject *host = on_host ? Py_NewRef(r) : PyObject_CallMethod(r, "cpu", NULL);
    if (host == NULL)
        return -1;
    int bad = fc_view_get(host, what, dtypes, &v, &err) != FC_OK;
    if (bad)
        STATE_ERR(self, &err);
    else
        bad = check_host_values(&v, values, what);
    fc_view_release(&v);
    Py_DECREF(host);
    return bad ? -1 : values;
}

FC_DOCSTRING(fc_state_check_residual_doc,
"check_residual(r, what, numel=-1) -> int\n\n"
"The restore check of a residual that a home other than this State keeps (the all-gather\n"
"half's, PowerSGD's error), the one restore() applies to the State's own: r fp32, bf16 or, with\n"
"residual_dtype int8, packed uint8; numel values (-1: as many as its size holds); every value\n"
"and every 8-bit scale finite, on any device. Returns the values' count; ValueError/TypeError\n"
"naming `what`.");

PyObject *fc_state_check_residual(StateObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"r", "what", "numel", NULL};
    PyObject *r;
    const char *what;
    long long numel = -1;
    if (!fc_state_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "Os|L:check_residual", kwlist, &r, &what, &numel))
        return NULL;
    const unsigned dtypes = FC_DT_F32 | FC_DT_BF16 | (fc_state_residual_dtype(self) == FC_U8 ? FC_DT_U8 : 0);
    const int64_t values = check_residual(self, r, dtypes, numel, what);
    return values < 0 ? NULL : PyLong_FromLongLong(values);
}

FC_DOCSTRING(fc_state_restore_doc,
"restore(units, residuals, step, unit_states=None)\n\n"
"Loads a checkpoint: the unit sizes; the residuals, a dict of slot -> one residual (tensor or\n"
"None) per unit (slots 'scatter', 'gather', 'factors'; a list: the 'scatter' slot's); the step\n"
"(in [0, 2^32)), and the units' method states (fp32 CPU tensors or None, from unit_states();\n"
"None restarts them from the seed). Everything is validated before anything is changed: sizes,\n"
"dtypes, finite residuals and 8-bit scales, the step's range; a slot not given starts empty.\n"
"The residuals are kept as given until their first call, which moves each into a tensor from\n"
"the allocator on that call's device (a checkpoint saved on a GPU resumes on the CPU, and the\n"
"other way).");

/* restore()'s residuals argument as one list (borrowed) or NULL per slot: -1 with the error. */
static int residuals_by_slot(PyObject *residuals, Py_ssize_t n, PyObject *lists[FC_SLOTS])
{
    for (int slot = 0; slot < FC_SLOTS; slot++)
        lists[slot] = NULL;
    if (PyList_Check(residuals)) {
        lists[FC_SLOT_SCATTER] = residuals;
    }
    else if (PyDict_Check(residuals)) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        int slot;
        while (PyDict_Next(residuals, &pos, &key, &value)) {
            if (fc_slot_parse(key, &slot) < 0)
                return -1;
            if (!PyList_Check(value)) {
                PyErr_Format(PyExc_TypeError, "restore: residuals['%s'] must be a list, one entry per unit, "
                             "got %s", fc_slot_names[slot], FC_TYPE_NAME(value));
                return -1;
            }
            lists[slot] = value;
        }
    }
    else {
        PyErr_Format(PyExc_TypeError, "restore: residuals must be a dict of slot -> list (or a list), got %s",
                     FC_TYPE_NAME(residuals));
        return -1;
    }
    for (int slot = 0; slot < FC_SLOTS; slot++)
        if (lists[slot] != NULL && PyList_Size(lists[slot]) > n) {
            PyErr_Format(PyExc_ValueError, "restore: %zd '%s' residuals for %zd units",
                         PyList_Size(lists[slot]), fc_slot_names[slot], n);
            return -1;
        }
    return 0;
}

/* The step restore() was given: [0, 2^32) as an int, or -1 with ValueError. */
static long long step_arg(PyObject *step_obj)
{
    int overflow = 0;
    long long s = PyLong_Check(step_obj) ? PyLong_AsLongLongAndOverflow(step_obj, &overflow) : -1;
    if (PyErr_Occurred())
        return -1;
    if (!PyLong_Check(step_obj) || PyBool_Check(step_obj) || overflow || s < 0 || s > (long long)UINT32_MAX) {
        PyObject *r = PyObject_Repr(step_obj);
        if (r != NULL)
            PyErr_Format(PyExc_ValueError, "restore: step must be in [0, 2^32) (an int), got %U", r);
        Py_XDECREF(r);
        return -1;
    }
    return s;
}

PyObject *fc_state_restore(StateObject *self, PyObject *args)
{
    PyObject *units, *residuals, *states = Py_None, *step_obj, *lists[FC_SLOTS], *fresh[FC_SLOTS] = {0};
    fc_unit *table = NULL;
    uint8_t *restored = NULL;
    Py_ssize_t n = 0;
    if (!fc_state_ready(self) ||
        !PyArg_ParseTuple(args, "O!OO|O:restore", &PyList_Type, &units, &residuals, &step_obj, &states))
        return NULL;
    const long long step = step_arg(step_obj);
    if (step < 0)
        return NULL;
    if (states != Py_None && !PyList_Check(states)) {
        PyErr_Format(PyExc_TypeError, "restore: unit_states must be a list or None, got %s",
                     FC_TYPE_NAME(states));
        return NULL;
    }
    n = PyList_Size(units);
    const int rdt = fc_state_residual_dtype(self);
    if (residuals_by_slot(residuals, n, lists) < 0)
        return NULL;
    table = (fc_unit *)calloc((size_t)(n > 0 ? n : 1), sizeof(fc_unit));
    restored = (uint8_t *)calloc((size_t)(n > 0 ? n : 1) * FC_SLOTS, 1);
    if (table == NULL || restored == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (int slot = 0; slot < FC_SLOTS; slot++)
        if ((fresh[slot] = PyList_New(0)) == NULL)
            goto error;
    for (Py_ssize_t u = 0; u < n; u++) {
        long long numel = PyLong_AsLongLong(PyList_GetItem(units, u));
        if ((numel == -1 && PyErr_Occurred()) || numel < 0 || numel > FC_MAX_NUMEL) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "restore: units[%zd] must be an int in [0, 2^44]", u);
            goto error;
        }
        table[u].numel = numel;
        for (int slot = 0; slot < FC_SLOTS; slot++) {
            PyObject *list = lists[slot];
            PyObject *r = list != NULL && u < PyList_Size(list) ? PyList_GetItem(list, u) : Py_None;
            char what[64];
            snprintf(what, sizeof(what), "state_dict residuals['%s'][%zd]", fc_slot_names[slot], u);
            /* the all-gather half's holds its shard, whose size the world decides: any size */
            const int64_t values = slot == FC_SLOT_GATHER ? -1 : numel;
            if (r != Py_None && check_residual(self, r, 1u << rdt, values, what) < 0)
                goto error;
            if (PyList_Append(fresh[slot], r) < 0)
                goto error;
            /* the checkpoint's tensor, on the device it was saved from: state_residual.c moves it
               at its first call */
            restored[u * FC_SLOTS + slot] = r != Py_None;
        }
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
    for (int slot = 0; slot < FC_SLOTS; slot++) {
        PyObject *old = self->residuals[slot]; /* Py_SETREF's order: never left dangling */
        self->residuals[slot] = fresh[slot];
        Py_DECREF(old);
    }
    Py_RETURN_NONE;
error:
    for (Py_ssize_t u = 0; table != NULL && u < n; u++)
        free(table[u].ustate);
    free(table);
    free(restored);
    for (int slot = 0; slot < FC_SLOTS; slot++)
        Py_XDECREF(fresh[slot]);
    return NULL;
}
