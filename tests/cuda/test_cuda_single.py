"""State.compress/decompress (the compressed all-gather's single-payload codec, fsdpcomp/_shard_gather.py)
of the sparse, aggregate and stateful methods through the CUDA library: the CPU's payload bytes
and the CPU's acc += alpha * D(payload), bit for bit, at odd sizes, with NaN/Inf in the input, for
gradiveq's unit states (a unit the collective runs, a loose one, a learn step), and a corrupted
header refused as on the CPU. On a GPU machine (tests/gpu/run.sh) it runs on the device;
tests/cuda/test_cuda_files_emulated.py runs it on the host emulation of cuda/ (FSDPCOMP_TEST_EMULATED=1:
CPU tensors take the CUDA path)."""
from __future__ import annotations

import pytest
import torch

import fsdpcomp
from helpers.cuda_cases import bits_report, make_grad, same_bits
from helpers.cuda_device import DEV, EMULATED, on_device, skip_without_device

skip_without_device()

SIZES = [1, 255, 257, 3001] if EMULATED else [1, 255, 257, 3001, (1 << 20) + 3]

# each method's main variants: signsgd's modes, the sparsifiers' value codecs (hybrids), both
# thresholdv value modes, sketch with and without the second round, gradiveq's shapes, dct's blocks
CASES = [
    ("signsgd", {}), ("signsgd", {"block_size": 8}), ("signsgd", {"mode": "majority", "scale": 3.0}),
    ("topk", {"ratio": 0.1}), ("topk", {"k": 7}), ("topk", {"ratio": 0.6}),  # 0.6: a bitmap
    ("topk", {"ratio": 0.1, "quantize": "fp16"}), ("topk", {"ratio": 0.2, "quantize": "int8"}),
    ("topk", {"ratio": 0.2, "quantize": "qsgd"}), ("topk", {"ratio": 0.2, "quantize": "nc"}),
    ("topk", {"ratio": 0.2, "quantize": "intN"}),
    ("randomk", {"ratio": 0.1}), ("randomk", {"k": 5, "scale": False}),
    ("randomk", {"ratio": 0.2, "quantize": "int8"}), ("randomk", {"ratio": 0.2, "quantize": "qsgd"}),
    ("randomk", {"ratio": 0.2, "quantize": "fp16"}),
    ("thresholdv", {"threshold": 2.0}), ("thresholdv", {"threshold": 0.01}),  # 0.01: most kept
    ("thresholdv", {"threshold": 2.0, "quantize": "int8"}), ("thresholdv", {"threshold": 1.0, "values": "sign"}),
    ("sketch", {"rows": 3, "cols": 64, "k": 8}), ("sketch", {"rows": 4, "cols": 32, "k": 0}),
    ("sketch", {"rows": 3, "cols": 64, "k": 8, "second_round": True}),
    ("gradiveq", {}), ("gradiveq", {"dim": 16, "k": 3}),
    ("dct", {}), ("dct", {"block": 16, "k": 3, "quantize": "int8"}), ("dct", {"block": 256, "k": 4, "quantize": "none"}),
]
IDS = [m + "".join(f"-{k}={v}" for k, v in c.items()) for m, c in CASES]


def states(method: str, cfg: dict):
    """The CPU reference and a State whose tensors go through the CUDA library, one config."""
    c = dict(cfg, seed=99)
    return fsdpcomp.CommState(method, c), on_device(method, c)


