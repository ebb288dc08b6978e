/* state_counters.c: the State's counters: read (with what its backend keeps apart, such as a
 * CUDA workspace's: fc_backend.h's read_counters), reset, and the caller's collectives added. */
#include "python/state.h" /* first: it includes Python.h */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda/fc_cuda_path.h"

/* The C core's own host memory: its grow-only scratch (fc_core.h: x, acc, the method's scratch,
 * the second round's picks, an 8-bit residual's carry, as allocated: 64-byte multiples), and
 * the largest fp32 workspace a device's 8-bit residual was unpacked into (held only during a
 * call). */
static long long scratch_bytes(const StateObject *self)
{
    const fc_core *c = &self->core;
    const int64_t carry = (c->carry_cap * (int64_t)sizeof(fc_res8_slot) + 63) / 64 * 64;
    return (long long)(4 * (c->x_cap + c->acc_cap + c->picks_cap) + (int64_t)c->mscr_cap + carry) +
           (long long)self->res_ws_peak;
}

/* The counters' backend (the device's, once the State did work there) reads them into *tot and
 * *res_sq, or (tot NULL) resets what it keeps apart: without the GIL, since a device's wait for
 * its queued work may be long (the State is busy for the call, fc_state_enter). */
static int counters_call(StateObject *self, fc_counters *tot, double *res_sq, fc_err *err)
{
    fc_cuda_call k;
    fc_exec x;
    int rc = fc_state_exec_counters(self, &k, &x, err);
    if (rc != FC_OK)
        return rc;
    Py_BEGIN_ALLOW_THREADS
    rc = tot != NULL ? x.b->read_counters(&self->core, &x, tot, res_sq, err)
                     : x.b->reset_counters(&self->core, &x, err);
    Py_END_ALLOW_THREADS
    return rc;
}

FC_DOCSTRING(fc_state_counters_doc, "counters() -> dict\n\nEverything counted since the last reset_counters().");

PyObject *fc_state_counters(StateObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!fc_state_ready(self))
        return NULL;
    fc_counters tot;
    const fc_counters *k = &tot;
    double res_sq = 0;
    long long res_bytes = 0;
    PyObject *result = NULL, *rel_o = NULL, *cos_o = NULL;
    fc_err err = {0};
    if (counters_call(self, &tot, &res_sq, &err) != FC_OK)
        return STATE_ERR(self, &err);
    for (int slot = 0; slot < FC_SLOTS; slot++) /* every home's bytes: 8-bit scales included */
        for (Py_ssize_t i = 0; i < PyList_Size(self->residuals[slot]); i++) {
            PyObject *t = PyList_GetItem(self->residuals[slot], i); /* borrowed */
            PyObject *nb = t != Py_None ? PyObject_GetAttrString(t, "nbytes") : NULL;
            if (t != Py_None && nb == NULL)
                return NULL;
            res_bytes += nb != NULL ? PyLong_AsLongLong(nb) : 0;
            Py_XDECREF(nb);
        }
    if (PyErr_Occurred())
        return NULL;
    double ratio = k->bytes_sent > 0 ? (double)k->bytes_raw / (double)k->bytes_sent : 1.0;
    double rel = k->ref_sq > 0 ? sqrt(k->err_sq / k->ref_sq) : 0.0;
    rel_o = k->stats_samples ? PyFloat_FromDouble(rel) : (Py_INCREF(Py_None), Py_None);
    cos_o = k->stats_samples ? PyFloat_FromDouble(k->cos_sum / (double)k->stats_samples)
                             : (Py_INCREF(Py_None), Py_None);
    if (rel_o == NULL || cos_o == NULL) {
        Py_XDECREF(rel_o);
        Py_XDECREF(cos_o);
        return NULL;
    }
    result = Py_BuildValue(
        "{s:s,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:d,s:d,s:L,s:L,s:L,s:d,s:d,s:d,s:d,s:L,"
        "s:N,s:N,s:L,s:d,s:L,s:L,s:I,s:i,s:L,s:L,s:L,s:L,s:d,s:d}",
        "method", self->core.method->name,
        "calls", (long long)k->calls,
        "calls_uncompressed", (long long)k->calls_uncompressed,
        "fallback_units", (long long)k->fallback_units,
        "elements", (long long)k->elements,
        "chunks_sent", (long long)k->chunks_sent,
        "bytes_raw", (long long)k->bytes_raw,
        "bytes_sent", (long long)k->bytes_sent,
        "bytes_compressed", (long long)(k->bytes_sent),
        "header_bytes", (long long)k->header_bytes,
        "meta_bytes", (long long)k->meta_bytes,
        "index_bytes", (long long)k->index_bytes,
        "ratio", ratio,
        "density", k->sent_elements ? (double)k->kept / (double)k->sent_elements : 1.0,
        "value_bytes", (long long)k->value_bytes,
        "nonfinite_in", (long long)k->nonfinite_in,
        "nonfinite_out", (long long)k->nonfinite_out,
        "compress_time_s", k->compress_s,
        "decompress_time_s", k->decompress_s,
        "comm_time_s", k->comm_s,
        "extra_collective_time_s", k->extra_collective_s,
        "extra_collectives", (long long)k->extra_collectives,
        "grad_rel_error", rel_o,
        "grad_cos_sim", cos_o,
        "error_samples", (long long)k->stats_samples,
        "residual_norm", sqrt(res_sq),
        "residual_bytes", res_bytes,
        "scratch_bytes", scratch_bytes(self),
        "step", self->core.step,
        "units", self->core.n_units,
        "saturated", (long long)k->saturated,
        "param_gather_calls", (long long)k->param_gather_calls,
        "param_gather_bytes_raw", (long long)k->param_gather_bytes_raw,
        "param_gather_bytes_sent", (long long)k->param_gather_bytes_sent,
        "param_gather_time_s", k->param_gather_s,
        "param_gather_codec_time_s", k->param_gather_codec_s);
    return result; /* the N codes gave rel_o and cos_o to it, or dropped them on failure */
}

