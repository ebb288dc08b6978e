/* state_cuda.c: what a State keeps on a CUDA device for the sparse, aggregate and stateful
 * methods, all of it torch tensors from its allocator (never cudaMalloc), made when the CUDA
 * backend asks (fc_cuda_host.buffer; what it asks for is the backend's, fc_cuda_path.c): a
 * grow-only scratch for the kernels, each unit's method state (gradiveq's basis and covariance,
 * a device copy of the host's) and the second round's fetch buffer (the owner's picks, encode's
 * chunk flags). */
#include "python/state.h" /* first: it includes Python.h */
#include <string.h>

/* self->cuda_extra: {"scratch": tensor, "fetch": tensor, unit (int): tensor}; float32 tensors,
 * as the allocator makes residuals. */
static PyObject *extra_dict(StateObject *self, fc_err *err)
{
    if (self->cuda_extra == NULL && (self->cuda_extra = PyDict_New()) == NULL)
        fc_fail(err, FC_ERR_PYTHON, "");
    return self->cuda_extra;
}

static int tensor_ptr(PyObject *t, const char *what, void **ptr, int64_t *bytes, fc_err *err)
{
    fc_view v = {0};
    *ptr = NULL;
    *bytes = 0;
    if (fc_view_get_own(t, what, FC_DT_F32, &v, err) != FC_OK)
        return err->code;
    *ptr = v.buf.data;
    *bytes = v.buf.numel * 4;
    fc_view_release(&v); /* the dict keeps the tensor alive */
    return FC_OK;
}

static int tensor_device(PyObject *t, int *device, fc_err *err)
{
    fc_view v = {0};
    if (fc_view_get_own(t, "unit state", FC_DT_F32, &v, err) != FC_OK)
        return err->code;
    *device = v.device_id;
    fc_view_release(&v);
    return FC_OK;
}

/* The device tensor under `key`, at least `bytes` long (replaced by a larger one when not):
 * its pointer and size; *fresh when it was just made. */
static int device_buffer(StateObject *self, PyObject *key, const char *what, int64_t bytes,
                         PyObject *like, void **ptr, int64_t *have, int *fresh, fc_err *err)
{
    PyObject *d = extra_dict(self, err), *t; /* t borrowed */
    *fresh = 0;
    if (d == NULL)
        return err->code;
    t = PyDict_GetItemWithError(d, key);
    if (t == NULL && PyErr_Occurred())
        return fc_fail(err, FC_ERR_PYTHON, "");
    if (t != NULL && tensor_ptr(t, what, ptr, have, err) == FC_OK && *have >= bytes)
        return FC_OK;
    if (err->code != FC_OK)
        return err->code;
    if (self->allocator == Py_None)
        return fc_fail(err, FC_ERR_STATE, "the CUDA path needs an allocator (State(..., "
                       "allocator=...)) for its device buffers; fsdpcomp.CommState provides one");
    /* grown by a quarter more, so that a slowly growing need does not reallocate every call */
    const int64_t floats = (bytes + bytes / 4 + 3) / 4 + 64;
    PyObject *n = PyObject_CallFunction(self->allocator, "LsO", (long long)floats, "float32", like);
    if (n == NULL)
        return fc_fail(err, FC_ERR_PYTHON, "");
    int rc = PyDict_SetItem(d, key, n);
    Py_DECREF(n); /* the dict's now */
    if (rc < 0)
        return fc_fail(err, FC_ERR_PYTHON, "");
    *fresh = 1;
    return tensor_ptr(n, what, ptr, have, err);
}

/* The dict key of a shared buffer's name (a new reference): the few names the backend uses are
 * made once, so a warm call builds no string. */
static PyObject *name_key(const char *name)
{
    static const char *names[8];
    static PyObject *keys[8]; /* interned, kept for the life of the process */
    int i = 0;
    for (; i < 8 && names[i] != NULL; i++)
        if (strcmp(names[i], name) == 0)
            return Py_NewRef(keys[i]);
    PyObject *key = PyUnicode_InternFromString(name);
    if (key != NULL && i < 8) {
        names[i] = name; /* a string literal of the backend's: it outlives the table */
        keys[i] = Py_NewRef(key);
    }
    return key;
}

