// fc_cu_sketch.cuh: what sketch's two files share: its config as the kernels read it, the row keys,
// and the table build of fc_cu_sketch_table.cu that fc_cu_sketch.cu's encode calls.
#ifndef FC_CU_SKETCH_CUH
#define FC_CU_SKETCH_CUH

#include "fc_cu_sparse.cuh"
#include "common/fc_hash.h"

#define SK_MAX_ROWS 15

struct sk_cfg {
    int rows;
    int64_t ccfg; // the config's cols; 0: each chunk's table sized to it (fc_sketch_cols)
    int64_t cols; // the widest table of the call: the stride of its (chunk, bucket) keys
    fc_cu_krule kr; // sketch_k: fc_rule_sparse_k(n, k, 1.0)
    int second;
};

// The table width of a chunk of n elements (the CPU's sketch_cols).
__host__ __device__ __forceinline__ int64_t sk_width(const sk_cfg &c, int64_t n)
{
    return fc_sketch_cols(c.rows, c.ccfg, n);
}

// Row j's hash key of chunk c: one shared draw per row (m_sketch.c's row_key); shared.chunk is
// the id of chunk 0 (compress()'s `chunk`, else 0).
__host__ __device__ __forceinline__ uint32_t sk_row_key(fc_rng shared, int c, int j)
{
    shared.chunk += (uint32_t)c;
    return fc_rng_draw4(&shared, 0xFFFFFF00u + (uint32_t)(j >> 2)).v[j & 3];
}

// The row keys of the chunk a block works on, in shared memory (a barrier: every thread calls it).
__device__ __forceinline__ void sk_keys(fc_rng shared, int c, int rows, uint32_t *keys)
{
    for (int j = threadIdx.x; j < rows; j += blockDim.x)
        keys[j] = sk_row_key(shared, c, j);
    __syncthreads();
}

// ---- the table build without a sort (fc_cu_sketch_table.cu), for tables up to SKT_MAX_COLS wide

#define SKT_MAX_COLS 4096
#define SKT_ROWS 4 // rows per pass: the scratch holds this many rows' terms of the unit

// Its scratch: every sent element's term and bucket of a pass's rows, grouped by bucket group
// (32 buckets) in index order; per-tile counts of each group and their totals.
struct sk_table_parts {
    float *terms;
    uint8_t *fine; // the bucket within its group
    uint32_t *cnt, *tot;
};

static inline bool sk_table_fits(const sk_cfg &c)
{
    return c.cols <= SKT_MAX_COLS;
}

// Carves the parts from ar (sizing when it has no base) for the encode of g with config c.
void sk_table_carve(fc_cu_arena &ar, const fc_cuda_geom &g, const sk_cfg &c, sk_table_parts *p);

// Every sent chunk's table into its payload body, the CPU's bytes: each bucket's terms added in
// index order from 0.0f (fc_add_sat), a NaN bucket the canonical NaN.
int sk_table_build(const fc_cu_enc &e, const sk_cfg &c, fc_rng shared, const sk_table_parts &p, cudaStream_t s,
                   fc_err *err);

#endif
