/* state_fetch.c: the State's calls for the second round of a two-round method (fc_fetch.c, or
 * fc_cuda_path.c on CUDA tensors): fetch_kmax, fetch_picks, fetch, finish. */
#include "python/state.h" /* first: it includes Python.h */

#include "driver/fc_fetch.h"
#include "common/fc_res8.h"

FC_DOCSTRING(fc_state_fetch_kmax_doc,
"fetch_kmax(numel, world) -> int\n\n"
"Coordinates each owner picks for the second round of a unit of `numel` elements (the\n"
"all-gather's size per rank); 0 when the unit has no second round.");

PyObject *fc_state_fetch_kmax(StateObject *self, PyObject *args)
{
    long long numel;
    int world;
    fc_err err = {0};
    if (!fc_state_ready(self) || !PyArg_ParseTuple(args, "Li:fetch_kmax", &numel, &world))
        return NULL;
    if (fc_check_numel(numel, 0, "numel", &err) != FC_OK || fc_check_world(world, 0, &err) != FC_OK)
        return STATE_ERR(self, &err);
    return PyLong_FromLongLong(fc_core_fetch_kmax(&self->core, numel, world));
}

/* A uint8 tensor viewed as `count` uint32 (picks) or fp32 (values), aligned, on the device of
 * `like` (NULL: the CPU, or a CUDA device when the call is on one). */
static int words_view(PyObject *t, const char *arg, const fc_view *like, fc_view *v, fc_err *err)
{
    if (fc_view_get(t, arg, FC_DT_U8, v, err) != FC_OK ||
        (like != NULL ? fc_check_same_device(v, like, arg, err)
                      : v->device_type == kDLCUDA ? FC_OK : fc_check_cpu(v, arg, err)) != FC_OK ||
        fc_check_aligned(v, arg, err) != FC_OK)
        return err->code;
    if (v->buf.numel % 4 != 0)
        return fc_fail(err, FC_ERR_VALUE, "%s has %lld bytes, not a whole number of 4-byte words",
                       arg, (long long)v->buf.numel);
    return FC_OK;
}

/* The round's backend, ready with what the decode that picked left for it. */
static int round_backend(StateObject *self, PyObject *like, const fc_view *v, fc_cuda_call *k,
                         fc_exec *x, fc_err *err)
{
    const fc_prep p = {FC_PREP_FETCH, &v->buf, NULL, NULL, 0, 0, 0, 0};
    return fc_state_exec(self, like, v, &p, k, x, err);
}

FC_DOCSTRING(fc_state_fetch_picks_doc,
"fetch_picks(unit, picks)\n\n"
"After decode() of a unit with a second round: writes this rank's picked coordinates, padded\n"
"with 0xFFFFFFFF, into `picks` (a uint8 view of fetch_kmax() uint32 words).");

PyObject *fc_state_fetch_picks(StateObject *self, PyObject *args)
{
    PyObject *picks;
    long long unit;
    int rc = FC_ERR_VALUE; /* until the picks are written */
    fc_err err = {0};
    fc_view v = {0};
    fc_cuda_call k;
    fc_exec x;
    if (!fc_state_ready(self) || !PyArg_ParseTuple(args, "LO:fetch_picks", &unit, &picks))
        return NULL;
    if (words_view(picks, "picks", NULL, &v, &err) != FC_OK)
        goto error;
    if (unit < 0 || unit > UINT32_MAX) {
        fc_fail(&err, FC_ERR_VALUE, "unit must be a unit index, got %lld", unit);
        goto error;
    }
    /* a CUDA decode's picks stay on its device */
    if (round_backend(self, picks, &v, &k, &x, &err) != FC_OK)
        goto error;
    Py_BEGIN_ALLOW_THREADS
    rc = fc_fetch_picks(&self->core, &x, (uint32_t)unit, (uint32_t *)v.buf.data,
                        v.buf.numel / 4, &err);
    Py_END_ALLOW_THREADS
error: /* and success: rc says which */
    fc_view_release(&v);
    if (rc != FC_OK)
        return STATE_ERR(self, &err);
    Py_RETURN_NONE;
}

FC_DOCSTRING(fc_state_fetch_doc,
"fetch(all_picks, grad, send, world, rank, unit) -> (send_splits, recv_splits)\n\n"
"all_picks: every owner's picks (world x fetch_kmax() uint32, as uint8). Writes this rank's\n"
"exact error-fed values at each owner's picks into `send` (uint8 view of fp32), back to back,\n"
"takes them out of the residual and counts their bytes; splits are in fp32 values.");

