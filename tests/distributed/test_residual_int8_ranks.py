"""residual_dtype "int8" under the three integrations on 2 gloo ranks: FSDP2 (fully_shard), FSDP1
(FULL_SHARD, and NO_SHARD whose all-reduce keeps an all-gather half's residual too) and DDP,
each trained a few steps with error feedback: every residual is packed (uint8), residual_bytes
is at most 1.1 bytes per element of every unit, and the loss falls as it does with fp32
residuals. One spawn for all of it (spawns are slow)."""
import pytest
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import fsdpcomp
from helpers.dist_utils import run_ranks

fully_shard = pytest.importorskip("torch.distributed.fsdp").fully_shard

CFG = {"ratio": 0.1, "quantize": "int8", "error_feedback": True}


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(40, 256), nn.Tanh(), nn.Linear(256, 130), nn.Tanh(), nn.Linear(130, 1))


def _wrap(kind, model):
    if kind == "fsdp2":
        fully_shard(model[0])
        fully_shard(model[2])
        return fully_shard(model)
    if kind == "ddp":
        return DDP(model, bucket_cap_mb=0.05)  # several buckets
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    return FSDP(model, device_id=torch.device("cpu"), sharding_strategy=ShardingStrategy[kind.split("-")[1]],
                use_orig_params=True)


def _train(kind, residual_dtype, rank):
    model = _wrap(kind, _model())
    state = fsdpcomp.register(model, "topk", dict(CFG, residual_dtype=residual_dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(64, 40, generator=g)
    y = x[:, :3].sum(dim=1, keepdim=True)
    losses = []
    for _ in range(30):
        loss = (model(x) - y).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    units = state._core.units()
    kept = [t for t in state._core.residuals() if t is not None]
    gather = [t for t in state._core.residuals("gather") if t is not None]
    return {"losses": losses, "bytes": state.counters()["residual_bytes"],
            "elements": sum(n for n, t in zip(units, state._core.residuals()) if t is not None),
            "dtypes": sorted({str(t.dtype) for t in kept + gather}), "gather": len(gather),
            "gather_bytes": sum(t.numel() for t in gather)}


def _all(rank, world):
    return {(kind, dt): _train(kind, dt, rank)
            for kind in ("fsdp2", "fsdp1-FULL_SHARD", "fsdp1-NO_SHARD", "ddp") for dt in ("fp32", "int8")}


def test_int8_residuals_under_fsdp2_fsdp1_and_ddp():
    results = run_ranks(_all, 2, timeout=600)
    for rank, res in enumerate(results):
        for kind in ("fsdp2", "fsdp1-FULL_SHARD", "fsdp1-NO_SHARD", "ddp"):
            fp32, int8 = res[(kind, "fp32")], res[(kind, "int8")]
            where = f"{kind} rank {rank}"
            assert int8["dtypes"] == ["torch.uint8"], f"{where}: {int8['dtypes']}"
            assert int8["elements"] > 0 and int8["bytes"] > 0, where
            # the C State's residuals, and an all-reduce's all-gather halves (1/W of the unit each)
            assert int8["bytes"] - int8["gather_bytes"] <= 1.1 * int8["elements"], f"{where}: {int8}"
            assert fp32["bytes"] - fp32["gather_bytes"] * 4 == 4 * fp32["elements"], f"{where}: {fp32}"
            if kind in ("fsdp1-NO_SHARD", "ddp"):
                assert int8["gather"] > 0, f"{where}: no all-gather half kept a residual"
            # training goes on: the loss falls as far (within 10%) as with fp32 residuals
            assert int8["losses"][-1] < 0.5 * int8["losses"][0], f"{where}: {int8['losses'][::10]}"
            assert int8["losses"][-1] < 1.1 * fp32["losses"][-1] + 1e-3, \
                f"{where}: int8 {int8['losses'][-1]:.4g} vs fp32 {fp32['losses'][-1]:.4g}"
