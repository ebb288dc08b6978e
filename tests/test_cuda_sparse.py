"""The sparse, aggregate and stateful methods on CUDA (signsgd, topk, randomk, thresholdv, sketch,
gradiveq) against the CPU reference: payload bytes and residuals (tests/cuda_cases.py's checks),
and what is special to them: compressed-domain decodes of W payloads, data-dependent sizes, the
second round, gradiveq's unit state and its sync across ranks.

Runs on a GPU (tests/gpu/run.sh), or here without one under the host emulation of the CUDA
library (tests/test_cuda_sparse_emulated.py runs this file with FSDPCOMP_TEST_EMULATED=1: the real
_C drives tests/cuda_emu's library, CPU tensors standing for CUDA ones, at smaller sizes)."""
from __future__ import annotations

import os

import pytest
import torch

import fsdpcomp
from cuda_cases import check_decode, check_encode, cpu_encode, cuda_cases, make_grad, same_bits
from fsdpcomp import _C

EMULATED = os.environ.get("FSDPCOMP_TEST_EMULATED") == "1"
if not EMULATED:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: runs on a GPU machine (tests/gpu/run.sh), or emulated "
                    "(tests/test_cuda_sparse_emulated.py)", allow_module_level=True)
    if not _C.cuda_info()["available"]:
        pytest.skip("CUDA library not usable: " + str(_C.cuda_info()["error"]), allow_module_level=True)

DEV = "cpu" if EMULATED else "cuda"
SPARSE = ("signsgd", "topk", "randomk", "thresholdv", "sketch", "gradiveq")
# geometries and options the kernels treat apart, beyond tests/method_cases.py's
EXTRA = [
    ("signsgd", {"block_size": 8}), ("signsgd", {"block_size": 1024}),
    ("signsgd", {"mode": "majority", "scale": 3.0}),
]
SIZES = [1, 255, 257, 2053] if EMULATED else [1, 255, 257, (1 << 20) + 3]


def new_state(method: str, cfg: dict) -> fsdpcomp.CommState:
    """A State whose tensors go through the CUDA library (emulated: CPU tensors do)."""
    st = fsdpcomp.CommState(method, dict(cfg, pipeline=False))
    if EMULATED:
        st._core._emulate_cuda(True)
    return st


class OnDevice:
    """The backend of tests/cuda_cases.py's checks: State._core through the CUDA library."""

    def state(self, method: str, cfg: dict):
        return new_state(method, cfg)

    def encode(self, st, grad: torch.Tensor, world: int, rank: int) -> torch.Tensor:
        g = grad.to(DEV)
        self.unit = st._core.begin(g.numel())
        s, _ = st._core.plan(g, world, rank)
        send = torch.full((sum(s),), 0xA5, dtype=torch.uint8, device=DEV)  # unwritten bytes show
        sizes = st._core.encode(g, send, world, rank, self.unit)
        return send[:sum(sizes)].cpu()

    def residual(self, st):
        r = st._core.residuals()[self.unit]
        return None if r is None else r.cpu()

    def end_step(self, st) -> None:
        st.end_step()

    def decode(self, method: str, cfg: dict, recv: torch.Tensor, grad: torch.Tensor, out_numel: int,
               world: int, rank: int):
        st = new_state(method, cfg)
        out = torch.full((out_numel,), 7.0, dtype=grad.dtype, device=DEV)
        st._core.decode(recv.to(DEV), grad.to(DEV), out, world, rank, st._core.begin(grad.numel()))
        return out.cpu(), st.counters()["nonfinite_out"]


BACKEND = OnDevice()


def cases() -> list[tuple[str, dict]]:
    have = {m for m, _ in cuda_cases()}
    return [c for c in cuda_cases() if c[0] in SPARSE] + [c for c in EXTRA if c[0] in have]