FC_DOCSTRING(fc_state_reset_counters_doc, "reset_counters()\n\nZeroes every counter (residuals and units are kept).");

PyObject *fc_state_reset_counters(StateObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!fc_state_ready(self))
        return NULL;
    fc_err err = {0};
    if (counters_call(self, NULL, NULL, &err) != FC_OK)
        return STATE_ERR(self, &err);
    memset(&self->core.ctr, 0, sizeof(self->core.ctr));
    Py_RETURN_NONE;
}

FC_DOCSTRING(fc_state_add_comm_doc,
"add_comm(seconds, bytes_sent=0, bytes_raw=0, extra=False, fallback=False, header_bytes=0)\n\n"
"Adds a collective measured by the caller: its time, and for collectives beyond the\n"
"all-to-all (size exchanges, the all-gather of an all-reduce) its bytes. fallback: it went\n"
"uncompressed because the method's payload would have been no smaller (fallback_units).\n"
"header_bytes are protocol bytes (the ranks' handshake), counted in bytes_sent and header_bytes.");

PyObject *fc_state_add_comm(StateObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"seconds", "bytes_sent", "bytes_raw", "extra", "fallback",
                             "header_bytes", NULL};
    double seconds;
    long long sent = 0, raw = 0, header = 0;
    int extra = 0, fallback = 0;
    if (!fc_state_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "d|LLppL:add_comm", kwlist, &seconds, &sent, &raw,
                                     &extra, &fallback, &header))
        return NULL;
    if (!(seconds >= 0) || sent < 0 || raw < 0 || header < 0) {
        PyErr_SetString(PyExc_ValueError, "add_comm: seconds and byte counts must be >= 0");
        return NULL;
    }
    fc_counters *k = &self->core.ctr;
    if (extra) {
        k->extra_collectives++;
        k->extra_collective_s += seconds;
    }
    k->comm_s += seconds;
    k->bytes_sent += sent + header;
    k->header_bytes += header;
    k->bytes_raw += raw;
    k->fallback_units += fallback;
    Py_RETURN_NONE;
}

FC_DOCSTRING(fc_state_comm_mark_doc,
"comm_mark(device, stream, end, extra=False)\n\n"
"Records a CUDA event on `stream` (torch.cuda.current_stream(device).cuda_stream) before\n"
"(end=False) or after (end=True) a collective issued through torch.distributed, so that its\n"
"time, read with counters(), is the stream's wait for it rather than the host's enqueue.\n"
"extra: a collective beyond the all-to-all (counted in extra_collective_time_s too).");

