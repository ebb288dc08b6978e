"""A CUDA State's units past the device's table of residual norms (FC_CUDA_MAX_UNITS in
csrc/backend_cuda/fc_cuda.h): with error feedback such a unit is refused, with a ValueError that names the
limit and the way out, where its residual_norm used to read 0 in counters() with nothing said;
without error feedback nothing is kept per unit, and it encodes as any other.

Runs on a GPU (tests/gpu/run.sh), or here under the host emulation of the CUDA library
(tests/cuda/test_cuda_files_emulated.py runs it with FSDPCOMP_TEST_EMULATED=1)."""
from __future__ import annotations

import pytest
import torch

from helpers.cuda_cases import make_grad
from helpers.cuda_device import DEV, on_device, skip_without_device

skip_without_device()

MAX_UNITS = 4096  # FC_CUDA_MAX_UNITS


def encode(st, g: torch.Tensor, unit: int) -> None:
    """Rank 0 of 2 encodes unit `unit`: chunk 1 goes compressed, its residual kept."""
    splits, _ = st._core.plan(g, 2, 0)
    st._core.encode(g, torch.zeros(sum(splits), dtype=torch.uint8, device=DEV), 2, 0, unit)


@pytest.mark.parametrize("ef", [True, False], ids=["error_feedback", "no_error_feedback"])
def test_a_unit_past_the_device_table(ef, gen):
    st = on_device("int8", {"error_feedback": ef, "seed": 1})
    n = 512
    g = make_grad(n, torch.float32, gen).to(DEV)
    for _ in range(MAX_UNITS - 1):
        st._core.begin(n)
    encode(st, g, st._core.begin(n))  # the table's last unit
    past = st._core.begin(n)
    assert past == MAX_UNITS
    if not ef:
        encode(st, g, past)
        return
    with pytest.raises(ValueError, match=r"at most 4096 units per State, and this is unit 4096.*error_feedback"):
        encode(st, g, past)
    # the units inside the table are counted as before
    assert st.counters()["residual_norm"] > 0

