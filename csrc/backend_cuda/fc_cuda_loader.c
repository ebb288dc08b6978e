/* fc_cuda_loader.c: dlopen() of _fsdpcomp_cuda.so from the directory _C was loaded from (or
 * $FSDPCOMP_CUDA_LIB), once, on the first CUDA tensor: import fsdpcomp never needs CUDA. */
#define _GNU_SOURCE /* dladdr */
#include "backend_cuda/fc_cuda_loader.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const fc_cuda_api *api = NULL;
static char path[4096];
static char why[800];

static void load(void)
{
    const char *env = getenv("FSDPCOMP_CUDA_LIB");
    Dl_info info;
    if (env != NULL && env[0] != '\0') {
        snprintf(path, sizeof(path), "%s", env);
    } else if (dladdr((void *)&fc_cuda_api_get, &info) != 0 && info.dli_fname != NULL) {
        const char *slash = strrchr(info.dli_fname, '/');
        int dir = slash ? (int)(slash - info.dli_fname) : 1;
        snprintf(path, sizeof(path), "%.*s/_fsdpcomp_cuda.so", dir, slash ? info.dli_fname : ".");
    } else {
        snprintf(why, sizeof(why), "could not find where fsdpcomp._C was loaded from");
        return;
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *e = dlerror();
        snprintf(why, sizeof(why), "the CUDA part of fsdpcomp could not be loaded from %.300s: %.300s "
                 "(rebuild with nvcc found, FSDPCOMP_CUDA=1)", path, e ? e : "no message");
        return;
    }
    fc_cuda_get_api_fn get = (fc_cuda_get_api_fn)dlsym(lib, "fc_cuda_get_api");
    const fc_cuda_api *a = get != NULL ? get(FC_CUDA_ABI) : NULL;
    if (a == NULL || a->abi != FC_CUDA_ABI) {
        snprintf(why, sizeof(why), "%.400s is not a matching fsdpcomp CUDA library (ABI %d expected): "
                 "rebuild fsdpcomp", path, FC_CUDA_ABI);
        dlclose(lib);
        return;
    }
    api = a; /* the library stays loaded for the life of the process */
}

const fc_cuda_api *fc_cuda_api_get(fc_err *err)
{
    pthread_once(&once, load);
    if (api == NULL)
        fc_fail(err, FC_ERR_CUDA, "%s", why);
    return api;
}

const fc_cuda_api *fc_cuda_api_loaded(void)
{
    return api;
}

const char *fc_cuda_lib_path(void)
{
    return path;
}
