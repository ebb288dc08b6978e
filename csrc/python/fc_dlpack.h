/* fc_dlpack.h: the subset of the DLPack ABI (v1.x) this extension consumes, declared here so
 * the build needs neither torch nor a dlpack package. Layouts follow dlpack.h exactly. */
#ifndef FC_DLPACK_H
#define FC_DLPACK_H

#include <stdint.h>

typedef enum {
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3,
    kDLCUDAManaged = 13
} DLDeviceType;

typedef struct {
    int32_t device_type; /* DLDeviceType; an int so unknown producers' values stay defined */
    int32_t device_id;
} DLDevice;

typedef enum {
    kDLInt = 0,
    kDLUInt = 1,
    kDLFloat = 2,
    kDLBfloat = 4
} DLDataTypeCode;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* NULL means compact row-major */
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)

/* The C exchange API a framework publishes as `type(t).__dlpack_c_exchange_api__`
 * (capsule "dlpack_exchange_api"). Only the members up to the ones used are relied on. */
typedef struct DLPackExchangeAPIHeader {
    DLPackVersion version;
    struct DLPackExchangeAPIHeader *prev_api;
} DLPackExchangeAPIHeader;

typedef struct {
    DLPackExchangeAPIHeader header;
    int (*managed_tensor_allocator)(DLTensor *prototype, DLManagedTensorVersioned **out,
                                    void *error_ctx,
                                    void (*set_error)(void *ctx, const char *kind,
                                                      const char *message));
    int (*managed_tensor_from_py_object_no_sync)(void *py_object, DLManagedTensorVersioned **out);
    int (*managed_tensor_to_py_object_no_sync)(DLManagedTensorVersioned *tensor, void **out);
    int (*dltensor_from_py_object_no_sync)(void *py_object, DLTensor *out);
    int (*current_work_stream)(int32_t device_type, int32_t device_id, void **out_stream);
} DLPackExchangeAPI;

#endif
