"""fsdpcomp.AllGather on CUDA tensors against the CPU path, bit for bit: one rank (no process
group), so the payload loops back; every codec, fp32 and bf16 parameters. On a GPU machine
(tests/gpu/run.sh) it runs on the device; tests/cuda/test_cuda_files_emulated.py runs it on the
host emulation of cuda/ (FSDPCOMP_TEST_EMULATED=1: the codec's CPU tensors take the CUDA path,
its workspace from the allocator included: the first H200 run found that allocator missing).
Skips (with the reason) where there is neither."""
import pytest
import torch

import fsdpcomp
from helpers.cuda_device import DEV, EMULATED, skip_without_device

skip_without_device()



@pytest.mark.parametrize("codec", ["bf16", "fp8", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("numel", [1, 255, 4099, 65536 * 3 + 5])
def test_cuda_gather_equals_cpu(codec, dtype, numel, gen):
    shard = (torch.randn(numel, generator=gen) * 0.05).to(dtype)
    outs = []
    for on_cuda in (False, True):
        state = fsdpcomp.CommState("none", {"param_gather": codec, "param_gather_block_size": 64})
        if on_cuda and EMULATED:
            state._reducer.param_gather.codec._emulate_cuda(True)
        device = DEV if on_cuda else "cpu"
        out = torch.empty(numel, dtype=dtype, device=device)
        fsdpcomp.AllGather(state, unit=2)(out, shard.to(device, copy=True))
        outs.append(out.cpu())
        assert state.counters()["param_gather_calls"] == 1
    assert torch.equal(outs[0], outs[1])
