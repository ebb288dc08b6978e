/* state_exec.c: the backend of a State's call, picked once by its tensors' device: the CPU's, or
 * the CUDA library's with the State's context, device workspace and current stream. */
#include "python/state.h" /* first: it includes Python.h */
#include <string.h>

#include "backend_cuda/fc_cuda_path.h"

/* Loads the CUDA library, the state's context and device workspace, and the current stream
 * of grad's device. The workspace comes from the allocator (torch's), never cudaMalloc. */
static int fc_state_cuda_prepare(StateObject *self, PyObject *grad, const fc_view *g,
                                 fc_cuda_call *k, fc_err *err)
{
    fc_view wv = {0};
    memset(k, 0, sizeof(*k));
    k->api = fc_cuda_api_get(err);
    if (k->api == NULL)
        return err->code;
    if (self->cuda_ctx == NULL) {
        self->cuda_ctx = k->api->ctx_new();
        if (self->cuda_ctx == NULL)
            return fc_fail(err, FC_ERR_NOMEM, "could not allocate the CUDA context");
    }
    if (self->cuda_ws == NULL) {
        if (self->allocator == Py_None)
            return fc_fail(err, FC_ERR_STATE, "the CUDA path needs an allocator (State(..., "
                           "allocator=...)) for its device workspace; fsdpcomp.CommState provides one");
        PyObject *ws = PyObject_CallFunction(self->allocator, "LsO",
                                             (long long)(FC_CUDA_WS_BYTES / 4), "float32", grad);
        if (ws == NULL)
            return fc_fail(err, FC_ERR_PYTHON, "");
        self->cuda_ws = ws;
    }
    if (fc_view_get_own(self->cuda_ws, "workspace", FC_DT_F32, &wv, err) != FC_OK)
        return err->code;
    int ok = fc_state_on_cuda(self, &wv) && wv.device_id == g->device_id &&
             wv.buf.numel * 4 >= FC_CUDA_WS_BYTES;
    k->ws = (fc_cuda_ws *)wv.buf.data;
    fc_view_release(&wv); /* the State keeps the tensor alive */
    if (!ok)
        return fc_fail(err, FC_ERR_STATE, "this State's CUDA workspace is not on cuda:%d: one "
                       "State serves one device", g->device_id);
    k->ctx = self->cuda_ctx;
    k->device = g->device_id;
    self->cuda_host.owner = self;
    self->cuda_host.buffer = fc_state_cuda_buffer;
    k->host = &self->cuda_host;
    k->like = grad;
    return fc_view_stream(grad, g, &k->stream, err);
}

int fc_state_exec(StateObject *self, PyObject *like, const fc_view *v, const fc_prep *p,
                  fc_cuda_call *k, fc_exec *x, fc_err *err)
{
    x->b = &fc_backend_cpu;
    x->k = NULL;
    if (fc_state_on_cuda(self, v)) {
        int rc = fc_state_cuda_prepare(self, like, v, k, err);
        if (rc != FC_OK)
            return rc;
        x->b = &fc_backend_cuda;
        x->k = k;
    }
    return p != NULL ? x->b->prepare(&self->core, x, p, err) : FC_OK;
}

int fc_state_exec_counters(StateObject *self, fc_cuda_call *k, fc_exec *x, fc_err *err)
{
    fc_view wv = {0};
    x->b = &fc_backend_cpu;
    x->k = NULL;
    if (self->cuda_ctx == NULL) /* no device work yet */
        return FC_OK;
    memset(k, 0, sizeof(*k));
    k->api = fc_cuda_api_get(err);
    if (k->api == NULL)
        return err->code;
    if (self->cuda_ws != NULL) { /* none: the State's only CUDA work was comm marks */
        if (fc_view_get_own(self->cuda_ws, "workspace", FC_DT_F32, &wv, err) != FC_OK)
            return err->code;
        k->ws = (fc_cuda_ws *)wv.buf.data;
        fc_view_release(&wv); /* the State keeps the tensor alive */
    }
    k->ctx = self->cuda_ctx;
    x->b = &fc_backend_cuda;
    x->k = k;
    return FC_OK;
}
