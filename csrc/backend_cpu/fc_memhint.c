/* fc_memhint.c: see fc_memhint.h. */
#define _DEFAULT_SOURCE /* madvise, mincore */
#include "backend_cpu/fc_memhint.h"

#include <stdint.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#define FC_HUGE_BYTES ((uintptr_t)2 << 20)

void fc_memhint_fresh_output(void *data, size_t nbytes)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (nbytes < 2 * FC_HUGE_BYTES)
        return;
    const uintptr_t lo = ((uintptr_t)data + FC_HUGE_BYTES - 1) & ~(FC_HUGE_BYTES - 1);
    const uintptr_t hi = ((uintptr_t)data + nbytes) & ~(FC_HUGE_BYTES - 1);
    if (hi <= lo)
        return;
    /* A resident first page means the buffer is reused: its pages exist already, and marking
     * it again would only split the caller's mappings. */
    unsigned char resident = 1;
    if (mincore((void *)lo, 1, &resident) != 0 || (resident & 1))
        return;
    (void)madvise((void *)lo, (size_t)(hi - lo), MADV_HUGEPAGE); /* a hint: failure is harmless */
#else
    (void)data;
    (void)nbytes;
#endif
}
