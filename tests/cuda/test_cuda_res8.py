"""8-bit residuals (residual_dtype "int8", csrc/common/fc_res8.h) through the CUDA library against the CPU
reference: the pack and unpack kernels alone, every method's encode with error feedback over
steps (payload bytes and the packed residual's bytes), and compress() with a packed residual
(the all-gather half).

Runs on a GPU (tests/gpu/run.sh), or here under the host emulation of the CUDA library
(tests/cuda/test_cuda_files_emulated.py runs it with FSDPCOMP_TEST_EMULATED=1)."""
from __future__ import annotations

import pytest
import torch

import fsdpcomp
from helpers.cuda_cases import check_encode, make_grad, same_bits
from helpers.method_cases import CASES, case_id
from helpers.cuda_device import DEV, OnDevice, on_device, skip_without_device

skip_without_device()

INT8 = {"residual_dtype": "int8", "seed": 7}


def residuals_to_pack(gen) -> list[torch.Tensor]:
    """Lengths around the 64-element block; a zero block, tiny values (amax / 127 underflows),
    huge ones, a block of one value repeated (every code 127 before the draw)."""
    out = [make_grad(n, torch.float32, gen) for n in (1, 63, 64, 65, 2053)]
    mixed = torch.randn(640, generator=gen)
    mixed[64:128] = 0
    mixed[128:192] *= 1e-44
    mixed[192:256] *= 3e38
    mixed[256:320] = -2.5
    out.append(mixed)
    return out


def test_pack_and_unpack_match_cpu(gen):
    cpu, dev = fsdpcomp.CommState("topk", INT8), on_device("topk", INT8)
    for unit, e in enumerate(residuals_to_pack(gen)):
        size = cpu._core.residual_numel(e.numel())
        pa, pb = torch.zeros(size, dtype=torch.uint8), torch.full((size,), 0xA5, dtype=torch.uint8, device=DEV)
        cpu._core.pack_residual(e, pa, unit=unit)
        dev._core.pack_residual(e.to(DEV, copy=True), pb, unit=unit)
        assert same_bits(pa, pb.cpu()), f"n={e.numel()}: packed bytes differ"
        ua, ub = torch.empty(e.numel()), torch.full((e.numel(),), float("nan"), device=DEV)
        cpu._core.unpack_residual(pa, ua)
        dev._core.unpack_residual(pb, ub)
        assert same_bits(ua, ub.cpu()), f"n={e.numel()}: unpacked values differ"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_encode_with_int8_residuals_matches_cpu(case, gen):
    method, cfg = case
    for world, rank, n in ((1, 0, 257), (3, 1, 2053)):
        check_encode(OnDevice(), method, cfg, torch.float32, world, rank, n, gen, residual_dtype="int8", steps=3)


@pytest.mark.parametrize("method,cfg", [("int8", {}), ("onebit", {}), ("topk", {"ratio": 0.1}),
                                        ("randomk", {"ratio": 0.25, "quantize": "intN"})], ids=str)
def test_compress_with_a_packed_residual_matches_cpu(method, cfg, gen):
    cfg = dict(cfg, **INT8)
    cpu, dev = fsdpcomp.CommState(method, cfg), on_device(method, cfg)
    n = 1031
    size = cpu._core.residual_numel(n)
    ea, eb = torch.zeros(size, dtype=torch.uint8), torch.zeros(size, dtype=torch.uint8, device=DEV)
    for step in range(3):
        x = make_grad(n, torch.float32, gen)
        pa = torch.zeros(cpu._core.payload_bytes(n), dtype=torch.uint8)
        pb = torch.zeros_like(pa, device=DEV)
        wa = cpu._core.compress(x, pa, unit=2, chunk=4, world=3, rank=1, residual=ea)
        wb = dev._core.compress(x.to(DEV, copy=True), pb, unit=2, chunk=4, world=3, rank=1, residual=eb)
        assert wa == wb and same_bits(pa[:wa], pb[:wb].cpu()), f"{method} step {step}: payloads differ"
        assert same_bits(ea, eb.cpu()), f"{method} step {step}: packed residuals differ"
        assert ea.any(), f"{method} step {step}: the residual stayed zero"
        cpu.end_step()
        dev.end_step()
