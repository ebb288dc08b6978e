"""Builds tests/cuda_emu's emulator: cuda/*.cu (all but the CUB file) compiled as C++ by the
host compiler against cuda_runtime.h here, launches rewritten from `k<<<cfg>>>(` to
`fc_emu_launch(k, cfg)(`, every `float` of cuda/ and of the csrc/common/ rules it includes
rewritten to emu_float.h's fc_emu_f32 (the device's NaN bits and float-to-integer casts: that
header says what the emulation reproduces of a GPU's fp32 and what it cannot;
FSDPCOMP_EMU_HOST_FLOAT=1 builds with the host's float instead, to see what it hides), with
emu_stubs.cpp (CUB's two algorithms as host loops, the exported table's wrapper that poisons
each call's scratch) and emu_swap.cpp (the fiber switch): linked with emu_main.cpp into an
executable (build), or into a shared library that fsdpcomp._C loads in place of
_fsdpcomp_cuda.so (build_shared: the real host glue drives it, CPU tensors standing for CUDA
ones, see tests/cuda/test_cuda_files_emulated.py)."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# FSDPCOMP_EMU_CUDA_SRC: another copy of cuda/ to build (tests/cuda_emu/mutate.py's mutants)
CUDA = os.environ.get("FSDPCOMP_EMU_CUDA_SRC") or os.path.join(ROOT, "cuda")
CSRC = os.path.join(ROOT, "csrc")
COMMON = os.path.join(CSRC, "common")  # the shared rules: copied and rewritten as cuda/ is
# the library's contract with _C (csrc/backend_cuda/fc_cuda.h): copied and rewritten alike
CONTRACT = os.path.join("backend_cuda", "fc_cuda.h")
LAUNCH = re.compile(r"([A-Za-z_]\w*(?:<[^<>;]*>)?)<<<(.*?)>>>\(")
SKIP = {"fc_cu_cub.cu"}  # CUB: emu_stubs.cpp stands in
# __CUDA_ARCH__: the rules' device branches (fc_quant.h's fc_floor_i32), as a GPU runs them
FLAGS = ["-std=c++20", "-O1", "-pthread", "-ffp-contract=off", "-w", "-fPIC", "-D__CUDA_ARCH__=900"]
# `float` as a token, and an fp32 literal (`0.5f`: an fc_emu_f32 too, or `c ? x : 0.0f` would
# mix the two types, which C++ refuses), outside string and character literals and comments (those
# are matched first and kept)
FLOAT = re.compile(r'("(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/)'  # kept
                   r'|\bfloat\b'
                   r'|(?<![\w.])((?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+'
                   r'|0[xX][0-9a-fA-F]*\.?[0-9a-fA-F]*[pP][+-]?\d+)[fF]\b', re.S)
# the driver's exported table comes through emu_stubs.cpp's wrapper (poisoned scratch per call)
RENAME = ["-Dfc_cuda_get_api=fc_emu_real_get_api"]
STATIC_SHARED_LIMIT = 48 * 1024  # a kernel's static __shared__ bytes (cudaErrorInvalidValue above)


def sources() -> list[str]:
    return sorted(f for f in os.listdir(CUDA) if f.endswith((".cu", ".cuh", ".h")))


def device_float() -> bool:
    """Whether the build rewrites float into emu_float.h's fc_emu_f32 (the default)."""
    return os.environ.get("FSDPCOMP_EMU_HOST_FLOAT", "0") in ("", "0")


def rewrite_float(text: str) -> str:
    if not device_float():
        return text

    def one(m: re.Match) -> str:
        if m.group(1) is not None:
            return m.group(1)
        return f"fc_emu_f32({m.group(2)}f)" if m.group(2) is not None else "fc_emu_f32"

    return FLOAT.sub(one, text)


def rewrite(text: str) -> str:
    return rewrite_float(LAUNCH.sub(lambda m: f"fc_emu_launch({m.group(1)}, {m.group(2)})(", text))


def probe_flags() -> list[str]:
    """The compiler flags of a one-file program against the emulation (a probe of its behaviour,
    tests/cuda/test_cuda_emu_*.py), as the emulated cuda/ is compiled; its source goes through
    rewrite() first."""
    return [f for f in FLAGS if f not in ("-w", "-fPIC")] + ["-I", HERE] + (
        ["-include", "emu_float.h"] if device_float() else [])


def build(out_dir: str) -> str:
    """Builds the executable into out_dir (reused when the sources are unchanged)."""
    return _build(out_dir, shared=False)


def build_shared(out_dir: str) -> str:
    """Builds the shared library into out_dir (reused when the sources are unchanged)."""
    return _build(out_dir, shared=True)


