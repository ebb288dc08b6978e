"""Build here, run there: what a GPU run needs, built on a machine without a GPU (nvcc is enough),
carried to the GPU machine in one git-ignored folder, and checked there before any check runs.
A GPU window is short (about 15 minutes, its start included): it should compile nothing.

    python tests/gpu/prepare.py build [--archs 90] [--dir .gpu] [--no-wheels]   # here
    python tests/gpu/prepare.py verify [--dir .gpu] [--emulated]                 # there

`bash tests/gpu/run.sh prepare` runs `build`; run.sh runs `verify` itself whenever DIR holds a
manifest. The folder (a few MiB of the 64 the device tool carries):

    lib/_C.abi3.so, lib/_fsdpcomp_cuda.so   the C extension (stable ABI: any CPython >= 3.10)
                                            and the CUDA library for sm_ARCH + PTX of the last
    whl/                                    wheels the GPU image lacks, for its CPython 3.12
    manifest.json                           FC_CUDA_ABI, archs, nvcc, each source file's hash

`build` compiles in a scratch copy of the sources (build/gpu_prepare/, kept: a second build
recompiles only what changed), so the checkout's own in-place build is left alone.

`verify` refuses, by name and before anything else runs: a CUDA library that does not answer
this checkout's FC_CUDA_ABI, one with no code for this GPU's arch, libraries built from other
sources than the checkout's (csrc/, cuda/, setup.py), a _C that does not import. Then it puts
the libraries into fsdpcomp/ and the wheels into DIR/site, which run.sh adds to PYTHONPATH.
"""
from __future__ import annotations

import argparse
import ctypes
import filecmp
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: helpers
from helpers.fatbin import fatbin_entries  # noqa: E402
LIBS = ("_C.abi3.so", "_fsdpcomp_cuda.so")
# what the GPU image lacks of what the checks import (its package list: the device tool's
# KINDS.md): examples/textdata.py streams JSON with ijson
WHEELS = ("ijson",)
GPU_PYTHON = "3.12"
CARRY_LIMIT = 60 << 20  # the device tool carries 64 MiB of working tree in all


class Refused(Exception):
    """The carried folder cannot serve this checkout or this GPU (the message says why)."""


def compiled_sources(root: str) -> list[str]:
    """What the libraries are compiled from, relative to root: a change to any of them makes a
    carried build stale."""
    files = ["setup.py"] + sorted(glob.glob("csrc/*/*.[ch]", root_dir=root)) + \
        sorted(glob.glob("cuda/*.cu", root_dir=root)) + sorted(glob.glob("cuda/*.cuh", root_dir=root)) + \
        sorted(glob.glob("cuda/*.h", root_dir=root))
    return files


def source_hashes(root: str) -> dict[str, str]:
    out = {}
    for rel in compiled_sources(root):
        with open(os.path.join(root, rel), "rb") as f:
            out[rel] = hashlib.sha256(f.read()).hexdigest()
    return out


def cuda_abi(root: str) -> int:
    with open(os.path.join(root, "csrc", "backend_cuda", "fc_cuda.h")) as f:
        m = re.search(r"#define FC_CUDA_ABI (\d+)", f.read())
    if not m:
        raise Refused("FC_CUDA_ABI not found in csrc/backend_cuda/fc_cuda.h")
    return int(m.group(1))


# ---- build (the machine without a GPU)

def _sync_tree(dst: str) -> None:
    """dst mirrors what setup.py builds from; files whose bytes did not change keep their
    mtime, so setup.py's build recompiles only what changed."""
    wanted = set(compiled_sources(ROOT)) | {"pyproject.toml", "README.md", "MANIFEST.in"}
    wanted |= {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "fsdpcomp", "**", "*.py"),
                                                             recursive=True)}
    for rel in sorted(wanted):
        src, out = os.path.join(ROOT, rel), os.path.join(dst, rel)
        if not os.path.exists(src):
            continue
        os.makedirs(os.path.dirname(out), exist_ok=True)
        if not (os.path.exists(out) and filecmp.cmp(src, out, shallow=False)):
            shutil.copy2(src, out)
    for d in ("csrc", "cuda"):  # a source removed here goes there too (setup.py globs them)
        for p in glob.glob(os.path.join(dst, d, "**"), recursive=True):
            if os.path.isfile(p) and os.path.relpath(p, dst) not in wanted:
                os.remove(p)


def _nvcc_version() -> str:
    for nvcc in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if nvcc and os.path.exists(nvcc):
            r = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
            return r.stdout.strip().splitlines()[-1] if r.returncode == 0 else "unknown"
    return ""


