"""What one warm call of the CUDA path asks of the CUDA runtime, counted by the host emulation
(tests/cuda_emu/cuda_runtime.h's counters, read through tests/cuda_emu/counts.py): per method, the
collective's encode and decode and the single payload's compress and decompress, each driven
through the real State (fsdpcomp._C: the glue, the driver, fc_cuda_path.c, the library). On a
GPU each launch, memset and event record costs the hook a few microseconds of host time, and a
host wait stalls it: the fixed cost per call (issue 37) is these counts. Asserted per call, once
the State is warm (after its first call):

- no host wait in any call of a fixed-size method; thresholdv's encode and compress wait once
  each, by design (the sizes of its data-dependent payloads must reach the host: fc_cuda.h);
- no event created once warm (the context's events are made at its first call);
- no cudaMalloc, ever (device memory comes from torch's allocator through the State);
- the launches and memsets of each method as the tables below have them (today's kernels).

Also, per call: no Python function called and no torch operator run by the C side (no allocation
on a warm call), and one torch function per tensor from outside it (the negative-view check of
the caller's tensors and of a unit's residual).

Runs under the emulation only (tests/cuda/test_cuda_files_emulated.py): the counters are the
emulated runtime's."""
from __future__ import annotations

import os
import sys

import pytest
import torch

import fsdpcomp
from helpers.cuda_cases import cuda_methods
from helpers.cuda_device import EMULATED, on_device, skip_without_device
from helpers.python_work import PythonWork, WarmCalls

skip_without_device()
if not EMULATED:
    pytest.skip("the counts are the emulated runtime's (tests/cuda/test_cuda_files_emulated.py)",
                allow_module_level=True)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cuda_emu"))
from counts import Counts  # noqa: E402

N, WORLD = WarmCalls.N, WarmCalls.WORLD

# Runtime calls per warm call, defaults of each method (error_stats_every 0: no sample), counted
# today: {method: (encode launches, encode memsets, decode launches, decode memsets)}. Issue 37's
# targets beside them: a dense codec's encode at most 2 launches and no memset, its decode 1 launch.
COLLECTIVE = {
    # the one-pass encodes (issue 37 item 1: the count, the codec, the headers by the last block)
    "none": (1, 0, 1, 0),     # the fused decode
    "fp16": (1, 0, 1, 0),     # the fused decode
    "bf16": (1, 0, 1, 0),     # the fused decode
    "int8": (1, 0, 1, 0),     # the fused decode
    "fp8": (1, 0, 1, 0),      # the fused decode
    "intN": (1, 0, 1, 0),     # the fused decode
    "qsgd": (1, 0, 1, 0),     # the fused decode
    "nc": (1, 0, 1, 0),       # the fused decode
    "signsgd": (1, 0, 3, 2),  # decode target (1, 0)
    "onebit": (1, 0, 1, 0),   # the fused decode
    # the others: the driver's count and headers (2 launches, 1 memset) beside their own kernels
    "topk": (10, 2, 10, 2),   # was (20, 3, ...): its own 8 (a radix select in 6, the values' codec, the
                              # residual at the kept), no memset, beside the driver's (issue 37 item 5)
    "randomk": (10, 1, 10, 2),
    "thresholdv": (17, 2, 9, 2),
    "sketch": (6, 1, 12, 2),   # its table in 4 launches, no sort; its decode selects through topk's
    "gradiveq": (4, 1, 4, 2),  # decode: the senders' coefficients summed once, then decoded
    "dct": (6, 1, 4, 2),
    # each span through its rung's single-payload kernels (cuda/fc_cu_parts.cu): the default table
    # is one fp32 span a chunk; test_adaptive_launches_grow_with_the_parts counts a mixed table
    "adaptive": (3, 1, 6, 2),
}
# The same for compress() / decompress(): {method: (launches, memsets, launches, memsets)}.
SINGLE = {
    "none": (1, 0, 1, 0), "fp16": (1, 0, 1, 0), "bf16": (1, 0, 1, 0), "int8": (1, 0, 1, 0),
    "fp8": (1, 0, 1, 0), "intN": (1, 0, 1, 0), "qsgd": (1, 0, 1, 0), "nc": (1, 0, 1, 0),
    "signsgd": (1, 0, 2, 1), "onebit": (1, 0, 1, 0), "topk": (9, 1, 6, 1), "randomk": (10, 1, 8, 1),
    "thresholdv": (11, 1, 5, 1), "sketch": (6, 1, 10, 1), "gradiveq": (4, 1, 2, 1), "dct": (6, 1, 3, 1),
    "adaptive": (3, 1, 3, 1),
}
# The one wait a call may make, by design: {method: (encode, decode, compress, decompress)}.
WAITS = {"thresholdv": (1, 0, 1, 0)}
RECORDS = 2  # event records per timed call: its start and its end
# adaptive's timed calls per call: each span's rung call times itself (the default table: one span
# a chunk), and a sampled encode decodes its one sent chunk again: {call: (defaults, sampled)}
ADAPTIVE_TIMED = {"encode": (1, 2), "decode": (1, 1), "compress": (1, 1), "decompress": (1, 1)}
CALLS = WarmCalls.CALLS


