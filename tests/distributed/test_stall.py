"""A stalled peer on a CPU process group: a rank that stops calling the hook makes every other
rank raise within the process group's timeout (torch's error naming the timeout), never hang.
Each exchange path: per-peer messages in pieces, one all-to-all, and the size exchange of a
variable-size method; 5 s timeout on real gloo ranks."""
import time

import pytest
import torch

import fsdpcomp
from helpers.dist_utils import run_ranks

TIMEOUT_S = 5.0


def _stall(rank, world, method, config, numel):
    state = fsdpcomp.CommState(method, config)
    grad, out = torch.randn(numel), torch.empty(numel // world)
    state.reduce_scatter(grad, out)  # every rank: the exchange works
    state.end_step()
    if rank == world - 1:  # stops calling the hook, and outlives the others' timeout
        time.sleep(TIMEOUT_S + 10)
        return None
    t0 = time.monotonic()
    try:
        state.reduce_scatter(grad, out)
    except Exception as e:  # torch's RuntimeError / DistBackendError
        return type(e).__name__, str(e), time.monotonic() - t0
    return None, "returned", time.monotonic() - t0


@pytest.mark.parametrize("world,method,config,numel", [
    (2, "int8", {"pipeline_piece": 65536}, 1 << 20),  # per-peer, 8 pieces of 64Ki elements
    (2, "int8", {"pipeline": False}, 1 << 16),       # one all-to-all
    (3, "thresholdv", {}, 3 << 14),                  # sizes first, then the all-to-all
])
def test_stalled_peer_raises_within_the_timeout(world, method, config, numel):
    results = run_ranks(_stall, world, method, config, numel, pg_timeout_s=TIMEOUT_S, timeout=120)
    for rank, res in enumerate(results[:-1]):
        kind, message, waited = res
        assert kind is not None, f"rank {rank} returned from an exchange with a stalled peer"
        assert "timed out" in message.lower() or "timeout" in message.lower(), message
        assert waited < 2 * TIMEOUT_S + 3, f"rank {rank} raised after {waited:.1f} s"