CASES = cases()
IDS = [m + "".join(f"-{k}={v}" for k, v in c.items()) for m, c in CASES]


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("world,rank", [(1, 0), (3, 1), (4, 3)])
def test_encode_bytes_and_residuals_match_cpu(method, cfg, dtype, world, rank, gen):
    for res in ("fp32", "bf16"):
        for n in SIZES:
            check_encode(BACKEND, method, cfg, dtype, world, rank, max(n, world), gen, residual_dtype=res)


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
@pytest.mark.parametrize("mode", ["pass", "zero"])
def test_encode_of_nonfinite_inputs_matches_cpu(method, cfg, mode, gen):
    for world, rank in ((1, 0), (3, 2)):
        for n in SIZES[1:]:
            check_encode(BACKEND, method, cfg, torch.float32, world, rank, n, gen, nonfinite=mode)


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_decode_of_w_payloads_matches_cpu(method, cfg, dtype, gen):
    """W payloads encoded by the CPU, summed (in the compressed domain where the method does)
    with the own chunk by the device: the CPU's decode of the same buffer, bit for bit."""
    n = 4099 if EMULATED else 65536 * 3 + 5
    check_decode(BACKEND, method, cfg, dtype, 4, 2, n, gen)
    check_decode(BACKEND, method, cfg, dtype, 3, 0, 1031, gen, nonfinite=True, compress_own=True)
    check_decode(BACKEND, method, cfg, dtype, 1, 0, 9, gen, compress_own=True)
    check_decode(BACKEND, method, cfg, dtype, 5, 4, 12, gen)  # chunks of 3, the last one empty


def test_many_calls_on_one_state_without_reading_counters(gen):
    """More calls than the context has timing events (64), counters read once at the end."""
    st = new_state("signsgd", {"compress_own_chunk": True, "error_feedback": True})
    g = make_grad(1000, torch.float32, gen).to(DEV)
    s, _ = st._core.plan(g, 1, 0)
    send = torch.empty(sum(s), dtype=torch.uint8, device=DEV)
    out = torch.empty(1000, device=DEV)
    for _ in range(70):
        u = st._core.begin(1000)
        st._core.encode(g, send, 1, 0, u)
        st._core.decode(send, g, out, 1, 0, u)
        st.end_step()
    c = st.counters()
    assert c["calls"] == 70 and c["residual_norm"] > 0


# ---- exchanges by hand: W States standing in for W ranks, the collectives done here