def measured(method: str, cfg: dict, counts: Counts) -> dict[str, dict[str, int]]:
    """Each call's counts on a warm State: every call made once first."""
    calls = WarmCalls(on_device(method, cfg), on_device(method, cfg)).warm()
    return {name: counts.of(call) for name, call in calls.calls.items()}


def table_of(rows: dict[str, dict[str, dict[str, int]]]) -> str:
    """The measured table, for the message of a row that failed: paste it over the constants."""
    out = ["measured {method: (launches, memsets, launches, memsets)}, collective then single:"]
    for pair, name in ((("encode", "decode"), "COLLECTIVE"), (("compress", "decompress"), "SINGLE")):
        cells = ", ".join(f'"{m}": ({r[pair[0]]["launches"]}, {r[pair[0]]["memsets"]}, '
                          f'{r[pair[1]]["launches"]}, {r[pair[1]]["memsets"]})' for m, r in rows.items())
        out.append(f"{name} = {{{cells}}}")
    out.append("all counts: " + repr(rows))
    return "\n".join(out)


@pytest.fixture(scope="module")
def counts():
    return Counts()


@pytest.fixture(scope="module")
def table(counts):
    """Every method's counts with its defaults (no sample), measured once for the module."""
    return {m: measured(m, {"error_stats_every": 0}, counts) for m in cuda_methods()}


def test_every_method_with_kernels_has_a_row():
    assert sorted(COLLECTIVE) == sorted(cuda_methods()) == sorted(SINGLE)


@pytest.mark.parametrize("method", sorted(COLLECTIVE))
def test_launches_and_memsets_per_call(method, table):
    got = table[method]
    want = {"encode": COLLECTIVE[method][:2], "decode": COLLECTIVE[method][2:],
            "compress": SINGLE[method][:2], "decompress": SINGLE[method][2:]}
    have = {c: (got[c]["launches"], got[c]["memsets"]) for c in CALLS}
    assert have == want, f"{method}: launches and memsets per call {have}, the table says {want}\n" + table_of(table)


@pytest.mark.parametrize("method", sorted(COLLECTIVE))
@pytest.mark.parametrize("cfg", [{"error_stats_every": 0}, {"error_feedback": True, "error_stats_every": 1}],
                         ids=["defaults", "error-feedback-sampled"])
