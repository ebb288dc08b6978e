"""The CUDA kernels' chunk geometry (fc_cu_span, fc_cu_sent, the send/receive offsets and body
sizes of cuda/fc_cu.cuh, as the collective's fc_cuda_geom sets them up) against the CPU
driver's plan and real CPU payloads, for many (method, size, world, rank, dtype). The library's
host code answers (State._cuda_geometry): no GPU needed, only the built CUDA library."""
import struct

import pytest
import torch

import fsdpcomp
from fsdpcomp import _C

if not _C.cuda_info()["available"]:
    pytest.skip("no CUDA library in this build: " + str(_C.cuda_info()["error"]), allow_module_level=True)

DTYPES = {0: torch.float32, 1: torch.bfloat16, 2: torch.float16}
SIZES = [0, 1, 7, 255, 257, 4099, 65541]
WORLDS = [1, 2, 3, 7, 8]
CONFIGS = [("none", {}), ("fp16", {}), ("bf16", {}), ("int8", {"block_size": 64}),
           ("fp8", {}), ("intN", {"bits": 3}), ("qsgd", {}), ("nc", {}), ("onebit", {}),
           ("signsgd", {}), ("topk", {"ratio": 0.1}), ("randomk", {"ratio": 0.1}),
           ("sketch", {"rows": 3, "cols": 64, "k": 8}), ("gradiveq", {"dim": 16, "k": 4}),
           ("thresholdv", {"threshold": 1.0}), ("dct", {"block": 16, "k": 3})]
START, LEN, SENT, SEND_OFF, BODY, RECV_OFF = range(6)


def spans(n: int, world: int):
    per = -(-n // world)
    return [(min(per * c, n), min(per * (c + 1), n) - min(per * c, n)) for c in range(world)]


def headers(send: torch.Tensor, sizes) -> list:
    """(numel, body_bytes) from each payload's header, back to back as encode() wrote them: wire
    version 3's 48-bit sizes (numel: low 32 bits at 16, high 16 at 20; body: high 16 at 22, low
    32 at 24)."""
    raw, out, at = send.numpy().tobytes(), [], 0
    for size in sizes:
        if size:
            lo, hi, bhi, blo = struct.unpack_from("<IHHI", raw, at + 16)
            out.append((lo | hi << 32, blo | bhi << 32))
        else:
            out.append(None)
        at += size
    return out


@pytest.mark.parametrize("method,cfg", CONFIGS, ids=[m for m, _ in CONFIGS])
@pytest.mark.parametrize("own", [False, True], ids=["skip-own", "own"])
def test_geometry_is_the_cpu_plan(method, cfg, own, gen):
    varsize = fsdpcomp.method_info(method)["varsize"]
    for dt, dtype in DTYPES.items():
        for world in WORLDS:
            for n in SIZES:
                # min_numel: units below it go as `none` on both sides
                st = fsdpcomp.CommState(method, dict(cfg, compress_own_chunk=own, min_numel=300))
                grad = (torch.randn(n, generator=gen) * 2).to(dtype)
                for rank in range(world):
                    rows = st._core._cuda_geometry(n, dt, world, rank)
                    send_splits, recv_splits = st._core.plan(grad, world, rank)
                    assert len(rows) == world
                    sizes = None
                    if n and not st._core.fetch_kmax(n, world):  # encode once per (n, world, rank)
                        u = st._core.begin(n)
                        send = torch.zeros(sum(send_splits), dtype=torch.uint8)
                        sizes = st._core.encode(grad, send, world, rank, u)
                        st.end_step()
                        st = fsdpcomp.CommState(method, dict(cfg, compress_own_chunk=own, min_numel=300))
                    where = f"{method} n={n} world={world} rank={rank} dtype={dtype} own={own}"
                    off = 0
                    for c, (row, (start, length)) in enumerate(zip(rows, spans(n, world))):
                        assert (row[START], row[LEN]) == (start, length), where
                        assert row[SENT] == (send_splits[c] > 0), where
                        if row[SENT]:
                            assert row[SEND_OFF] == off, f"{where}: chunk {c} offset"
                            # the plan's payload is header + body, padded to 16
                            assert -(-(32 + row[BODY]) // 16) * 16 == send_splits[c], where
                            if sizes is not None:
                                numel, body = headers(send, sizes)[c]
                                assert numel == length, where
                                assert body <= row[BODY] if varsize else body == row[BODY], where
                        else:
                            assert row[SEND_OFF] == -1 and row[BODY] == -1, where
                        off += send_splits[c]
                        recv_at = sum(recv_splits[:c])
                        if recv_splits[c] == 0 and c == rank:
                            assert row[RECV_OFF] == (-1 if not own else recv_at), where
                        elif recv_splits[c] > 0:
                            assert row[RECV_OFF] == recv_at, f"{where}: slot of rank {c}"
