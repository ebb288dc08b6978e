/* fc_cuda_loader.c: dlopen() of the CUDA library, once, on the first CUDA tensor: import fsdpcomp
 * never needs CUDA. Which file: $FSDPCOMP_CUDA_LIB (a path: tests' emulated library), else the one
 * fsdpcomp chose for the driver (fc_cuda_lib_choose, from fsdpcomp/_cuda_check.py), else the one
 * $FSDPCOMP_CUDA_LIBRARY names (cu13: _fsdpcomp_cuda.so, cu12: _fsdpcomp_cuda12.so), else the
 * CUDA 13 one, each next to _C's own file. The choice is read here too, not only in Python, so
 * that _C.cuda_info() called first (tests, tools) loads the same file a forced run would. */
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
static char chosen[4096]; /* set by fc_cuda_lib_choose before the first load */
static int tried;         /* load() has run: the choice is made for the life of the process */

/* The file name $FSDPCOMP_CUDA_LIBRARY asks for; NULL with why filled for a value it is not. */
static const char *library_name(void)
{
    const char *lib = getenv("FSDPCOMP_CUDA_LIBRARY");
    if (lib == NULL || lib[0] == '\0' || strcmp(lib, "cu13") == 0)
        return "_fsdpcomp_cuda.so";
    if (strcmp(lib, "cu12") == 0)
        return "_fsdpcomp_cuda12.so";
    snprintf(why, sizeof(why), "FSDPCOMP_CUDA_LIBRARY must be cu13 or cu12, got '%.100s'", lib);
    return NULL;
}

static void load(void)
{
    const char *env = getenv("FSDPCOMP_CUDA_LIB");
    Dl_info info;
    const char *name = NULL;
    tried = 1;
    if (env != NULL && env[0] != '\0') {
        snprintf(path, sizeof(path), "%s", env);
    } else if (chosen[0] != '\0') {
        snprintf(path, sizeof(path), "%s", chosen);
    } else if ((name = library_name()) == NULL) {
        return;
    } else if (dladdr((void *)&fc_cuda_api_get, &info) != 0 && info.dli_fname != NULL) {
        const char *slash = strrchr(info.dli_fname, '/');
        int dir = slash ? (int)(slash - info.dli_fname) : 1;
        snprintf(path, sizeof(path), "%.*s/%s", dir, slash ? info.dli_fname : ".", name);
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

int fc_cuda_lib_choose(const char *file)
{
    /* pthread_once has no "already ran?" query, hence tried; the GIL serialises this against the
     * first fc_cuda_api_get, which Python reaches only after choosing */
    if (tried || strlen(file) >= sizeof(chosen))
        return -1;
    snprintf(chosen, sizeof(chosen), "%s", file);
    return 0;
}

const fc_cuda_api *fc_cuda_api_loaded(void)
{
    return api;
}

const char *fc_cuda_lib_path(void)
{
    return path;
}