def test_no_wait_no_event_made_no_malloc_once_warm(method, cfg, table, counts):
    got = table[method] if cfg == {"error_stats_every": 0} else measured(method, cfg, counts)
    waits = WAITS.get(method, (0, 0, 0, 0))
    for call, wait in zip(CALLS, waits):
        c = got[call]
        assert c["host_syncs"] == wait, f"{method} {call}: {c['host_syncs']} host waits, expected {wait}: {c}"
        assert c["d2h_copies"] == wait, f"{method} {call}: {c['d2h_copies']} device-to-host copies: {c}"
        assert c["event_creates"] == 0, f"{method} {call}: events created on a warm State: {c}"
        records = RECORDS * ADAPTIVE_TIMED[call][cfg != {"error_stats_every": 0}] if method == "adaptive" else RECORDS
        assert c["event_records"] == records, f"{method} {call}: {c['event_records']} event records: {c}"
        assert c["mallocs"] == 0, f"{method} {call}: cudaMalloc called: {c}"


def test_events_are_made_once_at_the_first_call(counts):
    """A fresh State's first call on the device makes the context's events, every one at once; no
    later call makes any, past the first 64 calls too (the old ring made a pair per call until
    then)."""
    st = on_device("int8", {})
    g = torch.randn(N)
    unit = st._core.begin(N)
    send = torch.zeros(sum(st._core.plan(g, WORLD, 0)[0]), dtype=torch.uint8)
    first = counts.of(lambda: st._core.encode(g, send, WORLD, 0, unit))
    assert first["event_creates"] >= 2 * 64, first
    calls = WarmCalls(on_device("int8", {}), on_device("int8", {}))
    later = [counts.of(calls.calls[c]) for _ in range(40) for c in CALLS]
    assert sum(c["event_creates"] for c in later) == 0, later[:4]


@pytest.mark.parametrize("method", sorted(COLLECTIVE))
def test_no_python_work_in_a_warm_call(method):
    """The C side calls no Python function and runs no torch operator on a warm call (no
    allocation: the workspace, buffers and events were made by the first); it asks torch only
    whether each tensor from outside is a negative-bit view (DLPack cannot carry the flag): the
    caller's, and a residual (it may come from a checkpoint); never its own workspace's."""
    cfg = {"error_stats_every": 0}
    calls = WarmCalls(on_device(method, cfg), on_device(method, cfg)).warm()
    tensors = calls.outside_tensors()
    for name, call in calls.calls.items():
        work = PythonWork.of(call)
        assert work.python_calls == {}, f"{method} {name}: Python functions called: {work.python_calls}"
        assert work.torch_ops == {}, f"{method} {name}: torch operators run: {work.torch_ops}"
        assert work.torch_functions == {"is_neg": tensors[name]}, \
            f"{method} {name}: torch functions {work.torch_functions}"


