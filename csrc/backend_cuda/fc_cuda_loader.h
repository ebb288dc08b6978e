/* fc_cuda_loader.h: the lazily loaded CUDA library as seen from _C: its function table, found
 * next to _C's own file on the first CUDA tensor; _C itself links no CUDA. */
#ifndef FC_CUDA_LOADER_H
#define FC_CUDA_LOADER_H

#include "backend_cuda/fc_cuda.h"
#include "common/fc_status.h"

/* The table, loading the library on first use; NULL with err filled when there is none. */
const fc_cuda_api *fc_cuda_api_get(fc_err *err);
/* The table if already loaded, else NULL (never loads: for destructors). */
const fc_cuda_api *fc_cuda_api_loaded(void);
/* The path tried (or used), for messages and tests. */
const char *fc_cuda_lib_path(void);

#endif
