/* methods.c: the table of compressors, in the order methods() lists them. Adding a method is
 * one file (m_<name>.c) plus one line here. */
#include <string.h>
#include "methods/fc_method.h"

extern const fc_method fc_method_none, fc_method_fp16, fc_method_bf16, fc_method_int8, fc_method_fp8,
    fc_method_intn, fc_method_qsgd, fc_method_nc, fc_method_topk, fc_method_randomk,
    fc_method_thresholdv, fc_method_sketch, fc_method_gradiveq, fc_method_signsgd, fc_method_onebit,
    fc_method_dct, fc_method_adaptive;

static const fc_method *const table[] = {
    &fc_method_none,
    &fc_method_fp16,
    &fc_method_bf16,
    &fc_method_int8,
    &fc_method_fp8,
    &fc_method_intn,
    &fc_method_qsgd,
    &fc_method_nc,
    &fc_method_topk,
    &fc_method_randomk,
    &fc_method_thresholdv,
    &fc_method_sketch,
    &fc_method_gradiveq,
    &fc_method_signsgd,
    &fc_method_onebit,
    &fc_method_dct,
    &fc_method_adaptive,
};

#define N_METHODS ((int)(sizeof(table) / sizeof(table[0])))

int fc_method_count(void)
{
    return N_METHODS;
}

const fc_method *fc_method_at(int i)
{
    return i >= 0 && i < N_METHODS ? table[i] : NULL;
}

const fc_method *fc_method_by_name(const char *name)
{
    for (int i = 0; i < N_METHODS; i++)
        if (strcmp(table[i]->name, name) == 0)
            return table[i];
    return NULL;
}
