/* fc_cfg.h: every method's parsed config, one struct per method, included by the CPU method
 * (csrc/methods/m_<method>.c, whose key table fills it and holds the defaults) and by its CUDA kernels
 * (cuda/fc_cu_<method>.cu, or fc_cu_blocks.cu for the block codecs, which read the fields): the
 * CUDA library receives the struct's bytes as the C side parsed them, so no key is looked up by
 * name and no default is written twice.
 * Plain C with fixed-size fields, so C and C++ (nvcc's host compiler) lay it out alike. */
#ifndef FC_CFG_H
#define FC_CFG_H

#include <stdint.h>
#include "common/fc_sparse_rules.h" /* fc_vc_shape */

#define FC_CFG_MAX 256 /* bytes reserved for any method's config struct */
#define FC_SUB_CFG 64  /* bytes of a sparsifier's value-codec config */

#ifdef __cplusplus
#define FC_ALIGN8 alignas(8)
#else
#define FC_ALIGN8 _Alignas(8)
#endif

/* CHOICE keys hold the index of the choice. */
enum { FC_SIGN_SCALED = 0, FC_SIGN_MAJORITY = 1 };
enum { FC_THRV_EXACT = 0, FC_THRV_SIGN = 1 };

typedef struct {
    int unused;
} fc_none_cfg; /* none, fp16, bf16 */

typedef struct {
    int64_t block_size;
    int stochastic;
} fc_int8_cfg;

typedef struct {
    int format; /* FC_FP8_E4M3 or FC_FP8_E5M2 */
    int64_t block_size;
} fc_fp8_cfg;

typedef struct {
    int64_t bits;
    int64_t block_size;
    int stochastic;
    int scheme; /* FC_INTN_ABSMAX or FC_INTN_MINMAX */
} fc_intn_cfg;

typedef struct {
    int64_t levels;
    int64_t bucket_size;
} fc_qsgd_cfg;

typedef struct {
    int64_t block_size;
} fc_nc_cfg;

typedef struct {
    int64_t block_size;
} fc_onebit_cfg;

typedef struct {
    int mode; /* FC_SIGN_SCALED or FC_SIGN_MAJORITY */
    int64_t block_size;
    double scale;
} fc_signsgd_cfg;

typedef struct {
    int64_t dim;
    int64_t k;
    int64_t warmup;
    int64_t refresh;
} fc_gradiveq_cfg;

typedef struct {
    int64_t rows;
    int64_t cols;
    int64_t k;
    int second_round;
} fc_sketch_cfg;

/* A sparsifier's value codec, resolved once by the method's check() (fc_vcodec_init): the
 * value method's config at its defaults, and what the kernels need of it. */
typedef struct {
    int quantize; /* FC_VC_* */
    fc_vc_shape shape;
    FC_ALIGN8 unsigned char sub[FC_SUB_CFG]; /* the value method's config struct */
} fc_vcodec;

typedef struct {
    double ratio;
    int64_t k;
    int quantize;
    fc_vcodec vc;
} fc_topk_cfg;

typedef struct {
    double ratio;
    int64_t k;
    int quantize;
    int scale;
    fc_vcodec vc;
} fc_randomk_cfg;

typedef struct {
    double threshold;
    int quantize;
    int values; /* FC_THRV_EXACT or FC_THRV_SIGN */
    fc_vcodec vc;
} fc_thresholdv_cfg;

typedef struct {
    int64_t block;      /* coefficients per transform: a power of two, 8 .. FC_DCT_MAX_BLOCK */
    int64_t k;          /* coefficients kept per block */
    int quantize;       /* FC_VC_*: the codec of the kept coefficients */
    int64_t value_bits; /* quantize intN: its bits (0: intN's default) */
    int value_stochastic; /* quantize int8 or intN: stochastic rounding */
    fc_vcodec vc;
} fc_dct_cfg;

enum { FC_ADAPTIVE_LGRECO = 0, FC_ADAPTIVE_PER_PARAM = 1 };

/* adaptive's own keys: what the Python chooser reads (the parts table says what is sent) */
typedef struct {
    double ratio;    /* the byte budget: raw bytes / ratio */
    int64_t every;   /* steps between choices */
    int objective;   /* FC_ADAPTIVE_LGRECO or FC_ADAPTIVE_PER_PARAM */
} fc_adaptive_cfg;

#endif
