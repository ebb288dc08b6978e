"""The C layers a reader relies on (issue 28): the CPython glue (csrc/state_*.c) never asks which
device a call runs on, past the one place that picks the backend (state_exec.c); the CPU
backend's loops never call the driver back (fc_drive.c calls fc_encode.c, not the reverse); and
the CUDA backend's encode allocates nothing per call; error feedback is the driver's decision."""
import os
import re

CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "csrc")

# the call's backend tested by its CUDA half (x.k, a->x.k, x->k), or the device asked outright
DEVICE_TEST = re.compile(r"\bx\s*(\.|->)\s*k\b|fc_state_on_cuda|\bcuda_ws\b")
# state_type.c only keeps the workspace tensor alive (GC and dealloc)
DEVICE_TEST_OK = {"state_exec.c", "state_type.c"}


def _read(name):
    with open(os.path.join(CSRC, name), encoding="utf-8") as f:
        return f.read()


def test_glue_never_branches_on_the_device():
    hits = []
    for name in sorted(os.listdir(CSRC)):
        if name.startswith("state_") and name.endswith(".c") and name not in DEVICE_TEST_OK:
            for i, line in enumerate(_read(name).splitlines(), 1):
                if DEVICE_TEST.search(line):
                    hits.append(f"{name}:{i}: {line.strip()}")
    assert not hits, "a device test outside state_exec.c (use the backend table):\n" + "\n".join(hits)


def test_cpu_backend_does_not_call_the_driver():
    calls = re.findall(r"\bfc_drive_\w+\s*\(", _read("fc_encode.c"))
    assert not calls, f"fc_encode.c calls the driver back: {calls}"


def test_cuda_encode_keeps_its_records():
    src = _read("fc_cuda_path.c")
    assert not re.search(r"\b(calloc|malloc)\s*\(", src.split("static int cuda_decode")[0]), \
        "the CUDA encode allocates per call; keep its records in the State (fc_cuda_host)"


def test_error_feedback_is_decided_by_the_driver_only():
    hits = [f"{name}:{i}" for name in sorted(os.listdir(CSRC))
            if name.startswith("state_") and name.endswith(".c")
            for i, line in enumerate(_read(name).splitlines(), 1) if "common.error_feedback" in line]
    assert not hits, "the glue decides error feedback itself (ask fc_drive_uses_residual): " + ", ".join(hits)
