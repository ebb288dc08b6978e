"""A short run of every CUDA entry point for compute-sanitizer (tests/gpu/run.sh sanitize): the
collective's encode (error feedback, NaN/Inf, W = 3 and 1), the decode of W payloads, the
single-payload compress/decompress and a corrupt header, for every method with CUDA kernels at a
few odd sizes. Exits 0 when every call returned and every payload decoded; the sanitizer's own exit
code says the rest. Emulated (FSDPCOMP_TEST_EMULATED=1, run.sh --emulated) it runs the same calls
on the host emulation, without a sanitizer: the script's own logic, checked in CI."""
from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import torch  # noqa: E402

import fsdpcomp  # noqa: E402
from gpu_common import DEV, cuda_configs, dev_state, sync  # noqa: E402


def main() -> int:
    gen = torch.Generator(device=DEV).manual_seed(0)
    calls = 0
    for method, cfg in cuda_configs():
        for n, world, rank in ((257, 3, 1), (4099, 3, 2), (33, 1, 0)):
            for dtype in (torch.float32, torch.bfloat16):
                c = dict(cfg, error_feedback=True, compress_own_chunk=world == 1, error_stats_every=1)
                g = (torch.randn(n, device=DEV, generator=gen) * 3).to(dtype)
                g[n // 3] = float("nan")
                slots = []
                for q in range(world):  # every rank's payload for `rank`, as rank q encodes it
                    sq = dev_state(method, c)
                    ss, _ = sq._core.plan(g, world, q)
                    send = torch.empty(sum(ss), dtype=torch.uint8, device=DEV)
                    ss = sq._core.encode(g, send, world, q, sq._core.begin(n))  # thresholdv: packed
                    off = sum(ss[:rank])
                    if ss[rank]:
                        slots.append(send[off:off + ss[rank]])
                    calls += 1
                st = dev_state(method, c)
                recv = torch.cat(slots) if slots else torch.empty(0, dtype=torch.uint8, device=DEV)
                out = torch.empty(-(-n // world) + 5, dtype=dtype, device=DEV)
                st._core.decode(recv, g, out, world, rank, st._core.begin(n))
                st.end_step()
                calls += 1
                st.counters()  # a PayloadError here is a bug: the payloads are as encode() wrote them
        st = dev_state(method, dict(cfg))  # every method, a second round's too
        for n in (1, 255, 4099):
            x = torch.randn(n, device=DEV, generator=gen)
            p = torch.empty(st._core.payload_bytes(n), dtype=torch.uint8, device=DEV)
            w = st._core.compress(x, p, unit=1, chunk=4, world=3, rank=2)
            acc = torch.zeros(n, device=DEV)
            st._core.decompress(p[:w], acc, alpha=0.5, unit=1, chunk=4, world=3)
            p[0] ^= 0xFF
            st._core.decompress(p[:w], acc, unit=1, chunk=4, world=3)
            calls += 3
        try:
            st.counters()
        except fsdpcomp.PayloadError:
            pass  # the corrupt header, on purpose
    sync()
    print(f"sanitize_run: {calls} calls over {len(cuda_configs())} configs returned")
    return 0


if __name__ == "__main__":
    sys.exit(main())
