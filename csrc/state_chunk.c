/* state_chunk.c: the State's calls on one chunk outside the collective (tests, benchmarks):
 * payload_bytes, layout, compress, decompress. */
#include "state.h" /* first: it includes Python.h */
#include <limits.h>
#include <string.h>

#include "fc_cuda_path.h"

/* payload_bytes' and layout's n, at least lo; an int past int64 is refused as too large. */
static int chunk_numel(StateObject *self, PyObject *arg, long long lo, long long *n)
{
    fc_err err = {0};
    if (!fc_state_ready(self))
        return -1;
    *n = PyLong_AsLongLong(arg);
    if (*n == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        *n = LLONG_MAX;
    }
    if (fc_check_numel(*n, lo, "n", &err) != FC_OK) {
        STATE_ERR(self, &err);
        return -1;
    }
    return 0;
}

FC_DOCSTRING(fc_state_payload_bytes_doc,
"payload_bytes(n) -> int\n\nBytes of one fp32 chunk of n elements on the wire: header, body and padding.");

PyObject *fc_state_payload_bytes(StateObject *self, PyObject *arg)
{
    long long n;
    if (chunk_numel(self, arg, 0, &n) < 0)
        return NULL;
    return PyLong_FromLongLong(fc_payload_bytes(&self->core, self->core.method, n, FC_F32));
}

FC_DOCSTRING(fc_state_layout_doc,
"layout(n) -> dict\n\nThe documented payload formula for an fp32 chunk of n elements:\n"
"value_bytes, meta_bytes, index_bytes, header_bytes (header + padding) and total.");

PyObject *fc_state_layout(StateObject *self, PyObject *arg)
{
    long long n;
    if (chunk_numel(self, arg, 1, &n) < 0)
        return NULL;
    fc_chunk c;
    memset(&c, 0, sizeof(c));
    c.cfg = self->core.cfg;
    c.n = n;
    c.world = 1;
    c.wire_dtype = FC_F32;
    fc_layout l;
    self->core.method->layout(&c, &l);
    int64_t total = fc_payload_bytes(&self->core, self->core.method, n, FC_F32);
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L,s:L}", "value_bytes", (long long)l.value_bytes,
                         "meta_bytes", (long long)l.meta_bytes, "index_bytes",
                         (long long)l.index_bytes, "header_bytes",
                         (long long)(total - fc_layout_bytes(&l)), "kept", (long long)l.kept,
                         "total", (long long)total);
}

FC_DOCSTRING(fc_state_compress_doc,
"compress(x, payload, unit=0, chunk=0, world=1, rank=0) -> int\n\n"
"Encodes the fp32 tensor x as one payload into the uint8 tensor `payload` on the same device;\n"
"returns its size. The RNG stream is keyed by (seed, rank, step, unit, chunk) as in the\n"
"collective. On CUDA the bytes are the CPU's, queued on the current stream (a method whose size\n"
"is data-dependent waits for it to read the size back).");

PyObject *fc_state_compress(StateObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"x", "payload", "unit", "chunk", "world", "rank", NULL};
    PyObject *x, *payload;
    unsigned int unit = 0, chunk = 0;
    int world = 1, rank = 0, rc = FC_ERR_VALUE; /* until the encode has run */
    int64_t written = 0;
    fc_err err = {0};
    fc_view xv = {0}, pv = {0};
    if (!fc_state_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "OO|IIii:compress", kwlist, &x, &payload, &unit,
                                     &chunk, &world, &rank))
        return NULL;
    fc_cuda_call k;
    if (fc_view_get(x, "x", FC_DT_F32, &xv, &err) || fc_view_get(payload, "payload", FC_DT_U8, &pv, &err) ||
        fc_check_same_device(&pv, &xv, "payload", &err) ||
        fc_check_aligned(&pv, "payload", &err) || fc_check_world(world, rank, &err))
        goto error;
    if (xv.buf.numel == 0) {
        fc_fail(&err, FC_ERR_VALUE, "x must have at least one element");
        goto error;
    }
    if (fc_state_on_cuda(self, &xv) &&
        (fc_state_cuda_prepare(self, x, &xv, &k, &err) != FC_OK ||
         fc_state_cuda_single_extras(self, x, &k, xv.buf.numel, world, rank, unit, chunk, 0, &err) != FC_OK))
        goto error;
    Py_BEGIN_ALLOW_THREADS
    if (fc_state_on_cuda(self, &xv))
        rc = fc_cuda_compress(&self->core, &k, &xv.buf, &pv.buf, unit, chunk, world, rank, &written, &err);
    else
        rc = fc_core_compress(&self->core, (const float *)xv.buf.data, xv.buf.numel,
                              (uint8_t *)pv.buf.data, pv.buf.numel, unit, chunk, world, rank, &written, &err);
    Py_END_ALLOW_THREADS
error: /* and success: rc says which */
    fc_view_release(&xv);
    fc_view_release(&pv);
    return rc == FC_OK ? PyLong_FromLongLong(written) : STATE_ERR(self, &err);
}

FC_DOCSTRING(fc_state_decompress_doc,
"decompress(payload, acc, alpha=1.0, unit=0, chunk=0, world=1)\n\n"
"Validates one payload for a chunk of acc.numel() elements and adds alpha times its decode to\n"
"the fp32 tensor acc (on the payload's device). A malformed payload raises PayloadError and\n"
"leaves acc untouched when the header is at fault; on CUDA the check runs on the device\n"
"without a wait: acc becomes NaN and the next counters() raises the PayloadError.");

PyObject *fc_state_decompress(StateObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"payload", "acc", "alpha", "unit", "chunk", "world", NULL};
    PyObject *payload, *acc;
    double alpha = 1.0;
    unsigned int unit = 0, chunk = 0;
    int world = 1, rc = FC_ERR_VALUE; /* until the decode has run */
    fc_err err = {0};
    fc_view pv = {0}, av = {0};
    if (!fc_state_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "OO|dIIi:decompress", kwlist, &payload, &acc,
                                     &alpha, &unit, &chunk, &world))
        return NULL;
    fc_cuda_call k;
    if (fc_view_get(payload, "payload", FC_DT_U8, &pv, &err) || fc_view_get(acc, "acc", FC_DT_F32, &av, &err) ||
        fc_check_same_device(&av, &pv, "acc", &err) ||
        fc_check_aligned(&pv, "payload", &err) || fc_check_world(world, 0, &err))
        goto error;
    if (av.buf.numel == 0) {
        fc_fail(&err, FC_ERR_VALUE, "acc must have at least one element");
        goto error;
    }
    if (fc_state_on_cuda(self, &av) &&
        (fc_state_cuda_prepare(self, acc, &av, &k, &err) != FC_OK ||
         fc_state_cuda_single_extras(self, acc, &k, av.buf.numel, world, 0, unit, chunk, 1, &err) != FC_OK))
        goto error;
    Py_BEGIN_ALLOW_THREADS
    if (fc_state_on_cuda(self, &av))
        rc = fc_cuda_decompress(&self->core, &k, &pv.buf, &av.buf, (float)alpha, unit, chunk, world, &err);
    else
        rc = fc_core_decompress(&self->core, (const uint8_t *)pv.buf.data, pv.buf.numel, av.buf.numel,
                                (float)alpha, (float *)av.buf.data, unit, chunk, world, &err);
    Py_END_ALLOW_THREADS
error: /* and success: rc says which */
    return fc_state_views_done(self, rc, &err, &pv, &av, NULL);
}
