"""fsdpcomp.AllGather on CUDA tensors against the CPU path, bit for bit: one rank (no process
group), so the payload loops back; every codec, fp32 and bf16 parameters. Skips (with the
reason) where there is no GPU or no CUDA library."""
import pytest
import torch

import fsdpcomp
from fsdpcomp import _C

if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the CUDA tests run on a GPU machine (tests/gpu/run.sh)",
                allow_module_level=True)
if not _C.cuda_info()["available"]:
    pytest.skip("CUDA library not usable: " + str(_C.cuda_info()["error"]), allow_module_level=True)


@pytest.mark.parametrize("codec", ["bf16", "fp8", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("numel", [1, 255, 4099, 65536 * 3 + 5])
def test_cuda_gather_equals_cpu(codec, dtype, numel, gen):
    shard = (torch.randn(numel, generator=gen) * 0.05).to(dtype)
    outs = {}
    for device in ("cpu", "cuda"):
        state = fsdpcomp.CommState("none", {"param_gather": codec, "param_gather_block_size": 64})
        out = torch.empty(numel, dtype=dtype, device=device)
        fsdpcomp.AllGather(state, unit=2)(out, shard.to(device, copy=True))
        outs[device] = out.cpu()
        assert state.counters()["param_gather_calls"] == 1
    assert torch.equal(outs["cpu"], outs["cuda"])
