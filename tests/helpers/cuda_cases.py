"""What the CUDA tests check, written once for two backends: the GPU (tests/cuda/test_cuda.py) and the
host emulation of the CUDA library (tests/cuda/test_cuda_emulated.py). A backend encodes and decodes
like State._core on its device; the CPU path is the reference: payload bytes, residuals (fp32
and bf16) and decoded outputs must equal it bit for bit, NaNs included (one canonical NaN per
format, docs/methods.md "Range and NaN"), and the counters that follow from them."""
from __future__ import annotations

import fsdpcomp
import torch
from helpers.method_cases import CASES

DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

# Block sizes that take the kernels' other paths (fc_cu_tile.cuh): blocks of 8 lanes' worth
# and below, one tile, several tiles per block (values reloaded in the second pass).
EXTRA = [
    ("int8", {"block_size": 4096, "stochastic": True}), ("fp8", {"block_size": 8}),
    ("intN", {"bits": 2, "scheme": "minmax", "block_size": 1024}),
    ("intN", {"bits": 4, "block_size": 8, "stochastic": True}),
    ("qsgd", {"levels": 1000, "bucket_size": 8}), ("qsgd", {"levels": 3, "bucket_size": 2048}),
    ("nc", {"block_size": 1024}), ("onebit", {"block_size": 8}), ("onebit", {"block_size": 1024}),
]


# Methods whose CUDA calls need the State's host side beyond a dense method's arguments (device
# scratch, a unit state, a second round, data-dependent sizes): tests/cuda/test_cuda_emulated.py's
# executable leaves them to tests/cuda/test_cuda_sparse.py, which the real _C drives (on a GPU, or
# under the emulation built as a library: tests/cuda/test_cuda_files_emulated.py).
NEEDS_HOST = frozenset({"topk", "randomk", "thresholdv", "sketch", "gradiveq", "dct", "adaptive"})
# Methods whose sizes follow a unit's parts table (plan() takes the unit): their own file,
# tests/cuda/test_cuda_adaptive.py, sets the tables; the shared checks here plan without one.
OWN_FILE = frozenset({"adaptive"})


def cuda_methods() -> list[str]:
    return [m for m in fsdpcomp.codecs() if fsdpcomp.method_info(m)["cuda"]]


def cuda_cases(methods: list[str] | None = None) -> list[tuple[str, dict]]:
    """method_cases' configs of every method with CUDA kernels (`methods`: these instead), each
    method's defaults, and EXTRA: the block geometries the kernels treat apart."""
    ms = set(cuda_methods() if methods is None else methods) - OWN_FILE
    out = [c for c in CASES if c[0] in ms]
    out += [(m, {}) for m in sorted(ms) if (m, {}) not in out]
    return out + [c for c in EXTRA if c[0] in ms]


# NaN/Inf placed so that blocks hold several, two NaN terms share a lane of the CPU's 8-lane sums
# (elements 0, 8 and 16), and NaNs differ in payload and sign: every one must leave as the
# canonical NaN (tests/core/test_nonfinite_rule.py).
NONFINITE = [(0, 0x7FC00001), (8, 0xFFC0ABCD), (3, 0x7F800000), (11, 0xFF800000), (16, 0x7FA00003),
             (-1, 0xFF800000), (0.5, 0x7FD00000), (0.5001, 0x7F800000)]


