/* fc_simd.c: the one switch between the CPU fast paths and their scalar references. */
#include "methods/fc_simd.h"

int fc_cpu_reference = 0;