def check_single(cpu, dev, x: torch.Tensor, gen, unit: int = 3, chunk: int = 5, world: int = 3,
                 rank: int = 1, what: str = "") -> None:
    """compress() on both: the same bytes; decompress() of them into the same acc at two alphas:
    the same bits."""
    n = x.numel()
    size = cpu._core.payload_bytes(n)
    pa = torch.zeros(size, dtype=torch.uint8)
    pb = torch.full((size,), 0xA5, dtype=torch.uint8, device=DEV)  # unwritten bytes show
    wa = cpu._core.compress(x, pa, unit=unit, chunk=chunk, world=world, rank=rank)
    wb = dev._core.compress(x.to(DEV, copy=True), pb, unit=unit, chunk=chunk, world=world, rank=rank)
    assert wa == wb, f"{what} n={n}: payload sizes {wa} (CPU) and {wb}"
    diff = (pa[:wa] != pb[:wb].cpu()).nonzero().flatten()[:8].tolist()
    assert not diff, f"{what} n={n}: payload bytes differ at {diff}"
    for alpha in (1.0, -0.5):
        acc = make_grad(n, torch.float32, gen)
        acc_d = acc.to(DEV, copy=True)
        cpu._core.decompress(pa[:wa], acc, alpha=alpha, unit=unit, chunk=chunk, world=world)
        dev._core.decompress(pb[:wb], acc_d, alpha=alpha, unit=unit, chunk=chunk, world=world)
        assert same_bits(acc, acc_d.cpu()), \
            f"{what} n={n} alpha={alpha}: decompressed sums (cpu/device bits) {bits_report(acc, acc_d.cpu())}"
    # a payload buffer longer than the payload (the all-gather's slot): the same sum
    acc = torch.zeros(n)
    acc_d = acc.to(DEV, copy=True)
    cpu._core.decompress(pa, acc, unit=unit, chunk=chunk, world=world)
    dev._core.decompress(pb, acc_d, unit=unit, chunk=chunk, world=world)
    assert same_bits(acc, acc_d.cpu()), \
        f"{what} n={n}: decompress of the whole buffer (cpu/device bits) {bits_report(acc, acc_d.cpu())}"


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
def test_single_payloads_match_cpu(method, cfg, gen):
    cpu, dev = states(method, cfg)
    for n in SIZES:
        check_single(cpu, dev, make_grad(n, torch.float32, gen), gen, what=f"{method} {cfg}")
    # another chunk id, rank and world: the RNG streams and the header follow them
    check_single(cpu, dev, make_grad(1031, torch.float32, gen), gen, unit=0, chunk=9, world=5, rank=4,
                 what=f"{method} {cfg}")


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
def test_single_payloads_of_nonfinite_inputs_match_cpu(method, cfg, gen):
    """NaN/Inf of x go on the wire as the CPU sends them (canonical NaN, the header flagged)."""
    cpu, dev = states(method, cfg)
    check_single(cpu, dev, make_grad(1031, torch.float32, gen, nonfinite=True), gen, what=f"{method} {cfg}")


@pytest.mark.parametrize("method,cfg", [c for c in CASES if c[0] in ("gradiveq", "sketch", "randomk")][:4])
def test_single_payloads_after_steps_match_cpu(method, cfg, gen):
    """Later steps (the header's and the RNG's step; gradiveq: past its learn steps)."""
    cpu, dev = states(method, cfg)
    for _ in range(3):
        cpu.end_step()
        dev.end_step()
    check_single(cpu, dev, make_grad(777, torch.float32, gen), gen, what=f"{method} {cfg} step 3")


def test_gradiveq_single_payloads_use_the_collectives_unit_state(gen):
    """compress() of a unit the collective has run reads that unit's basis (learned on the device,
    synced by the host), as the CPU's reads the unit's; a unit it has not run, a loose basis."""
    cfg = {"dim": 16, "k": 3, "warmup": 1, "refresh": 0}
    cpu, dev = states("gradiveq", cfg)
    g = make_grad(4000, torch.float32, gen)
    for st, t in ((cpu, g), (dev, g.to(DEV, copy=True))):
        u = st._core.begin(t.numel())
        send_splits, _ = st._core.plan(t, 1, 0)
        st._core.encode(t, torch.zeros(sum(send_splits), dtype=torch.uint8, device=t.device), 1, 0, u)
        # one rank: its covariance is the sum; the basis of unit 0 becomes the one learned
        v = st._core.sync_vector(u)
        assert v is not None
        st._core.sync_apply(u, torch.frombuffer(bytearray(v), dtype=torch.float32))
        st.end_step()
    for unit in (0, 7):
        check_single(cpu, dev, make_grad(500, torch.float32, gen), gen, unit=unit, what=f"gradiveq unit {unit}")


@pytest.mark.parametrize("method,cfg", [CASES[0], CASES[2], CASES[3], CASES[11], CASES[16], CASES[19],
                                        CASES[20], CASES[23]],
                         ids=[IDS[i] for i in (0, 2, 3, 11, 16, 19, 20, 23)])
