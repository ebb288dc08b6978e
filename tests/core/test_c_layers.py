"""The C layers a reader relies on (issue 28): csrc/ holds one folder a layer, each including only
from the layers csrc/README.md allows; the CPython glue (csrc/python/state_*.c) never asks which
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


LAYERS = {  # csrc/README.md's table: what each folder may include besides itself
    "python": {"driver", "backend_cpu", "backend_cuda", "methods", "common"},
    "driver": {"methods", "common"},
    "backend_cpu": {"driver", "methods", "common"},
    "backend_cuda": {"driver", "methods", "common"},
    "methods": {"common"},
    "common": set(),
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _read(rel):
    with open(os.path.join(CSRC, rel), encoding="utf-8") as f:
        return f.read()


def _glue_files():
    names = sorted(n for n in os.listdir(os.path.join(CSRC, "python")) if n.startswith("state_") and n.endswith(".c"))
    assert len(names) >= 10, names  # the glue is where this test looks: an empty list would pass anything
    return names


def test_csrc_is_one_folder_a_layer():
    top = sorted(os.listdir(CSRC))
    assert set(top) == set(LAYERS) | {"README.md"}, top


def test_layers_include_only_what_their_table_allows():
    bad = []
    for layer, allowed in LAYERS.items():
        for name in sorted(os.listdir(os.path.join(CSRC, layer))):
            for inc in INCLUDE.findall(_read(os.path.join(layer, name))):
                folder = inc.split("/")[0] if "/" in inc else None
                if folder is None:
                    bad.append(f"{layer}/{name}: bare include {inc!r} (name its layer: csrc/ is the include root)")
                elif folder in LAYERS and folder != layer and folder not in allowed:
                    bad.append(f"{layer}/{name} includes {inc}")
    assert not bad, "\n".join(bad)


def test_glue_never_branches_on_the_device():
    hits = []
    for name in _glue_files():
        if name not in DEVICE_TEST_OK:
            for i, line in enumerate(_read(os.path.join("python", name)).splitlines(), 1):
                if DEVICE_TEST.search(line):
                    hits.append(f"{name}:{i}: {line.strip()}")
    assert not hits, "a device test outside state_exec.c (use the backend table):\n" + "\n".join(hits)


def test_cpu_backend_does_not_call_the_driver():
    calls = re.findall(r"\bfc_drive_\w+\s*\(", _read("backend_cpu/fc_encode.c"))
    assert not calls, f"fc_encode.c calls the driver back: {calls}"


def test_cuda_encode_keeps_its_records():
    src = _read("backend_cuda/fc_cuda_path.c")
    assert not re.search(r"\b(calloc|malloc)\s*\(", src.split("static int cuda_decode")[0]), \
        "the CUDA encode allocates per call; keep its records in the State (fc_cuda_host)"


def test_error_feedback_is_decided_by_the_driver_only():
    hits = [f"{name}:{i}" for name in _glue_files()
            for i, line in enumerate(_read(os.path.join("python", name)).splitlines(), 1)
            if "common.error_feedback" in line]
    assert not hits, "the glue decides error feedback itself (ask fc_drive_uses_residual): " + ", ".join(hits)


# a function a C file defines for other files: its return type and name open a line, not `static`
DEFINITION = re.compile(r"^(?!static\b|FC_CLONES static\b)[A-Za-z_][\w \t\*]*?\b(\w+)\s*\([^;{}]*\)\s*\{",
                        re.M)
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def _c_files(layer):
    return sorted(n for n in os.listdir(os.path.join(CSRC, layer)) if n.endswith(".c"))


def test_driver_reaches_the_backends_through_their_table_only():
    """The driver calls no function a backend defines: its element work goes through the table
    (driver/fc_backend.h), so a backend can change without the driver knowing its names."""
    defined = {}
    for layer in ("backend_cpu", "backend_cuda"):
        for name in _c_files(layer):
            for fn in DEFINITION.findall(COMMENT.sub("", _read(os.path.join(layer, name)))):
                defined[fn] = f"{layer}/{name}"
    assert "fc_cpu_decode" in defined and "fc_cpu_encode" in defined, sorted(defined)  # the scan sees them
    calls = []
    for name in _c_files("driver"):
        src = COMMENT.sub("", _read(os.path.join("driver", name)))
        for fn in sorted(defined):
            if re.search(r"\b%s\s*\(" % fn, src):
                calls.append(f"driver/{name} calls {fn} ({defined[fn]}): a table entry, or the driver's own function")
    assert not calls, "\n".join(calls)



def test_no_include_climbs_out_of_its_include_directory():
    """csrc/ and cuda/ are the include directories; a header is named from one of them, never
    with `../` past it."""
    root = os.path.dirname(CSRC)
    bad = []
    for top in ("csrc", "cuda"):
        for d, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if name.endswith((".c", ".h", ".cu", ".cuh")):
                    with open(os.path.join(d, name), encoding="utf-8") as f:
                        for inc in INCLUDE.findall(f.read()):
                            if ".." in inc.split("/"):
                                bad.append(f"{os.path.relpath(os.path.join(d, name), root)}: #include \"{inc}\"")
    assert not bad, "\n".join(bad)
