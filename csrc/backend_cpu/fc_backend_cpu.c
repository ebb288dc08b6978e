/* fc_backend_cpu.c: the CPU backend's table (fc_backend.h): the loops of fc_encode.c (the per-peer
 * parts too), fc_decode.c, fc_fetch_cpu.c (the second round) and fc_res8.c, and the entries the
 * CPU needs no work for. Here, with the loops, as fc_backend_cuda sits with the CUDA backend (fc_cuda_path.c). */
#include "backend_cpu/fc_cpu.h"

/* The CPU backend's scratch grows inside each call, and its counters are the host's. */
static int cpu_prepare(fc_core *s, const fc_exec *x, const fc_prep *p, fc_err *err)
{
    (void)s, (void)x, (void)p, (void)err;
    return FC_OK;
}

static int cpu_read_counters(fc_core *s, const fc_exec *x, fc_counters *tot, double *res_sq,
                             fc_err *err)
{
    (void)x, (void)err;
    *tot = s->ctr;
    *res_sq = fc_drive_residual_sq(s, NULL, 0);
    return FC_OK;
}

static int cpu_reset_counters(fc_core *s, const fc_exec *x, fc_err *err)
{
    (void)s, (void)x, (void)err;
    return FC_OK;
}

const fc_backend fc_backend_cpu = {
    1,
    cpu_prepare,
    cpu_read_counters,
    cpu_reset_counters,
    fc_cpu_encode,
    fc_cpu_encode_parts_open,
    fc_cpu_encode_piece,
    fc_cpu_decode,
    fc_cpu_compress,
    fc_cpu_decompress,
    fc_cpu_fetch_picks,
    fc_cpu_fetch_values,
    fc_cpu_fetch_finish,
    fc_cpu_res8_pack,
    fc_cpu_res8_unpack,
    fc_cpu_ef,
};
