/* fc_tensor.c: DLPack consumption. The fast path is the producer's C exchange API
 * (`type(t).__dlpack_c_exchange_api__`, no Python call, no capsule); the fallback is the
 * `__dlpack__()` protocol, versioned capsule first. */
#include "python/fc_tensor.h"
#include "python/fc_pytype.h"

#include <string.h>

const char *fc_dtype_name(int dtype)
{
    static const char *const names[] = {"float32", "bfloat16", "float16", "uint8", "int64"};
    return dtype >= 0 && dtype < FC_DTYPE_COUNT ? names[dtype] : "?";
}

static int map_dtype(DLDataType t)
{
    if (t.lanes != 1)
        return -1;
    if (t.code == kDLFloat && t.bits == 32)
        return FC_F32;
    if (t.code == kDLBfloat && t.bits == 16)
        return FC_BF16;
    if (t.code == kDLFloat && t.bits == 16)
        return FC_F16;
    if (t.code == kDLUInt && t.bits == 8)
        return FC_U8;
    if (t.code == kDLInt && t.bits == 64)
        return FC_I64;
    return -1;
}

static void dtypes_text(unsigned dtypes, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int d = 0; d < FC_DTYPE_COUNT; d++)
        if (dtypes & (1u << d))
            used += (size_t)snprintf(buf + used, used < cap ? cap - used : 0, "%s%s",
                                     used ? " or " : "", fc_dtype_name(d));
}

/* The exchange API of obj's type, or NULL (no Python error left set) if it has none. */
static const DLPackExchangeAPI *exchange_api(PyObject *obj)
{
    static PyTypeObject *cached_type = NULL; /* borrowed: types with the API are immortal-ish
                                                 builtins of their framework; we only compare */
    static const DLPackExchangeAPI *cached_api = NULL;
    PyTypeObject *tp = Py_TYPE(obj);
    if (tp == cached_type)
        return cached_api;
    PyObject *cap = PyObject_GetAttrString((PyObject *)tp, "__dlpack_c_exchange_api__");
    const DLPackExchangeAPI *api = NULL;
    if (cap == NULL) {
        PyErr_Clear();
    } else {
        if (PyCapsule_IsValid(cap, "dlpack_exchange_api")) {
            api = (const DLPackExchangeAPI *)PyCapsule_GetPointer(cap, "dlpack_exchange_api");
            /* Only the major version guarantees the layout; the function we use must be there. */
            if (api != NULL && (api->header.version.major != 1 ||
                                api->dltensor_from_py_object_no_sync == NULL))
                api = NULL;
        }
        Py_DECREF(cap);
    }
    /* The API pointer must stay valid for the process (DLPack's rule), so caching it is safe;
     * the type is compared by address only. */
    cached_type = tp;
    cached_api = api;
    return api;
}

/* Turns the pending Python exception of a producer into an fc_err naming the argument. */
static int fail_from_python(const char *arg, fc_err *err)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *msg = ev ? PyObject_Str(ev) : NULL;
    const char *text = msg ? PyUnicode_AsUTF8AndSize(msg, NULL) : NULL;
    if (text == NULL)
        PyErr_Clear();
    int rc = fc_fail(err, FC_ERR_TYPE, "%s cannot be read through DLPack: %s", arg,
                     text ? text : "(no message)");
    Py_XDECREF(msg);
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
    return rc;
}