def git_commit(root: str) -> str | None:
    """The checkout's commit (12 hex digits, "+changes" when tracked files differ from it): the
    GPU machine gets a copy of the tree without .git, so the results name their commit from here."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=30)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+changes" if dirty else "")


def build(out_dir: str, archs: str, scratch: str, wheels: bool) -> dict:
    if not _nvcc_version():
        raise SystemExit("prepare: nvcc not found (NVCC, PATH, /usr/local/cuda/bin): the CUDA library "
                         "is built here, so this machine needs CUDA's compiler (no GPU)")
    t0 = time.time()
    os.makedirs(scratch, exist_ok=True)
    _sync_tree(scratch)
    env = dict(os.environ, FSDPCOMP_CUDA="1", FSDPCOMP_CUDA_ARCHS=archs)
    print(f"prepare: building in {scratch} for sm_{archs.replace(';', ',sm_')} (+ PTX)", flush=True)
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=scratch, env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout[-6000:], r.stderr[-6000:], sep="\n")
        raise SystemExit(f"prepare: the build failed (exit {r.returncode})")
    lib_dir = os.path.join(out_dir, "lib")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(lib_dir)
    for name in LIBS:
        shutil.copy2(os.path.join(scratch, "fsdpcomp", name), os.path.join(lib_dir, name))
    got = []
    if wheels:
        whl = os.path.join(out_dir, "whl")
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", GPU_PYTHON, "--implementation", "cp", "-d", whl]
        for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"):
            cmd += ["--platform", p]
        r = subprocess.run(cmd + list(WHEELS), capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"prepare: could not fetch {', '.join(WHEELS)} for CPython {GPU_PYTHON} "
                             f"(--no-wheels leaves them out: the example's check then fails there):\n"
                             + r.stderr[-2000:])
        got = sorted(os.listdir(whl))
    manifest = {"fc_cuda_abi": cuda_abi(ROOT), "archs": archs.split(";"), "ptx": archs.split(";")[-1],
                "nvcc": _nvcc_version(), "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "built_with_python": sys.version.split()[0], "wheels": got, "commit": git_commit(ROOT),
                "sources": source_hashes(ROOT)}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    size = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(out_dir) for n in ns)
    if size > CARRY_LIMIT:
        raise SystemExit(f"prepare: {out_dir} holds {size >> 20} MiB, over the {CARRY_LIMIT >> 20} MiB "
                         "the device tool carries")
    print(f"prepare: {out_dir} ready ({size / 2**20:.1f} MiB, {time.time() - t0:.0f} s): "
          f"libs {', '.join(LIBS)}, wheels {', '.join(got) or 'none'}, FC_CUDA_ABI {manifest['fc_cuda_abi']}")
    rel = os.path.relpath(out_dir, ROOT)
    print(f"prepare: on the GPU machine carry [\"{rel}\"] and run: bash tests/gpu/run.sh quick  "
          "(tests/gpu/README.md)")
    return manifest


# ---- verify (the GPU machine; emulated: CI)

def carried_archs(lib: str) -> tuple[list[str], list[str]]:
    """(archs with machine code, archs with PTX) of lib, read from its fat binaries."""
    entries = fatbin_entries(lib)
    return (sorted({str(a) for k, a in entries if k == "elf"}), sorted({str(a) for k, a in entries if k == "ptx"}))


def _check_arch(sm: list[str], ptx: list[str]) -> dict:
    """This GPU runs the library: machine code for its arch, or PTX of an arch no newer (which
    the driver compiles at load)."""
    import torch
    if not torch.cuda.is_available():
        raise Refused("no GPU torch can see: the carried libraries cannot be checked against one")
    cc = "%d%d" % torch.cuda.get_device_capability(0)
    if cc not in sm and not any(int(p) <= int(cc) for p in ptx):
        raise Refused(f"the carried _fsdpcomp_cuda.so has code for sm_{', sm_'.join(sm) or '(none)'} and PTX of "
                      f"{', '.join(ptx) or 'none'}; this GPU ({torch.cuda.get_device_name(0)}) is sm_{cc}: "
                      f"prepare again with --archs {cc}")
    return {"gpu_arch": cc, "jit_from_ptx": cc not in sm}


def verify(dir_: str, emulated: bool) -> dict:
    path = os.path.join(dir_, "manifest.json")
    if not os.path.exists(path):
        raise Refused(f"no {path}: run `bash tests/gpu/run.sh prepare` where nvcc is, and carry its folder")
    with open(path) as f:
        manifest = json.load(f)
    lib_dir = os.path.join(dir_, "lib")
    missing = [n for n in LIBS if not os.path.exists(os.path.join(lib_dir, n))]
    if missing:
        raise Refused(f"the carried folder lacks lib/{', lib/'.join(missing)}: prepare again")
    # 1. the ABI the library answers (no GPU needed: the table is plain data)
    abi = cuda_abi(ROOT)
    cuda_lib = os.path.join(lib_dir, "_fsdpcomp_cuda.so")
    get = ctypes.CDLL(cuda_lib).fc_cuda_get_api
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.c_int]
    if get(abi) is None:
        raise Refused(f"the carried _fsdpcomp_cuda.so answers no FC_CUDA_ABI {abi} (this checkout's); "
                      f"it was built at ABI {manifest.get('fc_cuda_abi')}: prepare again")
    detail = {"fc_cuda_abi": abi, "manifest": {k: v for k, v in manifest.items() if k != "sources"}}
    # 2. the code it carries, and this GPU's arch
    sm, ptx = carried_archs(cuda_lib)
    if sm != sorted(manifest["archs"]) or ptx != [manifest["ptx"]]:
        raise Refused(f"the carried _fsdpcomp_cuda.so holds code for sm {sm} and PTX {ptx}, not the "
                      f"manifest's {manifest['archs']} + PTX {manifest['ptx']}: prepare again")
    detail["sm"], detail["ptx"] = sm, ptx
    if not emulated:
        detail.update(_check_arch(sm, ptx))
    # 3. the sources they were built from
    now, then = source_hashes(ROOT), manifest.get("sources", {})
    changed = sorted(k for k in set(now) | set(then) if now.get(k) != then.get(k))
    if changed:
        shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
        raise Refused(f"the carried libraries were built from other sources: {shown} differ from this "
                      "checkout's: prepare again and carry the new folder")
    # 4. install: the libraries in place (a version-tagged _C would win over _C.abi3.so), wheels
    pkg = os.path.join(ROOT, "fsdpcomp")
    for old in glob.glob(os.path.join(pkg, "_C.*.so")):
        os.remove(old)
    for n in LIBS:
        shutil.copy2(os.path.join(lib_dir, n), os.path.join(pkg, n))
    site = os.path.join(dir_, "site")
    wheels = sorted(glob.glob(os.path.join(dir_, "whl", "*.whl")))
    if wheels:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                            "--no-compile", "--no-cache-dir", "--upgrade", "--target", site] + wheels,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise Refused(f"the carried wheels do not install here: {r.stderr.strip()[-600:]}")
    detail["site"] = site if wheels else None
    # 5. _C imports here and, on a GPU, loads the CUDA library
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, site, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", "import json, fsdpcomp._C as C; print(json.dumps(C.cuda_info()))"],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        raise Refused(f"the carried _C.abi3.so does not import with {sys.executable}: {r.stderr.strip()[-600:]}")
    info = json.loads(r.stdout.strip().splitlines()[-1])
    if not emulated and not info.get("available"):
        raise Refused(f"_C cannot use the carried CUDA library on this machine: {info.get('error')}")
    detail["cuda_info"] = info
    return detail


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("verb", choices=("build", "verify"))
    ap.add_argument("--dir", default=os.path.join(ROOT, ".gpu"), help="the carried folder")
    # not FSDPCOMP_CUDA_ARCHS: CI sets that for the release wheel's full list, and a GPU window
    # wants one arch (a minute of nvcc, not eight)
    ap.add_argument("--archs", default="90", help="CUDA archs, e.g. 90 (H100, H200) or '80;90'; PTX of the last is added")
    ap.add_argument("--scratch", default=os.path.join(ROOT, "build", "gpu_prepare"),
                    help="where build compiles (kept between builds)")
    ap.add_argument("--no-wheels", action="store_true", help="build: fetch no wheels (no network)")
    ap.add_argument("--emulated", action="store_true", help="verify: no GPU (CI): the arch is not checked")
    ap.add_argument("--json", default=None, help="verify: write what it found here")
    args = ap.parse_args(argv)
    if args.verb == "build":
        build(os.path.abspath(args.dir), args.archs, os.path.abspath(args.scratch), not args.no_wheels)
        return 0
    try:
        detail = verify(os.path.abspath(args.dir), args.emulated)
    except Refused as e:
        detail = {"refused": str(e)}
        print(f"REFUSED: {e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(detail, f, indent=1)
    if "refused" in detail:
        return 3
    print("carried libraries verified: " + json.dumps({k: v for k, v in detail.items() if k != "manifest"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
