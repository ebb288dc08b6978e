"""Build of fsdpcomp: the C extension fsdpcomp._C always; the CUDA library from cuda/*.cu when
nvcc is found (FSDPCOMP_CUDA=auto|0|1). Prints a summary of what was built and why.

_C is built on CPython's stable ABI (Py_LIMITED_API 3.10: _C.abi3.so), so one wheel,
cp310-abi3, serves every CPython >= 3.10 (`python -m build`, then auditwheel: docs/wheel.md).

Environment:
  FSDPCOMP_CUDA       auto (default): build CUDA if nvcc is found; 0: never; 1: required
  FSDPCOMP_CUDA_ARCHS e.g. "80;90;100" (default below), PTX is added for the newest
  NVCC, CUDA_HOME     where nvcc is looked for, before PATH
  FSDPCOMP_DEBUG=1    -O0 -g;  FSDPCOMP_SANITIZE=1  ASan + UBSan on the C code
  FSDPCOMP_NATIVE=1   -march=native for the CPU kernels (not for wheels you ship)
  FSDPCOMP_WERROR=0   warnings stay warnings (another compiler than CI's, e.g. a GPU machine's)
"""
import glob
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
# The oldest CPython whose stable ABI _C is built against: the wheel's cp310-abi3 tag.
LIMITED_API = 0x030A0000
# The architectures torch's own CUDA 13 wheels target; PTX of the last one runs on newer GPUs.
DEFAULT_ARCHS = "75;80;86;90;100;120"


def env_flag(name, default="0"):
    return os.environ.get(name, default).strip().lower() in ("1", "true", "yes", "on")


def c_flags():
    flags = ["-std=c11", "-Wall", "-Wextra", "-fvisibility=hidden",
             # One rounding per operation, no FMA contraction: CPU and CUDA bytes must agree.
             "-ffp-contract=off", "-fno-math-errno"]
    if env_flag("FSDPCOMP_WERROR", "1"):
        flags += ["-Werror"]
    if env_flag("FSDPCOMP_DEBUG"):
        flags += ["-O0", "-g3"]
    else:
        flags += ["-O3"]
    if env_flag("FSDPCOMP_NATIVE"):
        flags += ["-march=native"]
    if env_flag("FSDPCOMP_SANITIZE"):
        # -fno-wrapv: Python's CFLAGS carry -fwrapv, which defines signed overflow as wrapping
        # and so hides it from UBSan; ours come after Python's and win
        flags += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g", "-fno-wrapv"]
    return flags


def find_nvcc():
    for cand in (os.environ.get("NVCC"),
                 os.path.join(os.environ.get("CUDA_HOME", ""), "bin", "nvcc") if os.environ.get("CUDA_HOME") else None,
                 shutil.which("nvcc"),
                 "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def build_jobs(n: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(n, cores))


def parallel_compile(self, sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                     extra_preargs=None, extra_postargs=None, depends=None):
    """CCompiler.compile with the objects built side by side (bound to BuildExt's compiler)."""
    macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs)
    cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)

    def one(obj):
        if obj in build:  # _setup_compile leaves out the objects that are up to date
            src, ext = build[obj]
            self._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

    with ThreadPoolExecutor(max_workers=build_jobs(len(objects))) as pool:
        list(pool.map(one, objects))
    return objects


