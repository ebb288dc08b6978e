"""Builds tests/cuda_emu's emulator: cuda/*.cu (all but the CUB file) compiled as C++ by the
host compiler against cuda_runtime.h here, launches rewritten from `k<<<cfg>>>(` to
`fc_emu_launch(k, cfg)(`, with emu_stubs.cpp (CUB's two algorithms as host loops): linked with
emu_main.cpp into an executable (build), or into a shared library that fsdpcomp._C loads in
place of _fsdpcomp_cuda.so (build_shared: the real host glue drives it, CPU tensors standing for
CUDA ones, see tests/test_cuda_sparse_emulated.py)."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CUDA, CSRC = os.path.join(ROOT, "cuda"), os.path.join(ROOT, "csrc")
LAUNCH = re.compile(r"([A-Za-z_]\w*(?:<[^<>;]*>)?)<<<(.*?)>>>\(")
SKIP = {"fc_cu_cub.cu"}  # CUB: emu_stubs.cpp stands in (the NCCL transport compiles too: it loads
# libnccl when used, never here)
FLAGS = ["-std=c++20", "-O1", "-pthread", "-ffp-contract=off", "-w", "-fPIC"]


def sources() -> list[str]:
    return sorted(f for f in os.listdir(CUDA) if f.endswith((".cu", ".cuh", ".h")))


def rewrite(text: str) -> str:
    return LAUNCH.sub(lambda m: f"fc_emu_launch({m.group(1)}, {m.group(2)})(", text)


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
    for d, names in ((CUDA, sources()), (CSRC, sorted(os.listdir(CSRC))), (HERE, sorted(os.listdir(HERE)))):
        for f in names:
            p = os.path.join(d, f)
            if os.path.isfile(p):
                h.update(f.encode())
                with open(p, "rb") as fh:
                    h.update(fh.read())
    tag = h.hexdigest()[:16]
    exe = os.path.join(out_dir, ("libemu-" if shared else "emu-") + tag + (".so" if shared else ""))
    if os.path.exists(exe):
        return exe
    # one object directory per source state, shared by the executable and the library (the same
    # flags: -fPIC for both); every file lands by rename, so builds may run side by side
    src = os.path.join(out_dir, "src-" + tag)
    os.makedirs(src, exist_ok=True)
    tmp = f".tmp{os.getpid()}"
    for f in sources():
        with open(os.path.join(CUDA, f)) as fh:
            text = rewrite(fh.read())
        with open(os.path.join(src, f) + tmp, "w") as fh:
            fh.write(text)
        os.replace(os.path.join(src, f) + tmp, os.path.join(src, f))
    incs = ["-I", HERE, "-I", src, "-I", CSRC]
    units = [os.path.join(src, f) for f in sources() if f.endswith(".cu") and f not in SKIP]
    units.append(os.path.join(HERE, "emu_stubs.cpp"))
    if not shared:
        units.append(os.path.join(HERE, "emu_main.cpp"))

    def compile_one(path: str) -> str:
        obj = os.path.join(src, os.path.basename(path) + ".o")
        if not os.path.exists(obj):
            subprocess.run([cxx, "-x", "c++", "-c", path, "-o", obj + tmp] + FLAGS + incs, check=True,
                           capture_output=True, text=True)
            os.replace(obj + tmp, obj)
        return obj

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        try:
            objs = list(pool.map(compile_one, units))
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"emulator build failed: {' '.join(e.cmd)}\n{e.stderr}") from e
    subprocess.run([cxx, "-o", exe + tmp] + objs + ["-pthread"] + (["-shared"] if shared else []), check=True)
    os.replace(exe + tmp, exe)
    return exe

if __name__ == "__main__":
    import sys
    print(build(sys.argv[1] if len(sys.argv) > 1 else "/tmp/fc_cuda_emu"))
