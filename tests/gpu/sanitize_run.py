"""A short run of every CUDA entry point for compute-sanitizer (tests/gpu/run.sh sanitize): the
collective's encode (error feedback, NaN/Inf, W = 3 and 1), the decode of W payloads, the
single-payload compress/decompress and a corrupt header, for every method with CUDA kernels at a
few odd sizes. Exits 0 when every call returned; the sanitizer's own exit code says the rest."""
from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import torch  # noqa: E402

import fsdpcomp  # noqa: E402
from gpu_common import cuda_configs  # noqa: E402


def main() -> int:
    gen = torch.Generator(device="cuda").manual_seed(0)
    calls = 0
    for method, cfg in cuda_configs():
        for n, world, rank in ((257, 3, 1), (4099, 3, 2), (33, 1, 0)):
            for dtype in (torch.float32, torch.bfloat16):
                c = dict(cfg, error_feedback=True, compress_own_chunk=world == 1, error_stats_every=1)
                g = (torch.randn(n, device="cuda", generator=gen) * 3).to(dtype)
                g[n // 3] = float("nan")
                slots = []
                for q in range(world):  # every rank's payload for `rank`, as rank q encodes it
                    sq = fsdpcomp.CommState(method, c)
                    ss, _ = sq._core.plan(g, world, q)
                    send = torch.empty(sum(ss), dtype=torch.uint8, device="cuda")
                    sq._core.encode(g, send, world, q, sq._core.begin(n))
                    off = sum(ss[:rank])
                    if ss[rank]:
                        slots.append(send[off:off + ss[rank]])
                    calls += 1
                st = fsdpcomp.CommState(method, c)
                recv = torch.cat(slots) if slots else torch.empty(0, dtype=torch.uint8, device="cuda")
                out = torch.empty(-(-n // world) + 5, dtype=dtype, device="cuda")
                st._core.decode(recv, g, out, world, rank, st._core.begin(n))
                st.end_step()
                calls += 1
                try:
                    st.counters()
                except fsdpcomp.PayloadError:  # data-dependent sizes sliced by plan bounds here
                    pass
        st = fsdpcomp.CommState(method, dict(cfg))  # every method, a second round's too
        for n in (1, 255, 4099):
            x = torch.randn(n, device="cuda", generator=gen)
            p = torch.empty(st._core.payload_bytes(n), dtype=torch.uint8, device="cuda")
            w = st._core.compress(x, p, unit=1, chunk=4, world=3, rank=2)
            acc = torch.zeros(n, device="cuda")
            st._core.decompress(p[:w], acc, alpha=0.5, unit=1, chunk=4, world=3)
            p[0] ^= 0xFF
            st._core.decompress(p[:w], acc, unit=1, chunk=4, world=3)
            calls += 3
        try:
            st.counters()
        except fsdpcomp.PayloadError:
            pass  # the corrupt header, on purpose
    torch.cuda.synchronize()
    print(f"sanitize_run: {calls} calls over {len(cuda_configs())} configs returned")
    return 0


if __name__ == "__main__":
    sys.exit(main())
