// emu_stubs.cpp (tests only): what the emulation of the CUDA library replaces: the two CUB
// algorithms of fc_cu_cub.cu, as plain host loops with the same contract (a stable compaction in
// index order, a stable sort by key).
#include <algorithm>
#include <numeric>
#include <vector>

#include "fc_cu_sparse.cuh"

#ifdef FC_EMU_FAST
// fc_emu_swap(void **save_sp, void *load_sp), System V x86-64 (cuda_runtime.h says why).
__asm__(".text\n"
        ".globl fc_emu_swap\n"
        ".hidden fc_emu_swap\n"
        ".type fc_emu_swap, @function\n"
        "fc_emu_swap:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    subq $8, %rsp\n"
        "    stmxcsr (%rsp)\n"
        "    fnstcw 4(%rsp)\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    ldmxcsr (%rsp)\n"
        "    fldcw 4(%rsp)\n"
        "    addq $8, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size fc_emu_swap, .-fc_emu_swap\n");
#endif

cudaError_t fc_cu_select_if(void *temp, size_t *temp_bytes, const fc_cu_sel_pred &pred, int64_t *out,
                            int64_t *num, int64_t n, cudaStream_t)
{
    if (temp == NULL) {
        *temp_bytes = 64; // some, as CUB asks for
        return cudaSuccess;
    }
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (pred(i))
            out[m++] = i;
    *num = m;
    return cudaSuccess;
}

cudaError_t fc_cu_sort_pairs(void *temp, size_t *temp_bytes, const uint32_t *kin, uint32_t *kout,
                             const float *vin, float *vout, int64_t n, int end_bit, cudaStream_t)
{
    if (temp == NULL) {
        *temp_bytes = 64;
        return cudaSuccess;
    }
    const uint32_t mask = end_bit >= 32 ? 0xffffffffu : (1u << end_bit) - 1u;
    std::vector<int64_t> order((size_t)n);
    std::iota(order.begin(), order.end(), (int64_t)0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return (kin[a] & mask) < (kin[b] & mask); });
    for (int64_t j = 0; j < n; j++) {
        kout[j] = kin[order[(size_t)j]];
        vout[j] = vin[order[(size_t)j]];
    }
    return cudaSuccess;
}
