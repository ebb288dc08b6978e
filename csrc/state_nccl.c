/* state_nccl.c: the NCCL transport as seen from Python: the communicator capsule
 * (nccl_unique_id, nccl_comm_init) and State.nccl_all_to_all. */
#include "state.h" /* first: it includes Python.h */

#define NCCL_CAPSULE "fsdpcomp.nccl_comm"

static int splits_from(PyObject *seq, const char *arg, int world, int64_t *out, int64_t *total)
{
    PyObject *fast = PySequence_Fast(seq, arg);
    if (fast == NULL)
        return -1;
    int rc = 0;
    *total = 0;
    const Py_ssize_t n = PySequence_Size(fast);
    if (n != world) {
        PyErr_Format(PyExc_ValueError, "%s has %zd entries, the communicator has %d ranks", arg,
                     n, world);
        rc = -1;
    }
    for (int r = 0; rc == 0 && r < world; r++) {
        PyObject *item = PySequence_GetItem(fast, r);
        long long v = item != NULL ? PyLong_AsLongLong(item) : -1;
        Py_XDECREF(item);
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

FC_DOCSTRING(fc_state_nccl_all_to_all_doc,
"nccl_all_to_all(comm, send, recv, send_splits, recv_splits)\n\n"
"Queues the all-to-all of payloads as grouped ncclSend/ncclRecv on the current stream of the\n"
"buffers' device (no host sync); its time is read from CUDA events with counters().");

PyObject *fc_state_nccl_all_to_all(StateObject *self, PyObject *args)
{
    PyObject *cap, *send, *recv, *ss_o, *rs_o;
    fc_err err = {0};
    fc_view s = {0}, r = {0};
    int rc = FC_ERR_VALUE; /* until the collective has run */
    int64_t ss[FC_MAX_WORLD], rs[FC_MAX_WORLD], st = 0, rt = 0;
    void *stream = NULL;
    if (!fc_state_ready(self) || !PyArg_ParseTuple(args, "OOOOO:nccl_all_to_all", &cap, &send, &recv, &ss_o, &rs_o))
        return NULL;
    fc_cuda_comm *comm = (fc_cuda_comm *)PyCapsule_GetPointer(cap, NCCL_CAPSULE);
    if (comm == NULL)
        return NULL;
    PyObject *ctx_o = (PyObject *)PyCapsule_GetContext(cap); /* borrowed: (world, rank) */
    if (ctx_o == NULL || !PyTuple_Check(ctx_o)) {
        PyErr_SetString(PyExc_TypeError, "comm must come from fsdpcomp._C.nccl_comm_init");
        return NULL;
    }
    int world = (int)PyLong_AsLong(PyTuple_GetItem(ctx_o, 0));
    if (splits_from(ss_o, "send_splits", world, ss, &st) < 0 ||
        splits_from(rs_o, "recv_splits", world, rs, &rt) < 0)
        return NULL;
    const fc_cuda_api *api = fc_cuda_api_get(&err);
    if (api == NULL)
        return STATE_ERR(self, &err);
    if (fc_view_get(send, "send", FC_DT_U8, &s, &err) || fc_view_get(recv, "recv", FC_DT_U8, &r, &err) ||
        fc_check_same_device(&r, &s, "recv", &err))
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
    return fc_state_views_done(self, rc, &err, &s, &r, NULL);
}

/* ---------------------------------------------------------------- module: the communicator */

FC_DOCSTRING(fc_mod_nccl_unique_id_doc, "nccl_unique_id() -> bytes\n\nA fresh ncclUniqueId (128 bytes), made on rank 0 and shared with the group.");

PyObject *fc_mod_nccl_unique_id(PyObject *mod, PyObject *Py_UNUSED(ignored))
{
    fc_err err = {0};
    uint8_t id[128];
    const fc_cuda_api *api = fc_cuda_api_get(&err);
    if (api == NULL || api->nccl_unique_id(id, &err) != FC_OK)
        return fc_raise_err(state_of_module(mod), &err);
    return PyBytes_FromStringAndSize((const char *)id, 128);
}

/* Whether the interpreter is finalizing: sys.is_finalizing(), as Py_IsFinalizing is not in the
 * stable ABI before 3.13. When sys or the call is already gone, it is. Exception state is the
 * caller's to keep. */
static int interpreter_exiting(void)
{
    PyObject *fn = PySys_GetObject("is_finalizing"); /* borrowed */
    PyObject *r = fn != NULL ? PyObject_CallNoArgs(fn) : NULL;
    const int exiting = r == NULL || PyObject_IsTrue(r) != 0;
    Py_XDECREF(r);
    return exiting;
}

/* The capsule's destructor: never a collective call (ncclCommDestroy waits for the peers,
 * which are not destroying theirs at this moment: a hang, or a crash at exit). A communicator
 * fsdpcomp.release_nccl() did not release is aborted while the interpreter runs (local: its
 * memory and threads are freed, peers still using it fail or time out), and left to the process's
 * exit while the interpreter finalizes (then the CUDA runtime and NCCL may be going down too,
 * and any call into them can hang or crash). An exception in flight is kept: destructors run
 * during unwinding. */
static void comm_capsule_free(PyObject *cap)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    fc_cuda_comm *c = (fc_cuda_comm *)PyCapsule_GetPointer(cap, NCCL_CAPSULE);
    PyObject *ctx = (PyObject *)PyCapsule_GetContext(cap);
    const int exiting = interpreter_exiting();
    if (c != NULL && fc_cuda_api_loaded() != NULL)
        fc_cuda_api_loaded()->nccl_comm_free(c, exiting);
    Py_XDECREF(ctx);
    PyErr_Clear(); /* from the capsule calls above, never the caller's */
    PyErr_Restore(type, value, tb);
}

FC_DOCSTRING(fc_mod_nccl_comm_init_doc,
"nccl_comm_init(unique_id, world, rank, device, timeout_s) -> comm\n\n"
"A non-blocking NCCL communicator on `device`: every rank of the group calls it, and it raises\n"
"NcclError when they have not all joined within timeout_s (0: no limit). Its all-to-alls are\n"
"watched: one still running timeout_s after it was queued aborts it. End it with\n"
"nccl_comm_release() on every rank; a capsule dropped unreleased aborts it (locally).");

PyObject *fc_mod_nccl_comm_init(PyObject *mod, PyObject *args)
{
    const char *id;
    Py_ssize_t id_len;
    int world, rank, device, rc;
    double timeout_s;
    fc_err err = {0};
    fc_cuda_comm *comm = NULL;
    PyObject *cap = NULL, *ctx = NULL;
    if (!PyArg_ParseTuple(args, "y#iiid:nccl_comm_init", &id, &id_len, &world, &rank, &device,
                          &timeout_s))
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
    if (!(timeout_s >= 0) || timeout_s > 1e9) {
        PyErr_Format(PyExc_ValueError, "timeout_s must be in [0, 1e9] seconds, got %g", timeout_s);
        return NULL;
    }
    const fc_cuda_api *api = fc_cuda_api_get(&err);
    if (api == NULL)
        return fc_raise_err(state_of_module(mod), &err);
    Py_BEGIN_ALLOW_THREADS
    rc = api->nccl_comm_init((const uint8_t *)id, world, rank, device, timeout_s, &comm, &err);
    Py_END_ALLOW_THREADS
    if (rc != FC_OK)
        return fc_raise_err(state_of_module(mod), &err);
    ctx = Py_BuildValue("(ii)", world, rank);
    cap = ctx ? PyCapsule_New(comm, NCCL_CAPSULE, comm_capsule_free) : NULL;
    if (cap == NULL || PyCapsule_SetContext(cap, ctx) < 0) {
        if (cap == NULL)
            api->nccl_comm_free(comm, 0);
        Py_XDECREF(cap);
        Py_XDECREF(ctx);
        return NULL;
    }
    return cap; /* the context tuple is owned by the capsule now */
}

FC_DOCSTRING(fc_mod_nccl_comm_release_doc,
"nccl_comm_release(comm)\n\n"
"Collective: every rank of the communicator calls it. Waits for its queued all-to-alls, then\n"
"ncclCommFinalize + ncclCommDestroy; raises NcclError (and aborts it) when that does not\n"
"finish within its timeout. A released or aborted communicator raises NcclError when used.");

PyObject *fc_mod_nccl_comm_release(PyObject *mod, PyObject *cap)
{
    fc_err err = {0};
    int rc;
    fc_cuda_comm *comm = (fc_cuda_comm *)PyCapsule_GetPointer(cap, NCCL_CAPSULE);
    if (comm == NULL)
        return NULL;
    const fc_cuda_api *api = fc_cuda_api_get(&err);
    if (api == NULL)
        return fc_raise_err(state_of_module(mod), &err);
    Py_BEGIN_ALLOW_THREADS
    rc = api->nccl_comm_release(comm, &err);
    Py_END_ALLOW_THREADS
    if (rc != FC_OK)
        return fc_raise_err(state_of_module(mod), &err);
    Py_RETURN_NONE;
}