def make_grad(n: int, dtype: torch.dtype, gen: torch.Generator, nonfinite: bool = False,
              scale: float = 3.0, huge: bool = False) -> torch.Tensor:
    """Fresh random data times `scale` (never zeros); with `nonfinite`, NONFINITE's values at its
    places (an int: that index, negative from the end; a float: that fraction of n); with `huge`,
    every third element between 0.6 and 1 times the dtype's largest value, either sign (sums
    with a residual, W decodes and casts then go beyond the formats: saturation)."""
    g = torch.randn(n, generator=gen) * scale
    if huge:
        big = torch.finfo(dtype).max * (0.6 + 0.4 * torch.rand(n, generator=gen))
        sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
        g = torch.where(torch.arange(n) % 3 == 0, (big * sign).float(), g)
    if nonfinite:
        bits = g.view(torch.int32)
        for at, pattern in NONFINITE:
            i = int(at * n) if isinstance(at, float) else at % n if at < 0 else at
            if i < n:
                bits[i] = pattern - (1 << 32) if pattern >= 1 << 31 else pattern
    return g.to(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns (NaNs included: every path writes the canonical one)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    view = {4: torch.int32, 2: torch.int16, 1: torch.uint8}[a.element_size()]  # 1: a packed int8 residual
    return bool(torch.equal(a.view(view), b.view(view)))


def bits_report(a: torch.Tensor, b: torch.Tensor, k: int = 4) -> str:
    """The first k differing elements as index: a's bits / b's bits (hex), for an assertion's
    message: a NaN's bit pattern tells which path wrote it."""
    view = torch.int32 if a.element_size() == 4 else torch.int16
    x, y = a.view(view).flatten(), b.view(view).flatten()
    mask = 0xFFFFFFFF if view is torch.int32 else 0xFFFF
    return ", ".join(f"[{i}] {int(x[i]) & mask:#x}/{int(y[i]) & mask:#x}" for i in differ_at(a, b)[:k])


def differ_at(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    view = {4: torch.int32, 2: torch.int16, 1: torch.uint8}[a.element_size()]
    return (a.view(view) != b.view(view)).nonzero().flatten()[:8].tolist()


def common_cfg(world: int, residual_dtype: str = "fp32", nonfinite: str = "pass", ef: bool = True) -> dict:
    return {"seed": 1234, "error_feedback": ef, "residual_dtype": residual_dtype,
            "compress_own_chunk": world == 1, "nonfinite": nonfinite}


def residual_of(state: fsdpcomp.CommState, unit: int) -> torch.Tensor | None:
    """The unit's error-feedback residual, None where it keeps none (a unit that goes as `none`:
    below min_numel, or no smaller as the method than as `none`)."""
    res = state._core.residuals()
    return res[unit] if unit < len(res) else None


def cpu_encode(state: fsdpcomp.CommState, grad: torch.Tensor, world: int, rank: int, unit: int) -> torch.Tensor:
    """The payloads back to back (data-dependent sizes: as long as they are, not the plan)."""
    s, _ = state._core.plan(grad, world, rank)
    send = torch.zeros(sum(s), dtype=torch.uint8)
    sizes = state._core.encode(grad, send, world, rank, unit)
    return send[:sum(sizes)]


def check_encode(backend, method: str, cfg: dict, dtype: torch.dtype, world: int, rank: int, n: int,
                 gen: torch.Generator, residual_dtype: str = "fp32", nonfinite: str | None = None,
                 steps: int = 2, scale: float = 3.0, huge: bool = False, ef: bool = True) -> None:
    """`steps` encodes of fresh gradients with error feedback (from the second on the residual is
    not zero; `ef` False: without it, the first call sampled): the backend's payload bytes and
    residuals equal the CPU's. `nonfinite`: NaN/Inf in
    the gradient, with that `nonfinite` mode; `scale`: the gradient's magnitude (tiny ones
    overflow 1 / scale: such a block goes as zeros, its values kept in the residual); `huge`: values near
    the dtype's largest (make_grad). `saturated` equals the CPU's for the casts (none, fp16,
    bf16); for the block codecs the backend counts the driver's saturations only (g + e, the
    residuals), at most the CPU's, which also counts the codecs' own."""
    full = dict(cfg, **common_cfg(world, residual_dtype, nonfinite or "pass", ef))
    cpu, dev = fsdpcomp.CommState(method, full), backend.state(method, full)
    for step in range(steps):
        g = make_grad(n, dtype, gen, nonfinite=nonfinite is not None, scale=scale, huge=huge)
        u = cpu._core.begin(n)
        a = cpu_encode(cpu, g, world, rank, u)
        b = backend.encode(dev, g, world, rank)
        where = (f"{method} {cfg} {dtype} W={world} r={rank} n={n} step={step} res={residual_dtype} "
                 f"nonfinite={nonfinite}")
        assert a.shape == b.shape, f"{where}: {b.numel()} payload bytes, the CPU wrote {a.numel()}"
        diff = (a != b).nonzero().flatten()
        assert diff.numel() == 0, f"{where}: payload bytes differ at {diff[:8].tolist()} (of {a.numel()})"
        rc, rd = residual_of(cpu, u), backend.residual(dev)
        assert (rc is None) == (rd is None), f"{where}: residual kept on one side only"
        if rc is not None:
            assert same_bits(rc, rd), f"{where}: residuals differ at {differ_at(rc, rd)}"
        cpu.end_step()
        backend.end_step(dev)
    want, got = cpu.counters()["saturated"], backend.saturated(dev)
    if method in ("none", "fp16", "bf16"):
        assert got == want, f"{method} {cfg} {dtype}: saturated {got}, the CPU counted {want}"
    else:
        assert got <= want, f"{method} {cfg} {dtype}: saturated {got}, more than the CPU's {want}"


def cpu_payloads(method: str, cfg: dict, grads: list[torch.Tensor], world: int, rank: int) -> torch.Tensor:
    """What every other rank sends to `rank` (its receive buffer), encoded by the CPU reference."""
    slots = []
    for r, g in enumerate(grads):
        st = fsdpcomp.CommState(method, cfg)
        ss, _ = st._core.plan(g, world, r)
        send = torch.zeros(sum(ss), dtype=torch.uint8)
        sizes = st._core.encode(g, send, world, r, st._core.begin(g.numel()))
        off = sum(sizes[:rank])  # payloads back to back: the plan's, or data-dependent sizes
        slots.append(send[off:off + sizes[rank]])
    return torch.cat(slots)


def check_decode(backend, method: str, cfg: dict, dtype: torch.dtype, world: int, rank: int, n: int,
                 gen: torch.Generator, nonfinite: bool = False, compress_own: bool = False,
                 huge: bool = False, own_nonfinite: bool = False, mode: str = "pass") -> None:
    """Loopback: W payloads from the CPU, decoded (summed in rank order with the own chunk, / W)
    by the backend and by the CPU: the same output and the same counts of non-finite and
    saturated outputs. `nonfinite`: NaN/Inf in the next rank's gradient (its payload flagged);
    `own_nonfinite`: in this rank's own chunk, added in `mode`; `huge`: sums beyond fp32."""
    full = dict(cfg, seed=7, compress_own_chunk=compress_own, nonfinite=mode)
    grads = [make_grad(n, dtype, gen, nonfinite=(nonfinite and r == (rank + 1) % world) or (own_nonfinite and r == rank),
                       huge=huge) for r in range(world)]
    recv = cpu_payloads(method, full, grads, world, rank)
    shard = -(-n // world)
    ref = fsdpcomp.CommState(method, full)
    # 3 more: FSDP's padded tail is zeroed. 7.0 as the backends start from: what no decode
    # writes (a second round's first decode only picks coordinates) then compares equal
    out_c = torch.full((shard + 3,), 7.0, dtype=dtype)
    ref._core.decode(recv, grads[rank], out_c, world, rank, ref._core.begin(n))
    out_d, counts = backend.decode(method, full, recv, grads[rank], out_c.numel(), world, rank)
    where = f"{method} {cfg} {dtype} W={world} r={rank} n={n} nonfinite={nonfinite} huge={huge}"
    assert same_bits(out_c, out_d), f"{where}: decoded sums differ at {differ_at(out_c, out_d)}"
    c = ref.counters()
    for key in ("nonfinite_out", "saturated", "nonfinite_in"):
        assert counts[key] == c[key], f"{where}: {key} {counts[key]}, the CPU counted {c[key]}"


def sum_order_block(bs: int) -> torch.Tensor:
    """A block (bs >= 32, all >= 0) whose onebit mean lands on an fp32 rounding tie in the CPU's
    order of its 8-lane double sums (fc_block.h) and off it in another: lane 0 sums to
    1 + 2^-24 (mean (1 + 2^-24) / bs, a tie: rounds to 1 / bs), lanes 1 and 3 to 3/4 of half a
    double ulp each, which the CPU's tree ((l0+l1)+(l2+l3))+... drops one at a time, but a tree
    that adds l1 and l3 first (or another lane assignment) adds as one ulp: the mean rounds up.
    qsgd's norms go through the same lane sums in the kernels (fc_cu_tile_sums); its square
    root halves such a difference below a double ulp, so onebit is the probe."""
    x = torch.zeros(bs)
    x[0], x[8] = 1.0, 2.0 ** -24
    x[1] = x[3] = 3 * 2.0 ** -55
    return x


def check_sum_order(backend, cfg: dict, gen: torch.Generator) -> None:
    """onebit on probe blocks (sum_order_block) between random ones, one chunk, error feedback:
    the bytes show whether the backend adds in the CPU's order."""
    bs = cfg.get("block_size", 256)
    if bs < 32:
        return
    probe = sum_order_block(bs)
    g = torch.cat([probe, make_grad(bs, torch.float32, gen), probe, make_grad(bs, torch.float32, gen)])
    full = dict(cfg, **common_cfg(1))
    cpu, dev = fsdpcomp.CommState("onebit", full), backend.state("onebit", full)
    a = cpu_encode(cpu, g, 1, 0, cpu._core.begin(g.numel()))
    b = backend.encode(dev, g, 1, 0)
    assert torch.equal(a, b), f"onebit {cfg}: payload bytes differ on the sum-order probe"
    assert same_bits(residual_of(cpu, 0), backend.residual(dev))
