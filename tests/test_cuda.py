"""CUDA kernels against the CPU reference, byte for byte, and the NCCL transport at world size 1
through a real FSDP1 run. Skips (with the reason) where there is no GPU or no CUDA library."""
import os

import pytest
import torch

import fsdpcomp
from fsdpcomp import _C

if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the CUDA tests run on a GPU machine (tests/gpu/run.sh)",
                allow_module_level=True)
if not _C.cuda_info()["available"]:
    pytest.skip("CUDA library not usable: " + str(_C.cuda_info()["error"]), allow_module_level=True)

CASES = [
    ("none", {}), ("fp16", {}), ("bf16", {}),
    ("int8", {}), ("int8", {"stochastic": True}), ("int8", {"block_size": 64}),
    ("int8", {"block_size": 4096, "stochastic": True}),
]
SIZES = [1, 7, 255, 1000, 4099, 65536 * 3 + 5]


def pair(method, cfg, **extra):
    c = dict(cfg, seed=1234, **extra)
    return fsdpcomp.CommState(method, c), fsdpcomp.CommState(method, c)


def encode(state, grad, world, rank, unit):
    s, _ = state._core.plan(grad, world, rank)
    send = torch.zeros(sum(s), dtype=torch.uint8, device=grad.device)
    state._core.encode(grad, send, world, rank, unit)
    return send


@pytest.mark.parametrize("method,cfg", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("world,rank", [(1, 0), (3, 1), (4, 0)])
def test_encode_bytes_and_residuals_match_cpu(method, cfg, dtype, world, rank, gen):
    for n in SIZES:
        n = max(n, world)
        # fresh states per size: units are keyed by call order and keep their first size
        cpu, gpu = pair(method, cfg, error_feedback=True, compress_own_chunk=(world == 1))
        for step in range(2):  # the second step encodes with a non-zero residual
            g = (torch.randn(n, generator=gen) * 3).to(dtype)
            u_c, u_g = cpu._core.begin(n), gpu._core.begin(n)
            a = encode(cpu, g, world, rank, u_c)
            b = encode(gpu, g.cuda(), world, rank, u_g)
            torch.cuda.synchronize()
            assert torch.equal(a, b.cpu()), f"{method} {cfg} n={n} step={step}: payload bytes differ"
            rc, rg = cpu._core.residuals()[u_c], gpu._core.residuals()[u_g]
            if rc is not None:
                assert torch.equal(rc, rg.cpu()), f"{method} n={n} step={step}: residuals differ"
            cpu.end_step()
            gpu.end_step()


@pytest.mark.parametrize("method,cfg", CASES)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_loopback_decode_of_w_payloads_matches_cpu(method, cfg, out_dtype, gen):
    world, rank = 4, 2
    for n in (9, 4099, 65536 * 3 + 5):
        grads = [(torch.randn(n, generator=gen) * 2).to(out_dtype) for _ in range(world)]
        slots = []
        for r in range(world):  # what rank r sends to `rank`, encoded by the CPU reference
            st = fsdpcomp.CommState(method, dict(cfg, seed=7))
            u = st._core.begin(n)
            send = encode(st, grads[r], world, r, u)
            ss, _ = st._core.plan(grads[r], world, r)
            off = sum(ss[:rank])
            slots.append(send[off:off + ss[rank]])
        recv = torch.cat([s for r, s in enumerate(slots) if r != rank])
        ref, dev = fsdpcomp.CommState(method, dict(cfg, seed=7)), fsdpcomp.CommState(method, dict(cfg, seed=7))
        shard = -(-n // world)
        out_c = torch.empty(shard, dtype=out_dtype)
        out_g = torch.full((shard,), 7.0, dtype=out_dtype, device="cuda")
        ref._core.decode(recv, grads[rank], out_c, world, rank, ref._core.begin(n))
        dev._core.decode(recv.cuda(), grads[rank].cuda(), out_g, world, rank, dev._core.begin(n))
        torch.cuda.synchronize()
        assert torch.equal(out_c, out_g.cpu()), f"{method} {cfg} n={n}: decoded sums differ"
        assert dev.counters()["nonfinite_out"] == ref.counters()["nonfinite_out"]


def test_corrupt_payload_is_reported(gen):
    st = fsdpcomp.CommState("int8", {"compress_own_chunk": True})
    g = torch.randn(1000, generator=gen).cuda()
    send = encode(st, g, 1, 0, st._core.begin(1000))
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
        fsdpcomp.release_nccl()  # collective: before the group goes
        dist.destroy_process_group()


def test_fsdp1_one_gpu_through_nccl_transport():
    from dist_utils import free_port
    ref, _ = _fsdp_one_gpu(None, None, free_port())
    losses, ctr = _fsdp_one_gpu("int8", {"compress_own_chunk": True, "transport": "nccl",
                                         "error_feedback": True}, free_port())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    assert abs(losses[-1] - ref[-1]) < 0.05 * abs(ref[0])  # int8 + EF trains like fp32
    assert ctr["bytes_sent"] > 0 and ctr["chunks_sent"] > 0
    assert ctr["comm_time_s"] > 0 and ctr["compress_time_s"] > 0 and ctr["decompress_time_s"] > 0
    assert ctr["ratio"] > 3.0
