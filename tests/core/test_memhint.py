"""The decode's huge-page hint for fresh outputs (csrc/backend_cpu/fc_memhint.c): a large output that was
never touched gets transparent huge pages over its 2 MiB-aligned interior, a reused one is left
alone, and neither changes a byte of the result."""
import re

import pytest
import torch

import fsdpcomp

HUGE = 2 << 20


def _thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return re.search(r"\[(\w+)\]", f.read()).group(1)
    except (OSError, AttributeError):
        return "none"


def _anon_huge_kb(addr: int) -> int:
    """AnonHugePages of the mapping that holds `addr`, from /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
            if m:
                inside = int(m.group(1), 16) <= addr < int(m.group(2), 16)
            elif inside and line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    raise AssertionError(f"no mapping holds {addr:#x}")


def _interior(t: torch.Tensor) -> int:
    return (t.data_ptr() + HUGE - 1) // HUGE * HUGE


def _decode_into(out: torch.Tensor, grad: torch.Tensor) -> None:
    state = fsdpcomp.CommState("int8")
    state.reduce_scatter(grad, out)  # one rank: the own chunk is decoded into out
    state.end_step()


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"), reason="kernel without transparent huge pages")
def test_fresh_large_output_gets_huge_pages_and_the_same_values():
    grad = torch.randn(6 << 20)  # 24 MiB of fp32: several whole huge pages inside
    fresh = torch.empty_like(grad)
    _decode_into(fresh, grad)
    assert _anon_huge_kb(_interior(fresh) + HUGE) > 0
    reused = torch.full_like(grad, float("nan"))  # touched before the decode
    _decode_into(reused, grad)
    assert torch.equal(fresh, reused)
    assert torch.equal(fresh, grad)  # one rank, own chunk exact: the decode is the identity


def test_small_and_touched_outputs_keep_their_pages():
    if _thp_mode() == "always":
        pytest.skip("every mapping may get huge pages without the hint")
    grad = torch.randn(6 << 20)
    touched = torch.zeros_like(grad)
    _decode_into(touched, grad)
    assert _anon_huge_kb(_interior(touched) + HUGE) == 0
    assert torch.equal(touched, grad)
