/* fc_status.h: status codes and the error record every C function fills instead of raising. */
#ifndef FC_STATUS_H
#define FC_STATUS_H

#include <stdarg.h>
#include <stdio.h>

/* Which Python exception the translator raises for each code. */
typedef enum {
    FC_OK = 0,
    FC_ERR_VALUE = 1,   /* ValueError: a bad value (config, size, ...) */
    FC_ERR_TYPE = 2,    /* TypeError: wrong kind of object, dtype, device */
    FC_ERR_NOMEM = 3,   /* MemoryError */
    FC_ERR_PAYLOAD = 4, /* fsdpcomp.PayloadError (a ValueError): malformed wire data */
    FC_ERR_CUDA = 5,    /* fsdpcomp.CudaError (a RuntimeError) */
    FC_ERR_STATE = 6,   /* RuntimeError: the call does not fit the state (desync, reentry) */
    FC_ERR_PYTHON = 7   /* a Python exception is already set */
} fc_code;

typedef struct {
    int code;
    char msg[512];
} fc_err;

/* Records the first failure only: the innermost message is the most precise one. */
static inline int fc_fail(fc_err *err, int code, const char *fmt, ...)
{
    if (err != NULL && err->code == FC_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

#define FC_TRY(expr)                 \
    do {                             \
        int fc_try_rc_ = (expr);     \
        if (fc_try_rc_ != FC_OK) {   \
            rc = fc_try_rc_;         \
            goto error;              \
        }                            \
    } while (0)

#endif
