// emu_swap.cpp (tests only): the emulation's fiber switch, apart from the CUDA library's stubs so
// that a program of its own (tests/cuda/test_cuda_emu_adversarial.py) links it alone.
#include "cuda_runtime.h"

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
