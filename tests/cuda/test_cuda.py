"""CUDA kernels against the CPU reference, byte for byte (the cases and checks of
tests/helpers/cuda_cases.py: every method with CUDA kernels, at odd sizes, W = 1, 3, 4, fp32/bf16/fp16
gradients, error feedback with fp32 and bf16 residuals over two steps, NaN/Inf in both
`nonfinite` modes), and a real FSDP1 run on one GPU (an NCCL process group of one rank). Skips
(with the reason) where there is no GPU or no CUDA library."""
import os

import pytest
import torch

import fsdpcomp
from helpers.cuda_cases import check_decode, check_encode, check_sum_order, cpu_encode, cuda_cases, cuda_methods
from helpers.cuda_device import OnDevice, skip_without_device

skip_without_device(emulation=False)

GPU = OnDevice()  # on a GPU: CUDA tensors
CASES = cuda_cases()
IDS = [m + "".join(f"-{k}={v}" for k, v in c.items()) for m, c in CASES]
SIZES = [1, 255, 257, (1 << 20) + 3]


def test_cuda_flag_says_which_methods_have_kernels():
    have = {m for m in fsdpcomp.codecs() if _C_has_method(fsdpcomp.method_info(m)["id"])}
    assert set(cuda_methods()) == have


def _C_has_method(method_id: int) -> bool:
    """Whether the loaded library's table has the method: a CUDA tensor either encodes or says
    it has no kernels."""
    st = fsdpcomp.CommState(next(m for m in fsdpcomp.codecs() if fsdpcomp.method_info(m)["id"] == method_id),
                            {"compress_own_chunk": True})
    g = torch.randn(64, device="cuda")
    unit = st._core.begin(64)
    s, _ = st._core.plan(g, 1, 0, unit)  # the unit: adaptive's sizes follow its parts table
    try:
        st._core.encode(g, torch.empty(sum(s), dtype=torch.uint8, device="cuda"), 1, 0, unit)
    except TypeError:
        return False
    return True


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("world,rank", [(1, 0), (3, 1), (4, 3)])
@pytest.mark.parametrize("res", ["fp32", "bf16"])
def test_encode_bytes_and_residuals_match_cpu(method, cfg, dtype, world, rank, res, gen):
    for n in SIZES:
        check_encode(GPU, method, cfg, dtype, world, rank, max(n, world), gen, residual_dtype=res)


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
@pytest.mark.parametrize("mode", ["pass", "zero"])
@pytest.mark.parametrize("world,rank", [(1, 0), (3, 2)])
def test_encode_of_nonfinite_inputs_matches_cpu(method, cfg, mode, world, rank, gen):
    for n in SIZES:
        check_encode(GPU, method, cfg, torch.float32, world, rank, max(n, world), gen, nonfinite=mode)


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
@pytest.mark.parametrize("scale", [1e-40, 1e-37, 1e30])
def test_encode_of_tiny_and_huge_values_matches_cpu(method, cfg, scale, gen):
    for world, rank, n in ((1, 0, 257), (3, 1, 4099)):
        check_encode(GPU, method, cfg, torch.float32, world, rank, n, gen, scale=scale)


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
def test_encode_near_the_largest_values_matches_cpu(method, cfg, gen):
    """g + e beyond fp32, saturated codes, residuals and casts, three steps of error feedback."""
    for dtype, res in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp32")):
        for world, rank, n in ((1, 0, 257), (3, 1, 4099)):
            check_encode(GPU, method, cfg, dtype, world, rank, n, gen, residual_dtype=res, huge=True, steps=3)


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
def test_decode_of_overflowing_and_nonfinite_sums_matches_cpu(method, cfg, gen):
    """Sums beyond fp32 saturate unless the own chunk ("pass") or a flagged payload brought
    NaN/Inf; the counters follow."""
    check_decode(GPU, method, cfg, torch.float32, 3, 1, 4099, gen, huge=True)
    check_decode(GPU, method, cfg, torch.bfloat16, 4, 0, 777, gen, huge=True)
    check_decode(GPU, method, cfg, torch.float32, 3, 2, 4099, gen, huge=True, own_nonfinite=True)
    check_decode(GPU, method, cfg, torch.float32, 3, 2, 4099, gen, huge=True, own_nonfinite=True, mode="zero")
    check_decode(GPU, method, cfg, torch.float32, 3, 0, 4099, gen, huge=True, nonfinite=True, mode="zero")


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_loopback_decode_of_w_payloads_matches_cpu(method, cfg, dtype, gen):
    for n in (9, 4099, 65536 * 3 + 5):
        check_decode(GPU, method, cfg, dtype, 4, 2, n, gen)
    check_decode(GPU, method, cfg, dtype, 3, 1, 257, gen, nonfinite=True, compress_own=True)
    check_decode(GPU, method, cfg, dtype, 1, 0, 1, gen, compress_own=True)


