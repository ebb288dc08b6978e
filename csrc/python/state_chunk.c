/* state_chunk.c: the State's calls on one chunk outside the collective (tests, benchmarks):
 * payload_bytes, layout, compress, decompress. */
#include "python/state.h" /* first: it includes Python.h */

#include <limits.h>
#include <string.h>

#include "backend_cuda/fc_cuda_path.h"
#include "common/fc_res8.h"

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
"payload_bytes(n, unit=-1, chunk=0, world=1) -> int\n\nBytes of one fp32 chunk of n elements on the wire: header, body and padding. With\n"
"`unit`, compress()'s payload of that unit's `chunk` over `world` ranks: for 'adaptive' the\n"
"unit's parts table sizes it (chunk c < world: the reduce-scatter's chunk c; world + r: rank\n"
"r's reduced shard in an all-reduce's all-gather half); other methods are sized by n alone.");

PyObject *fc_state_payload_bytes(StateObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"n", "unit", "chunk", "world", NULL};
    PyObject *arg;
    long long n, unit = -1;
    unsigned int chunk = 0;
    int world = 1;
    fc_err err = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|LIi:payload_bytes", kwlist, &arg, &unit, &chunk,
                                     &world))
        return NULL;
    if (chunk_numel(self, arg, 0, &n) < 0)
        return NULL;
    if (fc_check_world(world, 0, &err) != FC_OK)
        return STATE_ERR(self, &err);
    if (unit < 0 || unit > UINT32_MAX)
        return PyLong_FromLongLong(fc_payload_bytes(&self->core, self->core.method, n, FC_F32));
    return PyLong_FromLongLong(fc_core_single_payload(&self->core, n, (uint32_t)unit, chunk, world));
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

/* One payload's call outside the collective (compress, decompress): its arguments, the views
 * of its tensors and, on CUDA, its prepared call. */
typedef struct {
    PyObject *t, *payload; /* t: x or acc; borrowed from the arguments */
    unsigned int unit, chunk;
    int world, rank;
    fc_view tv, pv;
    fc_cuda_call k;
    fc_exec x; /* the tensors' backend */
    fc_err err;
} single_call;

/* a's tensors: t (fp32, at least one element, named name) and the uint8 payload, aligned, on t's
 * device; world and rank checked; on CUDA the call prepared for one payload (decode:
 * decompress()'s). The caller releases both views. */
static int single_views(StateObject *self, single_call *a, const char *name, int decode)
{
    int rc = FC_OK;
    FC_TRY(fc_view_get(a->t, name, FC_DT_F32, &a->tv, &a->err));
    FC_TRY(fc_view_get(a->payload, "payload", FC_DT_U8, &a->pv, &a->err));
    FC_TRY(fc_check_same_device(&a->pv, &a->tv, "payload", &a->err));
    FC_TRY(fc_check_aligned(&a->pv, "payload", &a->err));
    FC_TRY(fc_check_world(a->world, a->rank, &a->err));
    if (a->tv.buf.numel == 0)
        return fc_fail(&a->err, FC_ERR_VALUE, "%s must have at least one element", name);
    const fc_prep p = {decode ? FC_PREP_DECOMPRESS : FC_PREP_COMPRESS, &a->tv.buf, NULL, NULL,
                       a->world, a->rank, a->unit, a->chunk};
    FC_TRY(fc_state_exec(self, a->t, &a->tv, &p, &a->k, &a->x, &a->err));
error:
    return rc;
}

FC_DOCSTRING(fc_state_compress_doc,
"compress(x, payload, unit=0, chunk=0, world=1, rank=0, residual=None) -> int\n\n"
"Encodes the fp32 tensor x as one payload into the uint8 tensor `payload` on the same device;\n"
"returns its size. The RNG stream is keyed by (seed, rank, step, unit, chunk) as in the\n"
"collective. With `residual` (fp32, x's length and device: an error-feedback residual e; or\n"
"an 8-bit one, uint8 of residual_bytes(x.numel()) as residual_dtype \"int8\" keeps it) the\n"
"payload is that of g' = x + e under the collective's range and NaN rules, and e becomes\n"
"g' - D(payload), always finite. On CUDA the bytes are the CPU's, queued on the current stream\n"
"(a method whose size is data-dependent waits for it to read the size back).");

PyObject *fc_state_compress(StateObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"x", "payload", "unit", "chunk", "world", "rank", "residual", NULL};
    single_call a = {.world = 1};
    PyObject *res = Py_None; /* borrowed */
    fc_res_hold r = {0};
    int rc = FC_ERR_VALUE; /* until the encode has run */
    int64_t written = 0;
    if (!fc_state_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "OO|IIiiO:compress", kwlist, &a.t, &a.payload, &a.unit,
                                     &a.chunk, &a.world, &a.rank, &res))
        return NULL;
    if (single_views(self, &a, "x", 0) != FC_OK)
        goto error;
    if (res != Py_None && fc_res_adopt(res, &a.tv, &r, &a.err) != FC_OK)
        goto error;
    if (res != Py_None)
        (void)fc_res_in_place(self, &a.x, &r, a.unit, FC_RES8_SALT_GATHER);
    if (res != Py_None && fc_res_workspace(self, a.t, a.tv.buf.numel, &r, &a.err) != FC_OK)
        goto error;
    Py_BEGIN_ALLOW_THREADS
    rc = r.buf != NULL ? fc_res_unpack(self, &a.x, &r, &a.err) : FC_OK;
    if (rc == FC_OK)
        rc = fc_drive_compress(&self->core, &a.x, &a.tv.buf, &a.pv.buf, r.buf, a.unit, a.chunk,
                               a.world, a.rank, &written, &a.err);
    if (rc == FC_OK && r.buf != NULL)
        rc = fc_res_pack(self, &a.x, &r, a.unit, FC_RES8_SALT_GATHER, &a.err);
    Py_END_ALLOW_THREADS
error: /* and success: rc says which */
    fc_view_release(&a.tv);
    fc_view_release(&a.pv);
    fc_res_release(&r);
    return rc == FC_OK ? PyLong_FromLongLong(written) : STATE_ERR(self, &a.err);
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
    single_call a = {.world = 1};
    double alpha = 1.0;
    int rc = FC_ERR_VALUE; /* until the decode has run */
    if (!fc_state_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "OO|dIIi:decompress", kwlist, &a.payload, &a.t, &alpha,
                                     &a.unit, &a.chunk, &a.world))
        return NULL;
    if (single_views(self, &a, "acc", 1) != FC_OK)
        goto error;
    Py_BEGIN_ALLOW_THREADS
    rc = fc_drive_decompress(&self->core, &a.x, &a.pv.buf, &a.tv.buf, (float)alpha, a.unit, a.chunk,
                             a.world, &a.err);
    Py_END_ALLOW_THREADS
error: /* and success: rc says which */
    return fc_state_views_done(self, rc, &a.err, &a.pv, &a.tv, NULL);
}
