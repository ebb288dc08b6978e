/* state_counters.c: the State's counters: read (harvesting the CUDA workspace's), reset, and
 * the caller's collectives added. */
#include "state.h" /* first: it includes Python.h */
#include <math.h>
#include <string.h>

FC_DOCSTRING(fc_state_counters_doc, "counters() -> dict\n\nEverything counted since the last reset_counters().");

PyObject *fc_state_counters(StateObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!fc_state_ready(self))
        return NULL;
    fc_counters tot = self->core.ctr;
    const fc_counters *k = &tot;
    double res_sq = 0;
    long long res_bytes = 0;
    static fc_cuda_ws dws; /* large: static, and only touched with the GIL held */
    const int on_cuda = self->cuda_ctx != NULL && self->cuda_ws != NULL;
    if (on_cuda) {
        fc_err err = {0};
        fc_view wv = {0};
        double sec[FC_TIME_KINDS];
        const fc_cuda_api *api = fc_cuda_api_get(&err);
        if (api == NULL || fc_view_get(self->cuda_ws, "workspace", FC_DT_F32, &wv, &err) != FC_OK)
            return STATE_ERR(self, &err);
        int rc = api->read_counters(self->cuda_ctx, (const fc_cuda_ws *)wv.buf.data, &dws, sec, &err);
        fc_view_release(&wv);
        if (rc != FC_OK)
            return STATE_ERR(self, &err);
        /* harvested event times become part of the host totals */
        self->core.ctr.compress_s += sec[FC_TIME_COMPRESS];
        self->core.ctr.comm_s += sec[FC_TIME_COMM];
        self->core.ctr.decompress_s += sec[FC_TIME_DECOMPRESS];
        tot = self->core.ctr;
        tot.nonfinite_in += (int64_t)dws.nonfinite_in;
        tot.nonfinite_out += (int64_t)dws.nonfinite_out;
        tot.err_sq += dws.err_sq;
        tot.ref_sq += dws.ref_sq;
        tot.cos_sum += dws.cos_sum;
        tot.stats_samples += (int64_t)dws.samples;
        if (dws.payload_error != 0) {
            static const char *const what[] = {"", "bad magic", "wrong wire version",
                                               "another method", "another dtype",
                                               "another unit or step (ranks called the hook in "
                                               "different orders)", "another element count",
                                               "a body that does not fit its slot"};
            unsigned code = dws.payload_error < 8 ? dws.payload_error : 0;
            fc_fail(&err, FC_ERR_PAYLOAD, "a CUDA decode rejected the payload from rank %d "
                    "(header says unit %u, step %u): %s; its output was set to NaN "
                    "(reset_counters() clears this)", dws.payload_error_rank,
                    dws.payload_error_unit, dws.payload_error_step, what[code]);
            return STATE_ERR(self, &err);
        }
    }
    for (int32_t u = 0; u < self->core.n_units; u++)
        res_sq += on_cuda && u < FC_CUDA_MAX_UNITS ? dws.unit_sq[u] : self->core.units[u].residual_sq;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(self->residuals); i++) {
        PyObject *t = PyList_GET_ITEM(self->residuals, i); /* borrowed */
        if (t != Py_None)
            res_bytes += (long long)self->core.units[i].numel *
                         (self->core.common.residual_dtype == 0 ? 4 : 2);
    }
    double ratio = k->bytes_sent > 0 ? (double)k->bytes_raw / (double)k->bytes_sent : 1.0;
    double rel = k->ref_sq > 0 ? sqrt(k->err_sq / k->ref_sq) : 0.0;
    PyObject *rel_o = k->stats_samples ? PyFloat_FromDouble(rel) : (Py_INCREF(Py_None), Py_None);
    PyObject *cos_o = k->stats_samples ? PyFloat_FromDouble(k->cos_sum / (double)k->stats_samples)
                                       : (Py_INCREF(Py_None), Py_None);
    if (rel_o == NULL || cos_o == NULL) {
        Py_XDECREF(rel_o);
        Py_XDECREF(cos_o);
        return NULL;
    }
    return Py_BuildValue(
        "{s:s,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:d,s:d,s:L,s:L,s:L,s:d,s:d,s:d,s:d,s:L,"
        "s:N,s:N,s:L,s:d,s:L,s:I,s:i}",
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
        "step", self->core.step,
        "units", self->core.n_units);
}

FC_DOCSTRING(fc_state_reset_counters_doc, "reset_counters()\n\nZeroes every counter (residuals and units are kept).");

PyObject *fc_state_reset_counters(StateObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!fc_state_ready(self))
        return NULL;
    if (self->cuda_ctx != NULL && self->cuda_ws != NULL) {
        fc_err err = {0};
        fc_view wv = {0};
        const fc_cuda_api *api = fc_cuda_api_get(&err);
        if (api == NULL || fc_view_get(self->cuda_ws, "workspace", FC_DT_F32, &wv, &err) != FC_OK)
            return STATE_ERR(self, &err);
        int rc = api->reset_counters(self->cuda_ctx, (fc_cuda_ws *)wv.buf.data, &err);
        fc_view_release(&wv);
        if (rc != FC_OK)
            return STATE_ERR(self, &err);
    }
    memset(&self->core.ctr, 0, sizeof(self->core.ctr));
    Py_RETURN_NONE;
}

FC_DOCSTRING(fc_state_add_comm_doc,
"add_comm(seconds, bytes_sent=0, bytes_raw=0, extra=False, fallback=False)\n\n"
"Adds a collective measured by the caller: its time, and for collectives beyond the\n"
"all-to-all (size exchanges, the all-gather of an all-reduce) its bytes. fallback: it went\n"
"uncompressed because the method's payload would have been no smaller (fallback_units).");

PyObject *fc_state_add_comm(StateObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"seconds", "bytes_sent", "bytes_raw", "extra", "fallback", NULL};
    double seconds;
    long long sent = 0, raw = 0;
    int extra = 0, fallback = 0;
    if (!fc_state_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "d|LLpp:add_comm", kwlist, &seconds, &sent, &raw,
                                     &extra, &fallback))
        return NULL;
    if (!(seconds >= 0) || sent < 0 || raw < 0) {
        PyErr_SetString(PyExc_ValueError, "add_comm: seconds and byte counts must be >= 0");
        return NULL;
    }
    fc_counters *k = &self->core.ctr;
    if (extra) {
        k->extra_collectives++;
        k->extra_collective_s += seconds;
    }
    k->comm_s += seconds;
    k->bytes_sent += sent;
    k->bytes_raw += raw;
    k->fallback_units += fallback;
    Py_RETURN_NONE;
}