class BuildExt(build_ext):
    """Builds _C with the flags above, then the CUDA library when asked for and possible."""

    summary = []

    def run(self):
        # setuptools builds into build_lib with inplace cleared, then copies the extensions;
        # the CUDA library is no Extension, so remember where it has to go.
        self.fc_inplace = bool(self.inplace)
        # An earlier build's _C.cpython-3XY-*.so would win over _C.abi3.so (Python tries the
        # version-tagged suffix first) in place, and ride along in a wheel from build_lib: it goes.
        keep = os.path.basename(self.get_ext_filename("fsdpcomp._C"))
        for d in (os.path.join(HERE, "fsdpcomp"), os.path.join(self.build_lib, "fsdpcomp")):
            for old in glob.glob(os.path.join(d, "_C.*.so")):
                if os.path.basename(old) != keep:
                    os.remove(old)
        super().run()

    def build_extensions(self):
        # _C is one extension of ~50 files, which setuptools compiles one after another: they go
        # in parallel, one per core (the same compile and the same objects, in a thread pool)
        self.compiler.compile = parallel_compile.__get__(self.compiler)
        for ext in self.extensions:
            ext.extra_compile_args = c_flags()
            if env_flag("FSDPCOMP_SANITIZE"):
                ext.extra_link_args = ["-fsanitize=address,undefined"]
        super().build_extensions()
        BuildExt.summary.append("fsdpcomp._C: built %s (C, stable ABI of CPython >= %d.%d, %s)"
                                % (os.path.basename(self.get_ext_filename("fsdpcomp._C")), LIMITED_API >> 24,
                                   (LIMITED_API >> 16) & 0xFF, " ".join(c_flags())))
        self.build_cuda()
        print("\n==== fsdpcomp build summary ====")
        for line in BuildExt.summary:
            print("  " + line)
        print("================================\n")

    def build_cuda(self):
        mode = os.environ.get("FSDPCOMP_CUDA", "auto").strip().lower()
        sources = sorted(glob.glob(os.path.join(HERE, "cuda", "*.cu")))
        if mode in ("0", "off", "no", "false"):
            BuildExt.summary.append("CUDA: skipped (FSDPCOMP_CUDA=0)")
            return
        nvcc = find_nvcc()
        if nvcc is None or not sources:
            why = "nvcc not found (NVCC, CUDA_HOME, PATH)" if nvcc is None else "no cuda/*.cu sources"
            if mode in ("1", "on", "yes", "true"):
                raise RuntimeError("FSDPCOMP_CUDA=1 but " + why)
            BuildExt.summary.append("CUDA: skipped, " + why + "; the CPU path is complete without it")
            return
        archs = [a.strip() for a in (os.environ.get("FSDPCOMP_CUDA_ARCHS") or DEFAULT_ARCHS).replace(",", ";").split(";")
                 if a.strip()] or DEFAULT_ARCHS.split(";")
        gencode = []
        for a in archs:
            gencode.append("-gencode=arch=compute_%s,code=sm_%s" % (a, a))
        gencode.append("-gencode=arch=compute_%s,code=compute_%s" % (archs[-1], archs[-1]))
        out_dir = os.path.join(self.build_lib, "fsdpcomp")
        if self.inplace or getattr(self, "fc_inplace", False):
            out_dir = os.path.join(HERE, "fsdpcomp")
        os.makedirs(out_dir, exist_ok=True)
        obj_dir = os.path.join(self.build_temp, "cuda")
        os.makedirs(obj_dir, exist_ok=True)
        incs = ["-I" + os.path.join(HERE, "csrc"), "-I" + os.path.join(HERE, "cuda")]
        defs = ['-DFC_CUDA_BUILD_INFO="archs %s"' % ",".join(archs)]
        # --fmad=false: no FMA contraction, so decoded values match the CPU reference bit for bit.
        flags = ["-O3", "-std=c++17", "--fmad=false", "-Xcompiler", "-fPIC,-Wall,-fvisibility=hidden"]
        flags += (["-Werror", "all-warnings"] if env_flag("FSDPCOMP_WERROR", "1") else []) + gencode + incs + defs
        if env_flag("FSDPCOMP_DEBUG"):
            flags += ["-G", "-g"]
        objs = [os.path.join(obj_dir, os.path.basename(src) + ".o") for src in sources]
        # nvcc compiles one file at a time (every arch in turn): the files go in parallel, one
        # per core, each job's output printed whole when it ends so errors read in one piece
        jobs = build_jobs(len(sources))

        def compile_one(src_obj):
            src, obj = src_obj
            cmd = [nvcc, "-c", src, "-o", obj] + flags
            r = subprocess.run(cmd, capture_output=True, text=True)
            print(" ".join(cmd) + ("\n" + r.stdout + r.stderr if r.stdout or r.stderr else ""), flush=True)
            if r.returncode != 0:
                raise RuntimeError("nvcc failed (exit %d) on %s:\n%s%s" % (r.returncode, src, r.stdout, r.stderr))

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(compile_one, zip(sources, objs)))
        lib = os.path.join(out_dir, "_fsdpcomp_cuda.so")
        # cudart static: no libcudart.so to find at load time
        cmd = [nvcc, "-shared", "-o", lib] + objs + gencode + ["-cudart", "static", "-ldl", "-lpthread"]
        print(" ".join(cmd))
        subprocess.check_call(cmd)
        BuildExt.summary.append(
            "CUDA: built %s (nvcc %s, archs %s + PTX %s, %d files on %d jobs)"
            % (os.path.relpath(lib, HERE) if lib.startswith(HERE) else lib, nvcc, ",".join(archs), archs[-1],
               len(sources), jobs))


ext = Extension(
    "fsdpcomp._C",
    sources=sorted(glob.glob(os.path.join("csrc", "*", "*.c"))),  # csrc/<layer>/: docs/design.md
    include_dirs=["csrc"],
    depends=sorted(glob.glob(os.path.join("csrc", "*", "*.h"))),
    libraries=["dl", "pthread"],  # dlopen of the CUDA library; a no-op on glibc >= 2.34
    define_macros=[("Py_LIMITED_API", "0x%08X" % LIMITED_API)],
    py_limited_api=True,
)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildExt},
      options={"bdist_wheel": {"py_limited_api": "cp%d%d" % (LIMITED_API >> 24, (LIMITED_API >> 16) & 0xFF)}})