static int from_capsule(PyObject *obj, const char *arg, DLTensor *out, int *read_only,
                        PyObject **owner, fc_err *err)
{
    PyObject *meth = NULL, *cap = NULL, *args = NULL, *kwargs = NULL, *ver = NULL;
    int rc = FC_OK;
    meth = PyObject_GetAttrString(obj, "__dlpack__");
    if (meth == NULL) {
        PyErr_Clear();
        return fc_fail(err, FC_ERR_TYPE, "%s must be a tensor (DLPack-capable), got %s", arg,
                       FC_TYPE_NAME(obj));
    }
    args = PyTuple_New(0);
    ver = Py_BuildValue("(ii)", 1, 0);
    kwargs = (args && ver) ? Py_BuildValue("{s:O,s:i}", "max_version", ver, "stream", -1) : NULL;
    cap = kwargs ? PyObject_Call(meth, args, kwargs) : NULL;
    if (cap == NULL && kwargs != NULL) { /* an older producer without max_version / stream */
        PyErr_Clear();
        cap = PyObject_CallNoArgs(meth);
    }
    if (cap == NULL) {
        rc = fail_from_python(arg, err);
        goto done;
    }
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        DLManagedTensorVersioned *m =
            (DLManagedTensorVersioned *)PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (m->version.major != 1) {
            rc = fc_fail(err, FC_ERR_TYPE, "%s: DLPack major version %u is not supported", arg,
                         m->version.major);
            goto done;
        }
        *out = m->dl_tensor;
        *read_only = (m->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        DLManagedTensor *m = (DLManagedTensor *)PyCapsule_GetPointer(cap, "dltensor");
        *out = m->dl_tensor;
        *read_only = 0;
    } else {
        rc = fc_fail(err, FC_ERR_TYPE, "%s.__dlpack__() did not return a DLPack capsule", arg);
        goto done;
    }
    /* The capsule stays unconsumed and owned by us: its destructor releases the producer's
     * reference when we drop it, after the memory has been used. */
    *owner = cap;
    cap = NULL;
done:
    Py_XDECREF(meth);
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    Py_XDECREF(ver);
    Py_XDECREF(cap);
    return rc;
}

/* torch's negative-bit views (`x._neg_view()`, what conj/neg of some views give) share the
 * memory of x and hold -x only as a flag, which DLPack does not carry: read through DLPack they
 * have the wrong sign. 1 when obj is one; errors of the probe, and a type without `is_neg`,
 * count as no. The one Python call a caller's tensor costs per call: the type's `is_neg` is
 * looked up once per type (kept, with the type, for the life of the process: the last type seen,
 * as exchange_api keeps its API) and called on obj, with no name built or bound method made. */
static int is_neg_view(PyObject *obj)
{
    static PyObject *cached_type = NULL, *cached_is_neg = NULL; /* strong references */
    PyObject *tp = (PyObject *)Py_TYPE(obj);
    if (tp != cached_type) {
        PyObject *f = PyObject_GetAttrString(tp, "is_neg");
        if (f == NULL)
            PyErr_Clear();
        Py_INCREF(tp);
        Py_XDECREF(cached_type);
        Py_XDECREF(cached_is_neg);
        cached_type = tp;
        cached_is_neg = f;
    }
    if (cached_is_neg == NULL)
        return 0;
    PyObject *r = PyObject_CallFunctionObjArgs(cached_is_neg, obj, NULL);
    if (r == NULL) {
        PyErr_Clear();
        return 0;
    }
    const int neg = r == Py_True;
    Py_DECREF(r);
    return neg;
}

static int view_get(PyObject *obj, const char *arg, unsigned dtypes, int own, fc_view *v,
                    fc_err *err);

/* A DLPack dtype as torch names it (float64, int32, uint8, bool, complex64): what the user
 * passed, in the words they know; the raw triple only for what has no such name. */
static void dlpack_dtype_text(DLDataType d, char *buf, size_t cap)
{
    static const char *const kinds[] = {"int", "uint", "float", NULL, "bfloat", "complex", "bool"};
    const char *kind = d.code < sizeof(kinds) / sizeof(kinds[0]) ? kinds[d.code] : NULL;
    if (kind != NULL && d.lanes == 1 && d.code == 6)
        snprintf(buf, cap, "bool");
    else if (kind != NULL && d.lanes == 1)
        snprintf(buf, cap, "%s%u", kind, (unsigned)d.bits);
    else
        snprintf(buf, cap, "DLPack dtype (code %u, %u bits, %u lanes)", (unsigned)d.code,
                 (unsigned)d.bits, (unsigned)d.lanes);
}

int fc_view_get(PyObject *obj, const char *arg, unsigned dtypes, fc_view *v, fc_err *err)
{
    return view_get(obj, arg, dtypes, 0, v, err);
}

int fc_view_get_own(PyObject *obj, const char *arg, unsigned dtypes, fc_view *v, fc_err *err)
{
    return view_get(obj, arg, dtypes, 1, v, err);
}

/* own: obj is a tensor the State made through its allocator and holds (never a view the caller
 * made): no negative-bit probe. */