PyObject *fc_state_fetch(StateObject *self, PyObject *args)
{
    PyObject *picks, *grad, *send, *result = NULL;
    int world, rank, rc = FC_ERR_VALUE; /* until the values are gathered */
    long long unit;
    fc_err err = {0};
    fc_view pv = {0}, g = {0}, sv = {0};
    fc_res_hold r = {0};
    int64_t ss[FC_MAX_WORLD], rs[FC_MAX_WORLD];
    if (!fc_state_ready(self) ||
        !PyArg_ParseTuple(args, "OOOiiL:fetch", &picks, &grad, &send, &world, &rank, &unit))
        return NULL;
    fc_cuda_call k;
    fc_exec x;
    if (fc_view_get(grad, "grad", FC_DT_FLOATS, &g, &err) != FC_OK ||
        words_view(picks, "all_picks", &g, &pv, &err) != FC_OK ||
        words_view(send, "send", &g, &sv, &err) != FC_OK || fc_check_world(world, rank, &err) ||
        fc_state_check_unit(self, unit, g.buf.numel, &err))
        goto error;
    const int64_t kmax = fc_core_fetch_kmax(&self->core, g.buf.numel, world);
    if (pv.buf.numel != 4 * kmax * world) {
        fc_fail(&err, FC_ERR_VALUE, "all_picks has %lld bytes, %d ranks of %lld picks need %lld",
                (long long)pv.buf.numel, world, (long long)kmax, (long long)(4 * kmax * world));
        goto error;
    }
    /* the driver's decision, as the encode of round 1 took it (a unit with a second round goes
     * out with its method whatever the dtype: fc_core_wire_method) */
    const int use_ef = fc_drive_uses_residual(&self->core, g.buf.numel, world, g.buf.dtype);
    if (use_ef && fc_state_residual(self, (uint32_t)unit, FC_SLOT_SCATTER, grad, &g, &r, &err) != FC_OK)
        goto error;
    if (round_backend(self, grad, &g, &k, &x, &err) != FC_OK)
        goto error;
    if (use_ef)
        (void)fc_res_in_place(self, &x, &r, (uint32_t)unit, FC_RES8_SALT_FETCH);
    if (use_ef && fc_res_workspace(self, grad, g.buf.numel, &r, &err) != FC_OK)
        goto error;
    Py_BEGIN_ALLOW_THREADS
    rc = use_ef ? fc_res_unpack(self, &x, &r, &err) : FC_OK;
    if (rc == FC_OK)
        rc = fc_fetch_values(&self->core, &x, (const uint32_t *)pv.buf.data, kmax,
                             &g.buf, use_ef ? r.buf : NULL, world, rank, (uint32_t)unit,
                             (float *)sv.buf.data, sv.buf.numel / 4, ss, rs, &err);
    if (rc == FC_OK && use_ef)
        rc = fc_res_pack(self, &x, &r, (uint32_t)unit, FC_RES8_SALT_FETCH, &err);
    Py_END_ALLOW_THREADS
    if (rc == FC_OK) {
        PyObject *st = fc_sizes_tuple(ss, world), *rt = fc_sizes_tuple(rs, world);
        result = st != NULL && rt != NULL ? PyTuple_Pack(2, st, rt) : NULL;
        Py_XDECREF(st);
        Py_XDECREF(rt);
    }
error: /* and success: rc says which */
    fc_view_release(&pv);
    fc_view_release(&g);
    fc_view_release(&sv);
    fc_res_release(&r);
    return rc == FC_OK ? result : STATE_ERR(self, &err);
}

FC_DOCSTRING(fc_state_finish_doc,
"finish(recv, grad, out, world, rank, unit)\n\n"
"The second round's end: sums the senders' values (`recv`, uint8 view of fp32, as fetch()'s\n"
"recv_splits) at this rank's picks with its exact own chunk, in rank order, and writes `out`.");

PyObject *fc_state_finish(StateObject *self, PyObject *args)
{
    fc_out_call c = {0};
    fc_cuda_call k;
    fc_exec x;
    int rc = fc_state_out_call(self, args, "OOOiiL:finish", &c);
    if (rc < 0)
        return NULL;
    if (rc != FC_OK || (rc = words_view(c.data, "recv", &c.g, &c.v, &c.err)) != FC_OK ||
        (rc = fc_check_same_device(&c.o, &c.g, "output", &c.err)) != FC_OK ||
        (rc = round_backend(self, c.grad, &c.g, &k, &x, &c.err)) != FC_OK)
        goto error;
    Py_BEGIN_ALLOW_THREADS
    rc = fc_fetch_finish(&self->core, &x, (const float *)c.v.buf.data, c.v.buf.numel / 4, &c.g.buf,
                         &c.o.buf, c.world, c.rank, (uint32_t)c.unit, &c.err);
    Py_END_ALLOW_THREADS
error: /* and success: rc says which */
    return fc_state_out_done(self, rc, &c);
}
