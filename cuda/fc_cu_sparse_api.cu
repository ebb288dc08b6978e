// fc_cu_sparse_api.cu: the function-table entries the sparse, aggregate and stateful methods add
// (fc_cuda.h): the device scratch a call needs, and copies between host and device memory (the
// unit states of gradiveq). The second round's entries are in fc_cu_fetch.cu.
#include "fc_cu_ctx.cuh"

int fc_cu_parts_scratch(const fc_cuda_encode_args *enc, const fc_cuda_decode_args *dec, int64_t *bytes,
                        fc_err *err); // fc_cu_parts.cu

int fc_cu_scratch_bytes(const fc_cuda_encode_args *enc, const fc_cuda_decode_args *dec, int64_t *bytes,
                        fc_err *err)
{
    int rc = FC_OK;
    fc_cu_device_guard dg = {0, 0};
    const int id = enc != NULL ? enc->h.m.id : dec->h.m.id;
    const fc_cu_method *m = fc_cu_method_by_id(id);
    const int parts = (enc != NULL ? enc->h.x.parts : dec->h.x.parts) != NULL;
    *bytes = 0;
    if (m == NULL && !parts)
        return fc_fail(err, FC_ERR_TYPE, "method id %d has no CUDA kernels in this build", id);
    if (!parts && m->scratch == NULL)
        return FC_OK;
    // CUB sizes its temporary storage for the current device
    FC_TRY(fc_cu_device_enter(&dg, enc != NULL ? enc->h.device : dec->h.device, err));
    // a parts method (adaptive): its rungs' scratch and its own
    rc = parts ? fc_cu_parts_scratch(enc, dec, bytes, err) : m->scratch(enc, dec, bytes, err);
error:
    fc_cu_device_leave(&dg);
    return rc;
}

int fc_cu_copy(fc_cuda_ctx *ctx, int device, void *stream, void *dst, const void *src, int64_t bytes,
               int to_host, fc_err *err)
{
    int rc = FC_OK;
    fc_cu_device_guard dg = {0, 0};
    cudaStream_t s = (cudaStream_t)stream;
    if (s == NULL && ctx->have_last) {
        s = ctx->last_stream;
        device = ctx->last_device;
    }
    if (bytes <= 0)
        return FC_OK;
    FC_TRY(fc_cu_device_enter(&dg, device, err));
    if (to_host == 1) {
        FC_CHECK_CUDA(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToHost, s), err, error);
        FC_CHECK_CUDA(cudaStreamSynchronize(s), err, error);
    } else {
        // from pageable host memory: returns once the bytes are staged, so the host copy may
        // change at once; the transfer stays in stream order
        FC_CHECK_CUDA(cudaMemcpyAsync(dst, src, (size_t)bytes,
                                      to_host == 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice, s),
                      err, error);
    }
error:
    fc_cu_device_leave(&dg);
    return rc;
}
