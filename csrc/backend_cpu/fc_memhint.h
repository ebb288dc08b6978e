/* fc_memhint.h: operating-system hints about host buffers the decoder is about to fill. */
#ifndef FC_MEMHINT_H
#define FC_MEMHINT_H

#include <stddef.h>

/* The reduce-scatter output comes from the caller's allocator, fresh on every call (FSDP1 and
 * FSDP2 both allocate it per call, and on the CPU a large block is a new anonymous mapping).
 * Filling it faults in a 4 KiB page at a time, which cost more than the decode itself (17-22 ms
 * of 27-31 ms for an 8M-element shard here). When the buffer is large and not yet touched, this
 * asks for transparent huge pages over its 2 MiB-aligned interior: one fault per 2 MiB. Only a
 * hint: it changes no byte, leaves touched (reused) buffers alone, and does nothing where the
 * kernel has no THP or the call fails. */
void fc_memhint_fresh_output(void *data, size_t nbytes);

#endif
