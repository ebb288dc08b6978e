/* state_units.c: the State's units and steps: claiming a unit, the end of a step, and the
 * unit-state sync over ranks (gradiveq's covariance). */
#include "python/state.h" /* first: it includes Python.h */

FC_DOCSTRING(fc_state_begin_doc,
"begin(numel, unit=-1, new_step=False) -> unit\n\n"
"Claims the unit of a call of `numel` elements: `unit` (one seen before, or the next new index)\n"
"or, with unit=-1, the next one in call order within this step. new_step ends the step first\n"
"(as end_step() would). A unit seen before must have the same number of elements; a refused\n"
"claim changes nothing.");

PyObject *fc_state_begin(StateObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"numel", "unit", "new_step", NULL};
    long long numel, want = -1;
    int new_step = 0;
    fc_err err = {0};
    uint32_t unit;
    if (!fc_state_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "L|Lp:begin", kwlist, &numel, &want, &new_step))
        return NULL;
    if (fc_check_numel(numel, 0, "numel", &err) != FC_OK)
        return STATE_ERR(self, &err);
    if (fc_core_begin(&self->core, (int64_t)numel, want < 0 ? -1 : (int64_t)want, new_step, &unit,
                      &err) != FC_OK)
        return STATE_ERR(self, &err);
    return PyLong_FromUnsignedLong(unit);
}

FC_DOCSTRING(fc_state_end_step_doc, "end_step()\n\nMarks the end of a backward pass: the next begin() is unit 0 of the next step.");

PyObject *fc_state_end_step(StateObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!fc_state_ready(self))
        return NULL;
    fc_core_end_step(&self->core);
    Py_RETURN_NONE;
}

FC_DOCSTRING(fc_state_sync_vector_doc,
"sync_vector(unit) -> bytes | None\n\n"
"After this step's decode of `unit`: the fp32 values the ranks must sum (all-reduce) and hand\n"
"to sync_apply(), or None when the method has nothing to sync this step (gradiveq's basis).");

PyObject *fc_state_sync_vector(StateObject *self, PyObject *arg)
{
    if (!fc_state_ready(self))
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
    fc_err err = {0};
    if (fc_state_cuda_sync_pull(self, (uint32_t)unit, &err) != FC_OK) /* summed on a GPU */
        return STATE_ERR(self, &err);
    fc_core_sync_span(&self->core, (uint32_t)unit, &data, &len);
    if (len == 0)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)(len * 4));
}

FC_DOCSTRING(fc_state_sync_apply_doc,
"sync_apply(unit, summed)\n\nHands the sum over ranks of sync_vector(unit) (an fp32 CPU tensor) back.");

PyObject *fc_state_sync_apply(StateObject *self, PyObject *args)
{
    PyObject *t;
    long long unit;
    fc_err err = {0};
    fc_view v = {0};
    if (!fc_state_ready(self) || !PyArg_ParseTuple(args, "LO:sync_apply", &unit, &t))
        return NULL;
    if (unit < 0 || unit >= self->core.n_units) {
        PyErr_Format(PyExc_ValueError, "unit must be in [0, %d), got %lld", self->core.n_units, unit);
        return NULL;
    }
    if (fc_view_get(t, "summed", FC_DT_F32, &v, &err) != FC_OK ||
        fc_check_cpu(&v, "summed", &err) ||
        fc_core_sync_apply(&self->core, (uint32_t)unit, (const float *)v.buf.data, v.buf.numel, &err)) {
        fc_view_release(&v);
        return STATE_ERR(self, &err);
    }
    fc_view_release(&v);
    fc_state_cuda_sync_done(self, (uint32_t)unit);
    Py_RETURN_NONE;
}