static int view_get(PyObject *obj, const char *arg, unsigned dtypes, int own, fc_view *v,
                    fc_err *err)
{
    DLTensor t;
    int rc;
    memset(v, 0, sizeof(*v));
    const DLPackExchangeAPI *api = exchange_api(obj);
    if (api != NULL) {
        if (api->dltensor_from_py_object_no_sync((void *)obj, &t) != 0) {
            /* e.g. a tensor that requires grad: report it under the argument's name */
            return fail_from_python(arg, err);
        }
    } else {
        rc = from_capsule(obj, arg, &t, &v->read_only, &v->owner, err);
        if (rc != FC_OK)
            return rc;
    }
    int dt = map_dtype(t.dtype);
    if (dt < 0 || !(dtypes & (1u << dt))) {
        char want[96];
        dtypes_text(dtypes, want, sizeof(want));
        fc_view_release(v);
        char got[64];
        dlpack_dtype_text(t.dtype, got, sizeof(got));
        return fc_fail(err, FC_ERR_TYPE, "%s must be %s, got %s", arg, want, got);
    }
    int64_t numel = 1, expect = 1;
    int contiguous = 1;
    for (int i = t.ndim - 1; i >= 0; i--) { /* sizes from the producer: checked, never wrapped */
        if (t.shape[i] < 0 || (t.shape[i] > 0 && numel > FC_MAX_NUMEL / t.shape[i])) {
            fc_view_release(v);
            return fc_fail(err, FC_ERR_VALUE, "%s has a shape of more than 2^44 elements or a "
                           "negative size (dimension %d: %lld)", arg, i, (long long)t.shape[i]);
        }
        if (t.strides != NULL && t.shape[i] != 1 && t.strides[i] != expect)
            contiguous = 0;
        expect *= t.shape[i];
        numel *= t.shape[i];
    }
    if (!contiguous && numel > 0) {
        fc_view_release(v);
        return fc_fail(err, FC_ERR_VALUE, "%s must be contiguous (call .contiguous()), got strides "
                       "that skip elements", arg);
    }
    if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDA) {
        fc_view_release(v);
        return fc_fail(err, FC_ERR_TYPE, "%s must be on the CPU or a CUDA device, got DLPack "
                       "device type %d", arg, t.device.device_type);
    }
    if (!own && is_neg_view(obj)) {
        fc_view_release(v);
        return fc_fail(err, FC_ERR_VALUE, "%s is a negative-bit view (it holds -x as a flag, which "
                       "DLPack cannot carry): pass x.resolve_neg()", arg);
    }
    v->buf.data = (char *)t.data + t.byte_offset;
    v->buf.numel = numel;
    v->buf.dtype = dt;
    v->device_type = t.device.device_type;
    v->device_id = t.device.device_id;
    return FC_OK;
}

void fc_view_release(fc_view *v)
{
    Py_CLEAR(v->owner);
}

int fc_view_stream(PyObject *obj, const fc_view *v, void **stream, fc_err *err)
{
    PyObject *mod = NULL, *st = NULL, *handle = NULL;
    int rc = FC_OK;
    *stream = NULL;
    if (v->device_type != kDLCUDA)
        return FC_OK;
    const DLPackExchangeAPI *api = exchange_api(obj);
    if (api != NULL && api->current_work_stream != NULL &&
        api->current_work_stream(kDLCUDA, v->device_id, stream) == 0)
        return FC_OK;
    PyErr_Clear();
    /* an older producer: ask torch directly */
    mod = PyImport_ImportModule("torch.cuda");
    st = mod ? PyObject_CallMethod(mod, "current_stream", "i", v->device_id) : NULL;
    handle = st ? PyObject_GetAttrString(st, "cuda_stream") : NULL;
    if (handle == NULL) {
        PyErr_Clear();
        rc = fc_fail(err, FC_ERR_CUDA, "could not find the current CUDA stream of cuda:%d",
                     v->device_id);
        goto done;
    }
    *stream = PyLong_AsVoidPtr(handle);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        rc = fc_fail(err, FC_ERR_CUDA, "torch.cuda.current_stream().cuda_stream is not a pointer");
    }
done:
    Py_XDECREF(mod);
    Py_XDECREF(st);
    Py_XDECREF(handle);
    return rc;
}