@pytest.mark.parametrize("field", ["magic", "unit", "numel"])
def test_corrupted_header_is_refused_as_on_the_cpu(method, cfg, field, gen):
    """A header the CPU refuses (PayloadError, acc untouched): on the device acc becomes NaN (never
    a silent sum) and the next counters() raises the PayloadError."""
    cpu, dev = states(method, cfg)
    n = 300
    x = make_grad(n, torch.float32, gen)
    pa = torch.zeros(cpu._core.payload_bytes(n), dtype=torch.uint8)
    w = cpu._core.compress(x, pa, unit=3, chunk=5, world=3, rank=1)
    bad = pa[:w].clone()
    at = {"magic": 0, "unit": 8, "numel": 16}[field]  # fc_header's fields (csrc/common/fc_wire.h)
    bad[at] ^= 0x5A
    acc = make_grad(n, torch.float32, gen)
    before = acc.clone()
    with pytest.raises(fsdpcomp.PayloadError):
        cpu._core.decompress(bad, acc, unit=3, chunk=5, world=3)
    assert same_bits(acc, before), "the CPU leaves acc as it was"
    acc_d = before.to(DEV, copy=True)
    dev._core.decompress(bad.to(DEV, copy=True), acc_d, unit=3, chunk=5, world=3)
    assert torch.isnan(acc_d.cpu()).all(), f"{method}: a refused payload poisons every element"
    with pytest.raises(fsdpcomp.PayloadError):
        dev.counters()


# compress(residual=e), the all-gather half of an all-reduce: dense codecs and the sparse ones
RESIDUAL_CASES = [("fp16", {}), ("int8", {}), ("intN", {"bits": 4}), ("fp8", {}), ("qsgd", {}), ("onebit", {}),
                  ("nc", {}), CASES[0], CASES[3], CASES[11], CASES[16], CASES[23], CASES[25]]


@pytest.mark.parametrize("mode", ["pass", "zero"])
@pytest.mark.parametrize("method,cfg", RESIDUAL_CASES, ids=lambda v: str(v))
def test_single_payloads_with_a_residual_match_cpu(method, cfg, mode, gen):
    """g' = x + e by the collective's range and NaN rules, its payload, and e replaced by
    g' - D(payload): the CPU's bytes and residual bits, over steps near fp32's largest value
    and one with NaN/Inf; the residual stays finite."""
    cpu, dev = states(method, dict(cfg, nonfinite=mode))
    n = 1031
    ea, eb = torch.zeros(n), torch.zeros(n, device=DEV)
    for step, bad in enumerate((False, True, False)):
        x = make_grad(n, torch.float32, gen, nonfinite=bad, huge=True)
        size = cpu._core.payload_bytes(n)
        pa = torch.zeros(size, dtype=torch.uint8)
        pb = torch.full((size,), 0xA5, dtype=torch.uint8, device=DEV)
        wa = cpu._core.compress(x, pa, unit=2, chunk=4, world=3, rank=1, residual=ea)
        wb = dev._core.compress(x.to(DEV, copy=True), pb, unit=2, chunk=4, world=3, rank=1, residual=eb)
        assert wa == wb, f"{method} step {step}: payload sizes {wa} (CPU) and {wb}"
        diff = (pa[:wa] != pb[:wb].cpu()).nonzero().flatten()[:8].tolist()
        assert not diff, f"{method} step {step}: payload bytes differ at {diff}"
        assert same_bits(ea, eb.cpu()), f"{method} step {step}: residuals differ"
        assert torch.isfinite(ea).all(), f"{method} step {step}: a NaN/Inf in the residual"
    # the sums x + e near fp32's largest value saturate on both, or (thresholdv: the huge values
    # go exactly, e = 0 there) on neither; the CUDA count leaves out the block codecs' own
    # (docs/design.md "The CUDA path")
    assert (cpu.counters()["saturated"] > 0) == (dev.counters()["saturated"] > 0)
    assert (cpu.counters()["saturated"] > 0) == (method != "thresholdv"), cpu.counters()["saturated"]


def test_sketch_single_payload_with_a_residual_is_refused_on_cuda(gen):
    """sketch's single payload is its table alone: no residual kernels, a TypeError (the all-gather
    half then goes uncompressed) and the residual untouched."""
    _, dev = states("sketch", {"rows": 3, "cols": 64, "k": 8})
    x = make_grad(500, torch.float32, gen).to(DEV)
    e = torch.ones(500, device=DEV)
    with pytest.raises(TypeError, match="residual"):
        dev._core.compress(x, torch.zeros(dev._core.payload_bytes(500), dtype=torch.uint8, device=DEV), residual=e)
    assert bool((e == 1).all())
