"""Shared fixtures: fresh random data (never zeros), seeded per test for reproducibility."""
import zlib

import pytest
import torch


@pytest.fixture
def gen(request):
    """A torch.Generator seeded from the test's name: fresh data per test, same data per run."""
    g = torch.Generator()
    g.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    return g
