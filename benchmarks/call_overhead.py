"""The fixed cost of one call on the host: what a warm State spends per encode, decode, compress
and decompress of a tiny gradient (2^10 elements by default: the element work is negligible),
on the CPU path and on the CUDA path with the CUDA library replaced by tests/cuda_emu's host
emulation with its kernels skipped (FC_EMU_SKIP_KERNELS=1: every launch is checked and counted,
none runs), so what is timed there is the host's part of a CUDA call: Python, the C glue, the
driver and the library's own host code. Beside each CUDA row, the runtime calls the call made
(tests/cuda_emu/counts.py): on a GPU each launch, memset or event record adds a few microseconds
of host time that the emulation does not charge, and a host wait stalls the hook path. Also one
CommState.reduce_scatter on a 1-rank gloo group (compress_own_chunk): the Python layer around
the same encode and decode. Times are the process's CPU time (time.process_time: on a shared
machine, time spent descheduled is not counted; one torch thread), the best of --repeat runs of
--number calls; no assertion is made on them: the tests count calls, this prints.

    PYTHONPATH=. python benchmarks/call_overhead.py                    # CPU and emulated CUDA
    PYTHONPATH=. python benchmarks/call_overhead.py --no-emulated --methods int8,none
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import timeit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # beside this file: repo_path
import repo_path  # noqa: E402

repo_path.use_checkout()  # fsdpcomp built in place, else the installed one
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import fsdpcomp  # noqa: E402

EMU = os.path.join(repo_path.REPO, "tests", "cuda_emu")
# the emulated rows: methods whose host path reads nothing back from the device (a skipped kernel
# leaves a data-dependent size unwritten)
EMULATED_OK = ("none", "bf16", "fp8", "int8", "intN", "qsgd", "nc", "onebit", "signsgd")
COUNTED = ("launches", "memsets", "event_records", "event_creates", "host_syncs")


class Calls:
    """A warm pair of States (rank 0 and the peer whose payload rank 0 decodes) of one method."""

    def __init__(self, method: str, n: int, world: int, emulate: bool):
        def core():
            c = fsdpcomp.CommState(method, {"compress_own_chunk": False})._core
            if emulate:
                c._emulate_cuda(True)
            return c

        self.core, peer = core(), core()
        self.n, self.world = n, world
        self.g = torch.randn(n)
        self.unit, pu = self.core.begin(n), peer.begin(n)
        send_splits, _ = self.core.plan(self.g, world, 0)
        self.send = torch.zeros(sum(send_splits), dtype=torch.uint8)
        psend = torch.zeros(sum(peer.plan(self.g, world, 1)[0]), dtype=torch.uint8)
        sizes = peer.encode(self.g, psend, world, 1, pu)
        self.recv = psend[:sizes[0]].clone()
        self.out = torch.zeros(-(-n // world))
        self.payload = torch.zeros(self.core.payload_bytes(n), dtype=torch.uint8)
        self.written = self.core.compress(self.g, self.payload, unit=0, chunk=0, world=world, rank=0)
        self.acc = torch.zeros(n)
        for call in self.calls().values():  # warm: residuals, buffers, events made
            call()
            call()

    def calls(self) -> dict:
        c, g, w, u = self.core, self.g, self.world, self.unit
        return {
            "encode": lambda: c.encode(g, self.send, w, 0, u),
            "decode": lambda: c.decode(self.recv, g, self.out, w, 0, u),
            "compress": lambda: c.compress(g, self.payload, unit=0, chunk=0, world=w, rank=0),
            "decompress": lambda: c.decompress(self.payload[:self.written], self.acc, unit=0, chunk=0, world=w),
        }


def best_us(call, number: int, repeat: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=repeat, timer=time.process_time)) / number * 1e6


def state_rows(methods, n, args, emulate: bool, counts=None) -> list[list[str]]:
    rows = []
    for m in methods:
        try:
            calls = Calls(m, n, 2, emulate).calls()
        except Exception as e:  # noqa: BLE001 - a row that cannot run says why
            rows.append([m, f"n/a: {type(e).__name__}: {str(e)[:60]}"])
            continue
        row = [m]
        for name, call in calls.items():
            row.append(f"{best_us(call, args.number, args.repeat):7.2f}")
            if counts is not None:
                c = counts.of(call)
                row.append("/".join(str(c[k]) for k in COUNTED))
        rows.append(row)
    return rows


def reduce_scatter_us(method: str, n: int, args) -> float:
    """One CommState.reduce_scatter on the 1-rank group this process made (compress_own_chunk:
    the own payload is encoded, looped back and decoded)."""
    st = fsdpcomp.CommState(method, {"compress_own_chunk": True})
    g, out = torch.randn(n), torch.zeros(n)
    for _ in range(3):
        st.reduce_scatter(g, out, key="unit")
    return best_us(lambda: st.reduce_scatter(g, out, key="unit"), args.number, args.repeat)


def table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) if i < len(r) else 0 for r in [head] + rows) for i in range(len(head))]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def emulated_counts():
    """Loads the emulated library as the CUDA part, kernels skipped, and its counters."""
    sys.path.insert(0, EMU)
    import build as emu_build  # noqa: E402
    from counts import Counts  # noqa: E402
    out = os.environ.get("FSDPCOMP_EMU_DIR") or os.path.join("/tmp", f"fsdpcomp_cuda_emu_{os.getuid()}")
    os.makedirs(out, exist_ok=True)
    lib = emu_build.build_shared(out)
    os.environ["FSDPCOMP_CUDA_LIB"] = lib  # read when _C loads the CUDA part: not yet
    os.environ["FC_EMU_SKIP_KERNELS"] = "1"  # read at the first launch
    return Counts(lib)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--numel", type=int, default=1 << 10)
    p.add_argument("--methods", default="none,int8,fp8,signsgd,topk,thresholdv,sketch")
    p.add_argument("--number", type=int, default=2000, help="calls per timed run")
    p.add_argument("--repeat", type=int, default=7, help="timed runs; the best is printed")
    p.add_argument("--no-emulated", action="store_true", help="the CPU rows only")
    args = p.parse_args()
    methods = args.methods.split(",")
    torch.set_num_threads(1)
    print(f"host microseconds per call of a warm State, {args.numel} elements, world 2 (rank 0), "
          f"best of {args.repeat} x {args.number}")
    head = ["method", "encode", "decode", "compress", "decompress"]
    print("\nCPU tensors (fsdpcomp._C's CPU backend):")
    print(table(head, state_rows(methods, args.numel, args, False)))
    store = dist.FileStore(os.path.join("/tmp", f"call_overhead_{os.getpid()}"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        rows = [[m, f"{reduce_scatter_us(m, args.numel, args):7.2f}"] for m in methods]
    finally:
        dist.destroy_process_group()
    print("\nCommState.reduce_scatter, CPU, 1-rank gloo group (encode, loop back, decode):")
    print(table(["method", "us/call"], rows))
    if args.no_emulated:
        return
    counts = emulated_counts()
    emu_methods = [m for m in methods if m in EMULATED_OK] or list(EMULATED_OK[:3])
    print("\nCUDA path, emulated library, kernels skipped (host time only); beside each time the "
          "runtime calls it made: " + "/".join(COUNTED) + ":")
    head = ["method", "encode", "calls", "decode", "calls", "compress", "calls", "decompress", "calls"]
    print(table(head, state_rows(emu_methods, args.numel, args, True, counts)))


if __name__ == "__main__":
    main()