def _build(out_dir: str, shared: bool) -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++) for the CUDA emulation")
    h = hashlib.sha256()
    for d, names in ((CUDA, sources()), (CSRC, sorted(os.path.relpath(os.path.join(dp, f), CSRC) for dp, _, fs in os.walk(CSRC) for f in fs)), (HERE, sorted(os.listdir(HERE)))):
        for f in names:
            p = os.path.join(d, f)
            if os.path.isfile(p):
                h.update(f.encode())
                with open(p, "rb") as fh:
                    h.update(fh.read())
    h.update(b"device-float" if device_float() else b"host-float")
    tag = h.hexdigest()[:16]
    exe = os.path.join(out_dir, ("libemu-" if shared else "emu-") + tag + (".so" if shared else ""))
    if os.path.exists(exe):
        return exe
    # one object directory per source state, shared by the executable and the library (the same
    # flags: -fPIC for both); every file lands by rename, so builds may run side by side
    src = os.path.join(out_dir, "src-" + tag)
    os.makedirs(src, exist_ok=True)
    tmp = f".tmp{os.getpid()}"
    # cuda/, the shared rules and the library's contract (src/common/ and src/backend_cuda/ come
    # before csrc/ on the include path) and the two emulator files that include cuda/'s headers,
    # rewritten alike: one float type throughout
    copies = [(CUDA, f, f) for f in sources()]
    copies += [(COMMON, f, os.path.join("common", f)) for f in sorted(os.listdir(COMMON)) if f.endswith(".h")]
    copies += [(CSRC, CONTRACT, CONTRACT)]
    copies += [(HERE, f, f) for f in ("emu_stubs.cpp", "emu_main.cpp")]
    for d in ("common", "backend_cuda"):
        os.makedirs(os.path.join(src, d), exist_ok=True)
    for d, f, to in copies:
        with open(os.path.join(d, f)) as fh:
            text = rewrite(fh.read())
        with open(os.path.join(src, to) + tmp, "w") as fh:
            fh.write(text)
        os.replace(os.path.join(src, to) + tmp, os.path.join(src, to))
    incs = ["-I", HERE, "-I", src, "-I", CSRC] + (["-include", "emu_float.h"] if device_float() else [])
    units = [os.path.join(src, f) for f in sources() if f.endswith(".cu") and f not in SKIP]
    units += [os.path.join(src, "emu_stubs.cpp"), os.path.join(HERE, "emu_swap.cpp")]
    if not shared:
        units.append(os.path.join(src, "emu_main.cpp"))

    def compile_one(path: str) -> str:
        obj = os.path.join(src, os.path.basename(path) + ".o")
        if not os.path.exists(obj):
            rename = [] if path.endswith("emu_main.cpp") else RENAME
            subprocess.run([cxx, "-x", "c++", "-c", path, "-o", obj + tmp] + FLAGS + rename + incs, check=True,
                           capture_output=True, text=True)
            os.replace(obj + tmp, obj)
        return obj

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        try:
            objs = list(pool.map(compile_one, units))
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"emulator build failed: {' '.join(e.cmd)}\n{e.stderr}") from e
    check_static_shared(objs)
    subprocess.run([cxx, "-o", exe + tmp] + objs + ["-pthread"] + (["-shared"] if shared else []), check=True)
    os.replace(exe + tmp, exe)
    return exe


def static_shared(objs: list[str]) -> dict[str, int]:
    """Static __shared__ bytes per function that declares them (cuda_runtime.h puts every
    __shared__ variable in the section fc_emu_shared), by its demangled name: a kernel holds at
    least its largest (the codec kernels' tiles: ~21 KiB of 48)."""
    seen: dict[str, int] = {}  # a variable of an inline function is in every object that uses it
    for obj in objs:
        r = subprocess.run(["objdump", "-t", "-C", obj], capture_output=True, text=True, check=True)
        for line in r.stdout.splitlines():
            f = line.split()
            if "fc_emu_shared" not in f or len(f) < 6:
                continue
            at = f.index("fc_emu_shared")
            seen[" ".join(f[at + 2:])] = int(f[at + 1], 16)
    per: dict[str, int] = {}
    for name, size in seen.items():
        func = name.rsplit("::", 1)[0] if "::" in name else name
        per[func] = per.get(func, 0) + size
    return per


def check_static_shared(objs: list[str]) -> None:
    if shutil.which("objdump") is None:
        return
    over = {k: v for k, v in static_shared(objs).items() if v > STATIC_SHARED_LIMIT}
    if over:
        raise RuntimeError(f"kernels with more than {STATIC_SHARED_LIMIT} bytes of static shared memory "
                           f"(a launch fails on a GPU): {over}")


if __name__ == "__main__":
    import sys
    print(build(sys.argv[1] if len(sys.argv) > 1 else "/tmp/fc_cuda_emu"))
