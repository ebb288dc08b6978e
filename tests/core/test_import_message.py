"""`import fsdpcomp` where a source checkout without its compiled _C shadows a built fsdpcomp:
an ImportError that says what happened and what to do (not Python's "circular import")."""
import os
import shutil
import subprocess
import sys

from helpers.pkg_path import PKG_DIR

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _built_copy(dest):
    """A built fsdpcomp (the one these tests import, _C included) at dest/fsdpcomp."""
    shutil.copytree(PKG_DIR, os.path.join(dest, "fsdpcomp"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert any(n.startswith("_C.") for n in os.listdir(os.path.join(dest, "fsdpcomp")))


def _source_checkout(dest):
    """A checkout as git leaves it: setup.py, csrc/ and the Python sources, nothing built."""
    os.makedirs(os.path.join(dest, "fsdpcomp"))
    shutil.copy(os.path.join(ROOT, "setup.py"), dest)
    shutil.copytree(os.path.join(ROOT, "csrc"), os.path.join(dest, "csrc"))
    for name in os.listdir(PKG_DIR):
        if name.endswith(".py"):
            shutil.copy(os.path.join(PKG_DIR, name), os.path.join(dest, "fsdpcomp"))


def _python(args, cwd, pythonpath):
    env = dict(os.environ, PYTHONPATH=pythonpath)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_checkout_shadowing_a_built_package(tmp_path):
    site, checkout = tmp_path / "site", tmp_path / "checkout"
    _built_copy(str(site))
    _source_checkout(str(checkout))
    # python run in the checkout: its directory comes first on sys.path
    proc = _python(["-c", "import fsdpcomp"], str(checkout), str(site))
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: fsdpcomp was imported from "
                           f"{checkout / 'fsdpcomp'}, a source checkout whose C extension "
                           "(fsdpcomp._C) is not built"), proc.stderr
    assert f"it shadows the fsdpcomp installed in {site / 'fsdpcomp'}" in last
    assert "python -P" in last and f"pip install -e {checkout}" in last
    assert "circular import" not in last
    # what the message advises works: -P leaves the checkout off sys.path
    proc = _python(["-P", "-c", "import fsdpcomp; print(fsdpcomp.__file__); print(fsdpcomp.methods())"],
                   str(checkout), str(site))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == str(site / "fsdpcomp" / "__init__.py")


def test_install_without_extension_says_so(tmp_path):
    """No checkout around, just a package directory whose _C is missing."""
    site = tmp_path / "site"
    _built_copy(str(site))
    for name in os.listdir(site / "fsdpcomp"):
        if name.startswith("_C."):
            os.remove(site / "fsdpcomp" / name)
    proc = _python(["-P", "-c", "import fsdpcomp"], str(tmp_path), str(site))
    assert proc.returncode != 0
    assert (f"ImportError: fsdpcomp in {site / 'fsdpcomp'} has no compiled extension (fsdpcomp._C): "
            "the install is incomplete") in proc.stderr
