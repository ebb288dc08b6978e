/* state_parts.c: the State's parts tables (adaptive): set_parts hands a unit's table, chosen by
 * Python, to the core (fc_core_set_parts), which checks it and keeps it with the unit. */
#include "python/state.h" /* first: it includes Python.h */

FC_DOCSTRING(fc_state_set_parts_doc,
"set_parts(unit, ends, rungs)\n\n"
"The parts table of `unit` (method 'adaptive'): part i covers elements [ends[i-1], ends[i]) of\n"
"the unit (from 0) and goes as ladder rung rungs[i] (method_info('adaptive')['ladder']).\n"
"ends: an int64 CPU tensor, strictly ascending, the last the unit's numel; rungs: a uint8 CPU\n"
"tensor of the same length. Every rank must set the same table (a payload under another one is\n"
"refused). Until the first call a unit is one part of rung 0 (fp32, exact). A refused table\n"
"changes nothing.");

PyObject *fc_state_set_parts(StateObject *self, PyObject *args)
{
    PyObject *ends_obj, *rungs_obj;
    long long unit;
    fc_err err = {0};
    fc_view e = {0}, r = {0};
    PyObject *out = NULL;
    if (!fc_state_ready(self) || !PyArg_ParseTuple(args, "LOO:set_parts", &unit, &ends_obj, &rungs_obj))
        return NULL;
    if (fc_view_get(ends_obj, "ends", FC_DT_I64, &e, &err) != FC_OK || fc_check_cpu(&e, "ends", &err) ||
        fc_view_get(rungs_obj, "rungs", FC_DT_U8, &r, &err) != FC_OK || fc_check_cpu(&r, "rungs", &err))
        goto error;
    if (e.buf.numel != r.buf.numel) {
        fc_fail(&err, FC_ERR_VALUE, "set_parts: ends has %lld entries, rungs %lld: one rung per part",
                (long long)e.buf.numel, (long long)r.buf.numel);
        goto error;
    }
    if (fc_core_set_parts(&self->core, (int64_t)unit, (const int64_t *)e.buf.data,
                          (const uint8_t *)r.buf.data, e.buf.numel, &err) != FC_OK)
        goto error;
    out = Py_None;
    Py_INCREF(out);
error:
    fc_view_release(&e);
    fc_view_release(&r);
    return out != NULL ? out : STATE_ERR(self, &err);
}