def exchange(states, grads, world, on_device):
    """One reduce-scatter of a unit over `world` ranks without a process group: every rank
    encodes, each receiver gets the payloads meant for it back to back (sizes as encode()
    returns them), decodes, and a unit state due for a sync is summed over the ranks (rank order)
    and handed back. Returns the outputs (CPU tensors) and the summed sync vector (or None)."""
    dev = DEV if on_device else "cpu"
    n = grads[0].numel()
    shard = -(-n // world)
    sends, sizes, units = [], [], []
    for r, (st, g) in enumerate(zip(states, grads)):
        g = g.to(dev)
        u = st._core.begin(n)
        s, _ = st._core.plan(g, world, r)
        send = torch.zeros(sum(s), dtype=torch.uint8, device=dev)
        sizes.append(st._core.encode(g, send, world, r, u))
        sends.append(send)
        units.append(u)
    outs = []
    for r, (st, g) in enumerate(zip(states, grads)):
        parts = []
        for q in range(world):
            off = sum(sizes[q][:r])
            parts.append(sends[q][off:off + sizes[q][r]])
        recv = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8, device=dev)
        out = torch.zeros(shard, dtype=g.dtype, device=dev)
        st._core.decode(recv, g.to(dev), out, world, r, units[r])
        outs.append(out.cpu())
    vecs = [st._core.sync_vector(u) for st, u in zip(states, units)]
    summed = None
    if vecs[0] is not None:
        summed = torch.zeros(len(vecs[0]) // 4)
        for v in vecs:
            summed += torch.frombuffer(bytearray(v), dtype=torch.float32)
        for st, u in zip(states, units):
            st._core.sync_apply(u, summed.clone())
    for st in states:
        st.end_step()
    return outs, summed


@pytest.mark.parametrize("cfg", [{"dim": 16, "k": 4, "warmup": 2, "refresh": 3}, {"dim": 32, "k": 8, "warmup": 1}])
@pytest.mark.parametrize("world", [2, 3])
def test_gradiveq_basis_sync_across_ranks_matches_cpu(cfg, world, gen):
    """W device States as W ranks: the covariance each sums on the device on learn steps comes to
    the host bit for bit as the CPU's (the same order of additions), the ranks' sum gives every
    rank the same new basis as the CPU's, and the next steps' payloads and outputs agree."""
    full = dict(cfg, seed=11, error_feedback=True)
    cpus = [fsdpcomp.CommState("gradiveq", full) for _ in range(world)]
    devs = [new_state("gradiveq", full) for _ in range(world)]
    n = 2 * 1031
    for step in range(4):
        grads = [make_grad(n, torch.float32, gen) for _ in range(world)]
        out_c, sum_c = exchange(cpus, grads, world, False)
        out_d, sum_d = exchange(devs, grads, world, True)
        assert (sum_c is None) == (sum_d is None), f"step {step}: a sync on one side only"
        if sum_c is not None:
            assert torch.equal(sum_c, sum_d), f"step {step}: summed covariances differ"
        for r in range(world):
            assert same_bits(out_c[r], out_d[r]), f"step {step} rank {r}: outputs differ"
            bc, bd = cpus[r]._core.unit_states()[0], devs[r]._core.unit_states()[0]
            assert bc == bd, f"step {step} rank {r}: bases differ"
        assert devs[0]._core.unit_states()[0] == devs[-1]._core.unit_states()[0]


def test_gradiveq_resumes_from_a_checkpoint_on_the_device(gen):
    """A learned basis saved from a device State and loaded into a fresh one: the device copy
    follows the restored host state, so the resumed encode writes the uninterrupted bytes (and
    the CPU's, restored from the same checkpoint)."""
    full = {"dim": 16, "k": 4, "warmup": 1, "seed": 5, "error_feedback": True, "compress_own_chunk": True,
            "pipeline": False}
    n = 999
    a = [new_state("gradiveq", full)]
    exchange(a, [make_grad(n, torch.float32, gen)], 1, True)  # step 0 learns: a new basis
    sd = a[0].state_dict()
    b = new_state("gradiveq", full)
    b.load_state_dict(sd)
    cpu = fsdpcomp.CommState("gradiveq", full)
    cpu.load_state_dict(sd)
    g = make_grad(n, torch.float32, gen)
    want = cpu_encode(cpu, g, 1, 0, cpu._core.begin(n))
    assert torch.equal(BACKEND.encode(a[0], g, 1, 0), want)
    assert torch.equal(BACKEND.encode(b, g, 1, 0), want)


def encode_both(method: str, cfg: dict, g: torch.Tensor, world: int, rank: int, steps: int = 2):
    """`steps` encodes of g on the CPU and on the device (error feedback): bytes and residuals."""
    full = dict(cfg, seed=3, error_feedback=True, compress_own_chunk=world == 1, pipeline=False)
    cpu, dev = fsdpcomp.CommState(method, full), new_state(method, full)
    for step in range(steps):
        a = cpu_encode(cpu, g, world, rank, cpu._core.begin(g.numel()))
        b = BACKEND.encode(dev, g, world, rank)
        assert torch.equal(a, b), f"{method} {cfg} W={world} step {step}: payload bytes differ at " \
                                  f"{(a != b).nonzero().flatten()[:8].tolist() if a.shape == b.shape else 'sizes'}"
        assert same_bits(cpu._core.residuals()[0], BACKEND.residual(dev)), f"{method} {cfg}: residuals differ"
        cpu.end_step()
        dev.end_step()


@pytest.mark.parametrize("k", [1, 7, 300, 999, 1000, 5000])
def test_topk_ties_go_to_the_lowest_indices(k, gen):
    """Magnitudes from a few values (and zeros): the k-th largest is tied many times over, and
    the kept ties must be the lowest indices, as fc_select.c keeps them."""
    g = torch.randint(-3, 4, (3001,), generator=gen).float() * 0.25
    g[::7] = 0.0
    g[5] = -0.0
    for world, rank in ((1, 0), (3, 1)):
        encode_both("topk", {"k": k}, g, world, rank)
    encode_both("topk", {"k": k}, torch.zeros(3001), 2, 0)  # every magnitude tied


@pytest.mark.parametrize("n,k", [(70001, 50), (70001, 9000), (1000, 40), (1000, 200), (4096, 256), (4096, 257)])
def test_topk_index_formats(n, k, gen):
    """32-bit indices (n > 65536), 16-bit and the bitmap, and the switch between them."""
    encode_both("topk", {"k": k, "quantize": "fp16"}, make_grad(n, torch.float32, gen), 1, 0)
