/* state_args.c: the argument checks every State call runs before it touches state, and the
 * one exit of a call that borrowed tensor views. */
#include "python/state.h" /* first: it includes Python.h */

#include "common/fc_wire.h"

int fc_state_ready(StateObject *self)
{
    if (self->core.method == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "State.__init__ was not called");
        return 0;
    }
    return 1;
}

int fc_state_enter(StateObject *self)
{
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "State is in use by another thread (or was re-entered "
                        "from a callback it made): one state serves one training loop");
        return 0;
    }
    self->busy = 1;
    return 1;
}

int fc_check_numel(long long n, long long lo, const char *arg, fc_err *err)
{
    if (n < lo || n > FC_MAX_NUMEL)
        return fc_fail(err, FC_ERR_VALUE, "%s must be >= %lld and at most 2^44 = %lld elements (so "
                       "that no size product wraps), got %lld", arg, lo, (long long)FC_MAX_NUMEL, n);
    return FC_OK;
}

int fc_check_world(int world, int rank, fc_err *err)
{
    if (world < 1 || world > FC_MAX_WORLD)
        return fc_fail(err, FC_ERR_VALUE, "world must be in [1, %d], got %d", FC_MAX_WORLD, world);
    if (rank < 0 || rank >= world)
        return fc_fail(err, FC_ERR_VALUE, "rank must be in [0, %d), got %d", world, rank);
    return FC_OK;
}

int fc_check_cpu(const fc_view *v, const char *arg, fc_err *err)
{
    if (v->device_type != kDLCPU)
        return fc_fail(err, FC_ERR_TYPE, "%s is a CUDA tensor: this entry point runs on CPU "
                       "tensors (the CUDA path is encode()/decode())", arg);
    return FC_OK;
}

/* Every tensor of a call lives where the gradient does. */
int fc_check_same_device(const fc_view *v, const fc_view *grad, const char *arg, fc_err *err)
{
    if (v->device_type != grad->device_type ||
        (v->device_type == kDLCUDA && v->device_id != grad->device_id))
        return fc_fail(err, FC_ERR_TYPE, "%s is on %s:%d but grad is on %s:%d: all tensors of a "
                       "call must share a device", arg, v->device_type == kDLCUDA ? "cuda" : "cpu",
                       v->device_id, grad->device_type == kDLCUDA ? "cuda" : "cpu", grad->device_id);
    return FC_OK;
}

int fc_check_aligned(const fc_view *v, const char *arg, fc_err *err)
{
    if (((uintptr_t)v->buf.data) % FC_ALIGN != 0)
        return fc_fail(err, FC_ERR_VALUE, "%s must start on a %d-byte boundary (a fresh tensor "
                       "does; a sliced view may not)", arg, FC_ALIGN);
    return FC_OK;
}

int fc_state_check_unit(StateObject *self, long long unit, int64_t numel, fc_err *err)
{
    if (unit < 0 || unit >= self->core.n_units)
        return fc_fail(err, FC_ERR_VALUE, "unit must be in [0, %d) (from begin()), got %lld",
                       self->core.n_units, unit);
    if (self->core.units[unit].numel != numel)
        return fc_fail(err, FC_ERR_VALUE, "grad has %lld elements but unit %lld has %lld",
                       (long long)numel, unit, (long long)self->core.units[unit].numel);
    return FC_OK;
}

PyObject *fc_sizes_tuple(const int64_t *sizes, int world)
{
    PyObject *t = PyTuple_New(world);
    for (int r = 0; t != NULL && r < world; r++) {
        PyObject *v = PyLong_FromLongLong(sizes[r]);
        if (v == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SetItem(t, r, v);
    }
    return t;
}

/* The one exit of a call that borrowed tensor views: released on success and on error alike
 * (c may be NULL); rc says which, and err why. */
PyObject *fc_state_views_done(StateObject *self, int rc, const fc_err *err, fc_view *a, fc_view *b,
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

int fc_state_out_call(StateObject *self, PyObject *args, const char *fmt, fc_out_call *c)
{
    fc_err *err = &c->err;
    /* decode_part's src and piece come last: a format without them leaves them unread */
    if (!fc_state_ready(self) || !PyArg_ParseTuple(args, fmt, &c->data, &c->grad, &c->out,
                                                   &c->world, &c->rank, &c->unit, &c->src,
                                                   &c->piece))
        return -1;
    if (fc_view_get(c->grad, "grad", FC_DT_FLOATS, &c->g, err) != FC_OK ||
        fc_view_get(c->out, "output", FC_DT_FLOATS, &c->o, err) != FC_OK ||
        fc_check_world(c->world, c->rank, err) || fc_state_check_unit(self, c->unit, c->g.buf.numel, err))
        return err->code != FC_OK ? err->code : FC_ERR_VALUE;
    if (c->o.read_only)
        return fc_fail(err, FC_ERR_VALUE, "output is read-only");
    return FC_OK;
}

PyObject *fc_state_out_done(StateObject *self, int rc, fc_out_call *c)
{
    return fc_state_views_done(self, rc, &c->err, &c->v, &c->g, &c->o);
}