def _spans(ends, rungs, start, n):
    """The (rung, length) of each span of the table over [start, start + n)."""
    out, lo = [], 0
    for end, rung in zip(ends, rungs):
        a, b = max(lo, start), min(end, start + n)
        if a < b:
            out.append((rung, b - a))
        lo = end
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_adaptive_launches_grow_with_the_parts(world, counts):
    """adaptive runs each span through its rung's single-payload kernels (cuda/fc_cu_parts.cu), so
    a call's launches grow with the spans it has (P spans over S senders' chunks): an encode is
    1 count + each span's rung compress() + 1 header per sent chunk (memsets: 1 + one per
    alignment gap + the rungs'), a decode 1 check + 2 for the own chunk + each sender's span
    staged (1) and decoded by its rung + 1 output pass (memsets: 2 + the rungs'), compress() 2 +
    its spans' rungs, decompress() 1 + its spans staged and decoded; every span's rung call times
    itself (2 event records each). Counted here for a mixed table: the rows of SINGLE are the
    rungs'. One fused dispatch kernel (the rung chosen per span inside the dense codecs' one-pass
    encode and fused decode) would make it the dense methods' one launch a call."""
    ladder = fsdpcomp._C.adaptive_ladder()
    ends, rungs = [1000, 1500, 1777, 2100, 3001, N], [0, 8, 3, 1, 6, 2]
    cfg = {"error_stats_every": 0}
    st, peer = on_device("adaptive", cfg), on_device("adaptive", cfg)
    g = torch.randn(N, generator=torch.Generator().manual_seed(5))
    for s in (st, peer):
        u = s._core.begin(N)
        s._core.set_parts(u, torch.tensor(ends), torch.tensor(rungs, dtype=torch.uint8))
    core = st._core
    per = -(-N // world)
    chunks = [_spans(ends, rungs, c * per, min(per, N - c * per)) for c in range(world)]

    def method(rung):
        return ladder[rung]["method"]

    def body(rung, n):
        lay = fsdpcomp.CommState(method(rung), dict(ladder[rung]["config"]))._core.layout(n)
        return lay["value_bytes"] + lay["meta_bytes"] + lay["index_bytes"]

    def gaps(spans):
        k, off = 0, 0
        for rung, n in spans:
            k += off % 8 != 0
            off = (off + 7) // 8 * 8 + body(rung, n)
        return k

    def enc(spans):  # (launches, memsets) of the spans' rung compress() calls
        return (sum(SINGLE[method(r)][0] for r, _ in spans), sum(SINGLE[method(r)][1] for r, _ in spans))

    def dec(spans):  # the same of their staging and rung decompress() calls
        return (sum(1 + SINGLE[method(r)][2] for r, _ in spans), sum(SINGLE[method(r)][3] for r, _ in spans))

    sent = chunks[1:]  # rank 0 keeps its own chunk exact
    want = {
        "encode": (1 + sum(enc(c)[0] for c in sent) + len(sent), 1 + sum(gaps(c) + enc(c)[1] for c in sent)),
        "decode": (1 + 2 + (world - 1) * dec(chunks[0])[0] + 1, 2 + (world - 1) * dec(chunks[0])[1]),
        "compress": (2 + enc(chunks[0])[0], 1 + gaps(chunks[0]) + enc(chunks[0])[1]),
        "decompress": (1 + dec(chunks[0])[0], 1 + dec(chunks[0])[1]),
    }
    spans = {"encode": sum(len(c) for c in sent), "decode": (world - 1) * len(chunks[0]),
             "compress": len(chunks[0]), "decompress": len(chunks[0])}
    send = torch.zeros(sum(core.plan(g, world, 0, 0)[0]), dtype=torch.uint8)
    psend = torch.zeros(sum(peer._core.plan(g, world, 1, 0)[0]), dtype=torch.uint8)
    sizes = peer._core.encode(g, psend, world, 1, 0)
    recv = torch.zeros(sum(core.plan(g, world, 0, 0)[1]), dtype=torch.uint8)
    recv[:sizes[0]] = psend[:sizes[0]]  # rank 1's payload of chunk 0 (the other senders' alike)
    for r in range(2, world):
        recv[r * sizes[0] - sizes[0]:r * sizes[0]] = psend[:sizes[0]]
    x = g[:per].clone()
    payload = torch.zeros(core.payload_bytes(per) + 64, dtype=torch.uint8)
    written = core.compress(x, payload, unit=0, chunk=0, world=world, rank=0)
    one = payload[:written].clone()
    calls = {
        "encode": lambda: core.encode(g, send, world, 0, 0),
        "decode": lambda: core.decode(recv, g, torch.zeros(per), world, 0, 0),
        "compress": lambda: core.compress(x, payload, unit=0, chunk=0, world=world, rank=0),
        "decompress": lambda: core.decompress(one, torch.zeros(per), unit=0, chunk=0, world=world),
    }
    for call in calls.values():
        call()  # warm
    for name, call in calls.items():
        c = counts.of(call)
        assert (c["launches"], c["memsets"]) == want[name], f"W={world} {name}: {c}, the formula says {want[name]}"
        assert c["event_records"] == RECORDS * spans[name], f"W={world} {name}: {c}"
        assert c["host_syncs"] == 0 and c["mallocs"] == 0, f"W={world} {name}: {c}"
    st.counters()  # every payload accepted