PyObject *fc_state_comm_mark(StateObject *self, PyObject *args)
{
    int device, end, extra = 0, rc;
    PyObject *stream_o;
    fc_err err = {0};
    if (!fc_state_ready(self) ||
        !PyArg_ParseTuple(args, "iOp|p:comm_mark", &device, &stream_o, &end, &extra))
        return NULL;
    void *stream = PyLong_AsVoidPtr(stream_o);
    if (stream == NULL && PyErr_Occurred())
        return NULL;
    if (device < 0) {
        PyErr_Format(PyExc_ValueError, "device must be a CUDA device index >= 0, got %d", device);
        return NULL;
    }
    const fc_cuda_api *api = fc_cuda_api_get(&err);
    if (api == NULL)
        return STATE_ERR(self, &err);
    if (self->cuda_ctx == NULL && (self->cuda_ctx = api->ctx_new()) == NULL)
        return PyErr_NoMemory();
    rc = api->comm_mark(self->cuda_ctx, device, stream, end, extra ? FC_TIME_EXTRA : FC_TIME_COMM, &err);
    if (rc != FC_OK)
        return STATE_ERR(self, &err);
    Py_RETURN_NONE;
}

FC_DOCSTRING(fc_state_cuda_geometry_doc,
"_cuda_geometry(numel, dtype, world, rank) -> tuple[tuple[int, ...], ...]\n\n"
"Tests: per chunk, (start, length, sent, send offset, body bytes, receive offset) as the CUDA\n"
"kernels compute them for a unit of `numel` elements of dtype code `dtype` (0 fp32, 1 bf16,\n"
"2 fp16); host code of the CUDA library, so it runs without a GPU.");

PyObject *fc_state_cuda_geometry(StateObject *self, PyObject *args)
{
    long long numel;
    int dtype, world, rank;
    fc_err err = {0};
    PyObject *out = NULL;
    if (!fc_state_ready(self) || !PyArg_ParseTuple(args, "Liii:_cuda_geometry", &numel, &dtype, &world, &rank))
        return NULL;
    if (numel < 0 || dtype < FC_F32 || dtype > FC_F16 || fc_check_world(world, rank, &err) != FC_OK) {
        if (err.code == FC_OK)
            fc_fail(&err, FC_ERR_VALUE, "numel must be >= 0 and dtype 0, 1 or 2, got %lld and %d",
                    numel, dtype);
        return STATE_ERR(self, &err);
    }
    const fc_cuda_api *api = fc_cuda_api_get(&err);
    if (api == NULL)
        return STATE_ERR(self, &err);
    int64_t *rows = (int64_t *)PyMem_Malloc(sizeof(int64_t) * FC_GEO_COLS * (size_t)world);
    if (rows == NULL)
        return PyErr_NoMemory();
    fc_cuda_probe(&self->core, api, (int64_t)numel, dtype, world, rank, rows);
    out = PyTuple_New(world);
    for (int c = 0; out != NULL && c < world; c++) {
        PyObject *row = fc_sizes_tuple(rows + (size_t)c * FC_GEO_COLS, FC_GEO_COLS);
        if (row == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SetItem(out, c, row);
    }
    PyMem_Free(rows);
    return out;
}

FC_DOCSTRING(fc_state_add_param_gather_doc,
"add_param_gather(seconds, codec_seconds, bytes_sent, bytes_raw)\n\n"
"Adds one parameter all-gather measured by the caller (fsdpcomp.AllGather): its wall time, the\n"
"encode + decode part of it, the payload bytes this rank sent and what an uncompressed\n"
"all-gather would have sent. Kept apart from the gradient path's counters.");

PyObject *fc_state_add_param_gather(StateObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"seconds", "codec_seconds", "bytes_sent", "bytes_raw", NULL};
    double seconds, codec;
    long long sent, raw;
    if (!fc_state_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "ddLL:add_param_gather", kwlist, &seconds, &codec,
                                     &sent, &raw))
        return NULL;
    if (!(isfinite(seconds) && seconds >= 0 && codec >= 0 && codec <= seconds)) {
        PyErr_SetString(PyExc_ValueError, "add_param_gather: seconds and codec_seconds must be finite, "
                        ">= 0, and codec_seconds <= seconds");
        return NULL;
    }
    if (sent < 0 || raw < 0) {
        PyErr_Format(PyExc_ValueError, "add_param_gather: byte counts must be >= 0, got bytes_sent %lld, "
                     "bytes_raw %lld", sent, raw);
        return NULL;
    }
    fc_counters *k = &self->core.ctr;
    k->param_gather_calls++;
    k->param_gather_s += seconds;
    k->param_gather_codec_s += codec;
    k->param_gather_bytes_sent += sent;
    k->param_gather_bytes_raw += raw;
    Py_RETURN_NONE;
}
