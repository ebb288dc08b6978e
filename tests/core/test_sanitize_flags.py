"""The sanitizer build sees signed overflow: Python's CFLAGS carry -fwrapv, which
makes signed overflow defined (it wraps) and so invisible to UBSan; setup.py's sanitizer flags
come after Python's and turn it back off. Checked by building a three-line program the way
setuptools builds fsdpcomp._C and running it."""
import os
import shutil
import subprocess
import sysconfig

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sanitizer_flags():
    """setup.py's c_flags() with FSDPCOMP_SANITIZE=1 (the file up to its setup() call)."""
    path = os.path.join(ROOT, "setup.py")
    src = open(path).read().split("\next = Extension(")[0]
    ns = {"__file__": path, "__name__": "fsdpcomp_setup_flags"}
    exec(compile(src, path, "exec"), ns)
    old = os.environ.get("FSDPCOMP_SANITIZE")
    os.environ["FSDPCOMP_SANITIZE"] = "1"
    try:
        return ns["c_flags"]()
    finally:
        if old is None:
            os.environ.pop("FSDPCOMP_SANITIZE")
        else:
            os.environ["FSDPCOMP_SANITIZE"] = old


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_sanitizer_build_reports_signed_overflow(tmp_path):
    flags = sanitizer_flags()
    assert "-fno-wrapv" in flags
    src = tmp_path / "overflow.c"
    src.write_text("#include <limits.h>\n#include <stdlib.h>\n"
                   "int main(int c, char **v) { (void)v; int x = INT_MAX - 1 + c; "
                   "return x + (int)strtol(\"2\", 0, 10) > 0; }\n")
    exe = tmp_path / "overflow"
    python_cflags = sysconfig.get_config_var("CFLAGS").split()  # what setuptools puts first
    subprocess.run(["gcc", *python_cflags, *[f for f in flags if f != "-Werror"], str(src), "-o",
                    str(exe), "-fsanitize=address,undefined"], check=True, capture_output=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True,
                         env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
    assert "signed integer overflow" in run.stderr, run.stderr
