"""The CPU's block sums in double (onebit's means; qsgd's norms the same way) follow fc_block.h's
order: 8 lanes, element i of a block into lane (i - lo) % 8, combined
((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)). The probe block of tests/helpers/cuda_cases.py sits on an fp32
rounding tie in that order only: both CPU paths give the value of that order, and another order
gives another value, so the CUDA tests that encode the probe (test_cuda.py,
test_cuda_emulated.py) see a kernel that adds otherwise."""
import struct

import pytest
import torch

from helpers.cuda_cases import sum_order_block
from fsdpcomp import _C


def lanes(x, term):
    l = [0.0] * 8
    for i, v in enumerate(x.tolist()):
        l[i % 8] += term(v)
    return l


def cpu_tree(l):
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))


def other_tree(l):  # the same pairs' sums in another order: l1 + l3 first
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))


def to_f32(v: float) -> float:
    return struct.unpack("<f", struct.pack("<f", v))[0]


@pytest.fixture(params=[False, True], ids=["fast", "reference"])
def path(request):
    prev = _C._reference_kernels(request.param)
    yield
    _C._reference_kernels(prev)


@pytest.mark.parametrize("bs", [32, 256, 1024])
def test_onebit_mean_takes_the_lane_order(path, bs):
    x = sum_order_block(bs)
    s = _C.State("onebit", {"block_size": bs})
    buf = torch.zeros(s.payload_bytes(bs), dtype=torch.uint8)
    s.compress(x, buf)
    mean = buf[32:36].view(torch.float32).item()
    want, other = to_f32(cpu_tree(lanes(x, float)) / bs), to_f32(other_tree(lanes(x, float)) / bs)
    assert mean == want == 1.0 / bs and other != want
