/* fc_method_id.h: every method's wire id, one list for the C methods (m_*.c, fc_method.id) and
 * the CUDA table (cuda/fc_cu_methods.cu). A payload's header carries the id, so a number here
 * never changes and a new method takes the next free one. */
#ifndef FC_METHOD_ID_H
#define FC_METHOD_ID_H

enum fc_method_id {
    FC_ID_NONE = 0,
    FC_ID_FP16 = 1,
    FC_ID_BF16 = 2,
    FC_ID_INT8 = 3,
    FC_ID_FP8 = 4,
    FC_ID_INTN = 5,
    FC_ID_QSGD = 6,
    FC_ID_NC = 7,
    FC_ID_TOPK = 8,
    FC_ID_RANDOMK = 9,
    FC_ID_THRESHOLDV = 10,
    FC_ID_SKETCH = 11,
    FC_ID_GRADIVEQ = 12,
    FC_ID_SIGNSGD = 13,
    FC_ID_ONEBIT = 14,
    FC_ID_DCT = 15,
    FC_ID_ADAPTIVE = 16,
};

#endif
