"""The CUDA driver's GPU checks (tests/gpu/checks_driver.py: 300 calls without counters(), event
timing, counters() without the GIL, the sampling rule) under pytest; tests/gpu/run.sh runs the
same functions one subprocess each. Skips without a GPU."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu"))

if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the CUDA tests run on a GPU machine (tests/gpu/run.sh)",
                allow_module_level=True)

import checks_driver  # noqa: E402
from gpu_common import Skip  # noqa: E402

CHECKS = sorted(n for n in vars(checks_driver) if n.startswith("check_"))


@pytest.mark.parametrize("name", CHECKS)
def test_driver(name):
    try:
        getattr(checks_driver, name)()
    except Skip as e:
        pytest.skip(str(e))