int fc_state_cuda_buffer(void *owner, void *like, const char *name, uint32_t unit,
                         int64_t bytes, void **ptr, int64_t *have, int *fresh, fc_err *err)
{
    StateObject *self = (StateObject *)owner;
    /* the dict's keys: a name for the shared buffers, the unit's index for its state (what
     * fc_state_cuda_sync_done and fc_state_cuda_forget_units drop) */
    PyObject *key = name != NULL ? name_key(name) : PyLong_FromUnsignedLong(unit);
    *fresh = 0;
    if (key == NULL)
        return fc_fail(err, FC_ERR_PYTHON, "");
    int rc = device_buffer(self, key, name != NULL ? name : "unit state", bytes, (PyObject *)like,
                           ptr, have, fresh, err);
    Py_DECREF(key);
    return rc;
}

/* The device copy of a unit's state, or NULL (borrowed). */
static PyObject *device_state(StateObject *self, uint32_t unit)
{
    if (self->cuda_extra == NULL)
        return NULL;
    PyObject *key = PyLong_FromUnsignedLong(unit);
    if (key == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *t = PyDict_GetItemWithError(self->cuda_extra, key);
    Py_DECREF(key);
    if (t == NULL)
        PyErr_Clear();
    return t;
}

int fc_state_cuda_sync_pull(StateObject *self, uint32_t unit, fc_err *err)
{
    float *span, *host;
    int64_t len, bytes;
    void *dev = NULL;
    PyObject *t = device_state(self, unit); /* borrowed */
    if (t == NULL)
        return FC_OK; /* the unit never ran on CUDA: the host state is the one */
    fc_core_sync_span(&self->core, unit, &span, &len);
    if (len == 0)
        return FC_OK;
    const fc_cuda_api *api = fc_cuda_api_get(err);
    if (api == NULL || self->cuda_ctx == NULL)
        return api == NULL ? err->code : fc_fail(err, FC_ERR_STATE, "no CUDA context");
    int device = 0;
    int rc = fc_core_unit_state(&self->core, unit, &host, err);
    if (rc == FC_OK)
        rc = tensor_ptr(t, "unit state", &dev, &bytes, err);
    if (rc == FC_OK)
        rc = tensor_device(t, &device, err);
    if (rc != FC_OK)
        return rc;
    /* the covariance the encodes of this step summed on the device, after them in stream
     * order: on the learn steps only (gradiveq's warmup and refreshes), a small wait */
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = api->copy(self->cuda_ctx, device, NULL, span, (const float *)dev + (span - host), 4 * len, 1, err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    return rc;
}

void fc_state_cuda_sync_done(StateObject *self, uint32_t unit)
{
    /* the host's new state goes to the device at the unit's next call */
    if (device_state(self, unit) == NULL)
        return;
    PyObject *key = PyLong_FromUnsignedLong(unit);
    if (key == NULL || PyDict_DelItem(self->cuda_extra, key) < 0)
        PyErr_Clear();
    Py_XDECREF(key);
}

void fc_state_cuda_forget_units(StateObject *self)
{
    if (self->cuda_extra == NULL)
        return;
    PyObject *keys = PyDict_Keys(self->cuda_extra);
    for (Py_ssize_t i = 0; keys != NULL && i < PyList_Size(keys); i++) {
        PyObject *key = PyList_GetItem(keys, i); /* borrowed */
        if (PyLong_Check(key) && PyDict_DelItem(self->cuda_extra, key) < 0)
            PyErr_Clear();
    }
    if (keys == NULL)
        PyErr_Clear();
    Py_XDECREF(keys);
}

FC_DOCSTRING(fc_state_emulate_cuda_doc,
"_emulate_cuda(flag)\n\n"
"Tests only: CPU tensors of this State take the CUDA path, through whichever library was loaded\n"
"as the CUDA part (FSDPCOMP_CUDA_LIB: tests/cuda_emu's host emulation of cuda/).");

PyObject *fc_state_emulate_cuda(StateObject *self, PyObject *arg)
{
    if (!fc_state_ready(self))
        return NULL;
    int flag = PyObject_IsTrue(arg);
    if (flag < 0)
        return NULL;
    self->emulate_cuda = flag;
    Py_RETURN_NONE;
}