@pytest.mark.parametrize("cfg", [{}, {"block_size": 32}, {"block_size": 64}, {"block_size": 1024}])
def test_block_sums_take_the_cpu_order(cfg, gen):
    check_sum_order(GPU, cfg, gen)


@pytest.mark.parametrize("method,cfg,off,val", [("intN", {"bits": 2}, 4, 0xFF), ("qsgd", {"levels": 2}, 4, 0xFF),
                                                ("nc", {}, 4, 0x80)])
def test_impossible_codes_are_reported(method, cfg, off, val, gen):
    st = fsdpcomp.CommState(method, dict(cfg, compress_own_chunk=True))
    g = torch.randn(64, generator=gen)
    send = cpu_encode(st, g, 1, 0, st._core.begin(64))
    send[32 + off] = val  # the first group's codes: one no encoder writes
    with pytest.raises(fsdpcomp.PayloadError):
        st._core.decode(send, g, torch.empty(64), 1, 0, 0)
    dev = fsdpcomp.CommState(method, dict(cfg, compress_own_chunk=True))
    out = torch.empty(64, device="cuda")
    dev._core.decode(send.cuda(), g.cuda(), out, 1, 0, dev._core.begin(64))
    with pytest.raises(fsdpcomp.PayloadError, match="rank 0.*a code no encoder writes"):
        dev.counters()
    assert torch.isnan(out).any()


def test_corrupt_payload_is_reported(gen):
    st = fsdpcomp.CommState("int8", {"compress_own_chunk": True})
    g = torch.randn(1000, generator=gen).cuda()
    s, _ = st._core.plan(g, 1, 0)
    send = torch.zeros(sum(s), dtype=torch.uint8, device="cuda")
    st._core.encode(g, send, 1, 0, st._core.begin(1000))
    send[0] ^= 0xFF  # magic
    out = torch.empty(1000, device="cuda")
    st._core.decode(send, g, out, 1, 0, 0)
    with pytest.raises(fsdpcomp.PayloadError, match="bad magic"):
        st.counters()
    assert torch.isnan(out).all()


def _fsdp_one_gpu(method, cfg, port):
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = FSDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).cuda(),
                     device_id=torch.cuda.current_device())
        state = fsdpcomp.register(model, method, cfg) if method else None
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        x, y = torch.randn(128, 64, device="cuda"), torch.randn(128, 8, device="cuda")
        losses = []
        for _ in range(5):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, (dict(state.counters()) if state else None)
    finally:
        dist.destroy_process_group()


def test_fsdp1_one_gpu():
    from helpers.dist_utils import free_port
    ref, _ = _fsdp_one_gpu(None, None, free_port())
    losses, ctr = _fsdp_one_gpu("int8", {"compress_own_chunk": True, "error_feedback": True}, free_port())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    assert abs(losses[-1] - ref[-1]) < 0.05 * abs(ref[0])  # int8 + EF trains like fp32
    assert ctr["bytes_sent"] > 0 and ctr["chunks_sent"] > 0
    # one rank: its own payload loops back without a collective, so no comm time to see
    assert ctr["compress_time_s"] > 0 and ctr["decompress_time_s"] > 0
    assert ctr["ratio"] > 3.0
