// fc_cu_methods.cu: the CUDA method table. A method's kernels are one fc_cu_<name>.cu (a block
// codec's: a `make` and one line in fc_cu_blocks.cu) plus one line here; a method missing from
// this list makes CUDA tensors raise a clear TypeError.
#include "fc_cu.cuh"

extern const fc_cu_method fc_cu_none, fc_cu_fp16, fc_cu_bf16, fc_cu_int8, fc_cu_fp8, fc_cu_intn,
    fc_cu_qsgd, fc_cu_nc, fc_cu_onebit;
// the sparse, aggregate and stateful methods (their shared parts: fc_cu_sparse.cuh)
extern const fc_cu_method fc_cu_signsgd, fc_cu_gradiveq, fc_cu_topk, fc_cu_thresholdv,
    fc_cu_randomk, fc_cu_sketch, fc_cu_dct;

static const fc_cu_method *const table[] = {
    &fc_cu_none,
    &fc_cu_fp16,
    &fc_cu_bf16,
    &fc_cu_int8,
    &fc_cu_fp8,
    &fc_cu_intn,
    &fc_cu_qsgd,
    &fc_cu_nc,
    &fc_cu_onebit,
    &fc_cu_signsgd,
    &fc_cu_gradiveq,
    &fc_cu_topk,
    &fc_cu_thresholdv,
    &fc_cu_randomk,
    &fc_cu_sketch,
    &fc_cu_dct,
};

const fc_cu_method *fc_cu_method_by_id(int id)
{
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (table[i]->id == id)
            return table[i];
    return NULL;
}
