/* fc_tensor.h: borrowing a tensor's memory through DLPack, with the checks every entry point
 * needs (dtype, device, contiguity), reported with the argument's name. */
#ifndef FC_TENSOR_H
#define FC_TENSOR_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "driver/fc_core.h"
#include "python/fc_dlpack.h"

#define FC_DT_F32 (1u << FC_F32)
#define FC_DT_BF16 (1u << FC_BF16)
#define FC_DT_F16 (1u << FC_F16)
#define FC_DT_U8 (1u << FC_U8)
#define FC_DT_I64 (1u << FC_I64)
#define FC_DT_FLOATS (FC_DT_F32 | FC_DT_BF16 | FC_DT_F16)

typedef struct {
    fc_buf buf;
    int device_type; /* kDLCPU or kDLCUDA */
    int device_id;
    int read_only;
    PyObject *owner; /* the DLPack capsule when the slow path was taken; NULL otherwise */
} fc_view;

/* Borrows `obj` as a flat contiguous buffer of one of the dtypes in `dtypes`. The memory is
 * valid while `obj` is alive; call fc_view_release when done. */
int fc_view_get(PyObject *obj, const char *arg, unsigned dtypes, fc_view *v, fc_err *err);
/* The same for a tensor the State made through its allocator and keeps to itself (its CUDA
 * workspace and device buffers): no Python call at all (the negative-view probe, one Python
 * call per tensor, is for tensors a caller passes). */
int fc_view_get_own(PyObject *obj, const char *arg, unsigned dtypes, fc_view *v, fc_err *err);
void fc_view_release(fc_view *v);
const char *fc_dtype_name(int dtype);

/* The stream current for the view's CUDA device (the producer's exchange API, else
 * torch.cuda.current_stream): where work for this call is queued. */
int fc_view_stream(PyObject *obj, const fc_view *v, void **stream, fc_err *err);

#endif
