"""A small transformer under real FSDP1 on gloo ranks: `none` reproduces torch's own
reduce-scatter, `int8` trains, every sharding strategy FSDP1 allows a hook for works."""
import functools

import pytest
import torch
import torch.nn as nn

import fsdpcomp
from helpers.dist_utils import run_ranks
from helpers.tiny_models import TinyLM


def _train(rank, world, method, config, strategy, steps, dtype_name, optim="adam"):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    torch.manual_seed(0)
    model = TinyLM()
    mp = None
    if dtype_name != "float32":
        dt = getattr(torch, dtype_name)
        mp = MixedPrecision(param_dtype=torch.float32, reduce_dtype=dt)
    fsdp = FSDP(model, device_id=torch.device("cpu"), sharding_strategy=ShardingStrategy[strategy],
                auto_wrap_policy=ModuleWrapPolicy({nn.TransformerEncoderLayer}), mixed_precision=mp,
                use_orig_params=True)
    state = fsdpcomp.register(fsdp, method, config) if method else None
    opt = (torch.optim.Adam(fsdp.parameters(), lr=3e-3) if optim == "adam"
           else torch.optim.SGD(fsdp.parameters(), lr=0.1))
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    # a learnable task: predict the next token of a repeating pattern
    losses = []
    for _ in range(steps):
        start = torch.randint(0, 8, (8, 1), generator=g)
        seq = (start + torch.arange(17)) % 8
        logits = fsdp(seq[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 64), seq[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    with FSDP.summon_full_params(fsdp):
        params = torch.cat([p.detach().reshape(-1).clone() for p in fsdp.parameters()])
    return losses, params, (state.counters() if state else None)


@pytest.mark.parametrize("world", [2, 3])
def test_none_matches_torch_reduce_scatter(world):
    # SGD: the update is linear in the gradient, so summation-order rounding stays at its size
    ref_losses, ref_params, _ = run_ranks(_train, world, None, None, "FULL_SHARD", 4, "float32", "sgd")[0]
    losses, params, c = run_ranks(_train, world, "none", {}, "FULL_SHARD", 4, "float32", "sgd")[0]
    if world == 2:
        # a + b is a + b in any order: bit-identical parameters
        assert torch.equal(params, ref_params)
    else:
        # three addends: torch's gloo sums in its own order, we in our fixed one, so the two
        # differ by fp32 rounding of the sum (a few ulp), carried through 4 SGD steps.
        torch.testing.assert_close(params, ref_params, rtol=1e-6, atol=1e-7)
    assert c["calls"] == 4 * 3  # three FSDP units (2 blocks + root), four steps
    assert c["units"] == 3 and c["step"] == 4


@pytest.mark.parametrize("world,strategy,dtype_name", [
    (2, "FULL_SHARD", "float32"), (3, "FULL_SHARD", "bfloat16"),
    (2, "SHARD_GRAD_OP", "float16"), (2, "NO_SHARD", "float32")])
def test_int8_trains(world, strategy, dtype_name):
    results = run_ranks(_train, world, "int8", {"error_feedback": True}, strategy, 30, dtype_name)
    losses, params, c = results[0]
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5, losses
    for other in results[1:]:
        assert torch.equal(other[1], params), "ranks disagree on the parameters"
    if strategy == "NO_SHARD":
        # all-reduce = compressed reduce-scatter + compressed all-gather (allgather_compress's
        # default); int8's 8 bits + a scale per block on both halves
        assert c["ratio"] > 3.5
    else:
        assert c["ratio"] > (1.8 if dtype_name != "float32" else 3.5)
    assert c["residual_bytes"] > 0 and c["nonfinite_in"] == 0
