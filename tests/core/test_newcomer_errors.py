"""What a newcomer meets in the second hour (issue 31): torch declared where pip sees it and named
when it is missing, one method list in every message, register refusing what is not a model by
type, and the config aliases (num_bits) in every list of valid keys."""
import argparse
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

import fsdpcomp
from fsdpcomp._version import TORCH_SUPPORTED
from helpers.pkg_path import PKG_DIR

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- torch: declared, and named when missing

def _torch_requirement() -> Requirement:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11 (the tests' 3.11; fsdpcomp runs on 3.10)
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    torch_reqs = [Requirement(d) for d in deps if Requirement(d).name == "torch"]
    assert len(torch_reqs) == 1, deps
    return torch_reqs[0]


def test_pyproject_requires_the_torch_the_tests_cover():
    spec = _torch_requirement().specifier
    assert spec == SpecifierSet(TORCH_SUPPORTED)  # what the ImportError names
    assert spec.contains(torch.__version__, prereleases=True), (str(spec), torch.__version__)
    # the GPU runs' torch, and the oldest the code supports (FSDP2's custom collectives: 2.9)
    assert spec.contains("2.11.0") and spec.contains("2.9.0"), str(spec)
    assert not spec.contains("2.8.0"), str(spec)


def test_import_without_torch_says_what_to_install(tmp_path):
    """A virtual environment of its own (no system site-packages, so no torch) with a built
    fsdpcomp on PYTHONPATH: `import fsdpcomp` names torch and the command that installs it."""
    venv, site = tmp_path / "venv", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    shutil.copytree(PKG_DIR, site / "fsdpcomp", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = str(site)
    py = str(venv / "bin" / "python")
    probe = "import importlib.util; print(importlib.util.find_spec('torch'))"
    assert subprocess.run([py, "-c", probe], capture_output=True, text=True, env=env,
                          timeout=120).stdout.strip() == "None"
    proc = subprocess.run([py, "-P", "-c", "import fsdpcomp"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    want = f"torch{TORCH_SUPPORTED}"
    assert last.startswith(f"ModuleNotFoundError: fsdpcomp needs PyTorch ({want}), which this Python "
                           f"({py}) cannot import"), proc.stderr
    assert f'pip install "{want}" --index-url https://download.pytorch.org/whl/cpu' in last, last
    assert "the CUDA build for your machine" in last and "https://pytorch.org/get-started/locally/" in last
    # an ImportError too, so code that tries `import fsdpcomp` and falls back still catches it
    proc = subprocess.run([py, "-P", "-c", "try:\n import fsdpcomp\nexcept ImportError as e:\n print(e.name)"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "torch", proc.stdout + proc.stderr


# ---- one method list

def _listed(message: str, what: str) -> list[str]:
    m = re.search(rf"; valid {what}: (.*)$", message)
    assert m, message
    return [s.strip().strip("'") for s in m.group(1).split(", ")]


@pytest.mark.parametrize("call", [lambda: fsdpcomp.CommState("int9", {}),
                                  lambda: fsdpcomp.method_info("int9"),
                                  lambda: fsdpcomp.register(torch.nn.Linear(2, 2), "int9")],
                         ids=["CommState", "method_info", "register"])
def test_unknown_method_lists_exactly_methods(call):
    with pytest.raises(ValueError, match=r"^unknown compression method 'int9' \(did you mean 'int8'\?\); valid methods: ") as e:
        call()
    assert _listed(str(e.value), "methods") == fsdpcomp.methods()
    assert "powersgd" in fsdpcomp.methods()


def test_command_line_choices_are_methods():
    parser = fsdpcomp.add_argparse_args(argparse.ArgumentParser())
    action = next(a for a in parser._actions if a.dest == "comm_compress")
    assert list(action.choices) == fsdpcomp.methods()


# ---- register: what is not a model is a TypeError

def test_register_refuses_a_non_module_by_type():
    with pytest.raises(TypeError) as e:
        fsdpcomp.register(object(), "int8")
    text = str(e.value)
    assert "got object" in text, text
    for wanted in ("torch.nn.Module", "FullyShardedDataParallel", "fully_shard", "DistributedDataParallel"):
        assert wanted in text, text


def test_register_replicate_refuses_a_non_module_by_type():
    with pytest.raises(TypeError, match=r"register_replicate's model must be a torch\.nn\.Module .*got dict"):
        fsdpcomp.register_replicate({}, fsdpcomp.CommState("int8"))


def test_register_of_a_plain_module_is_still_a_type_error():
    with pytest.raises(TypeError, match=r"does not know how to attach to Linear"):
        fsdpcomp.register(torch.nn.Linear(2, 2), "int8")


# ---- aliases (num_bits) in every list of valid keys

def _aliases(method: str) -> list[str]:
    return [a["name"] for a in fsdpcomp.method_info(method)["aliases"]]


@pytest.mark.parametrize("method", ["int8", "intN"])
def test_unknown_key_lists_num_bits(method):
    with pytest.raises(ValueError, match=rf"^unknown config key 'num_bitz' for method '{method}' \(did you mean 'num_bits'\?\); valid keys: ") as e:
        fsdpcomp.CommState(method, {"num_bitz": 8})
    assert "num_bits" in _listed(str(e.value), "keys")
    assert _aliases(method) == ["num_bits"]


def test_method_info_describes_num_bits():
    (int8,) = fsdpcomp.method_info("int8")["aliases"]
    assert (int8["name"], int8["same_as"], int8["min"], int8["max"]) == ("num_bits", None, 8, 8)
    (intn,) = fsdpcomp.method_info("intN")["aliases"]
    assert (intn["name"], intn["same_as"], intn["min"], intn["max"]) == ("num_bits", "bits", 2, 4)
    assert "the same as 'bits'" in intn["doc"] and "width" in int8["doc"]


@pytest.mark.parametrize("method", fsdpcomp.methods())
def test_valid_keys_are_method_info(method):
    """The message's list is method_info's: the method's keys, its aliases, the common keys (and
    no alias a method refuses: topk's list has no num_bits)."""
    info = fsdpcomp.method_info(method)
    with pytest.raises(ValueError, match=r"unknown config key 'zz'") as e:
        fsdpcomp.CommState(method, {"zz": 1})
    want = [k["name"] for k in info["keys"] + info["aliases"] + info["common_keys"]]
    assert _listed(str(e.value), "keys") == want
    if method not in ("int8", "intN"):
        assert info["aliases"] == [] and "num_bits" not in want


# ---- the mistakes a newcomer typed (issue 38): each refusal points at what was meant

@pytest.mark.parametrize("method,config,meant", [
    ("PowerSGD", {}, "powersgd"),              # case
    ("Top-K", {}, "topk"),                     # case and a dash
    ("topk", {"top_k": 3}, "k"),               # a '_'-joined prefix
    ("int8", {"error_feeback": True}, "error_feedback"),  # a letter dropped
    ("int8", {"blocksize": 256}, "block_size"),            # an underscore dropped
    ("powersgd", {"rnak": 2}, "rank"),         # two letters swapped (powersgd's keys: Python's check)
])
def test_an_unknown_name_suggests_the_one_meant(method, config, meant):
    with pytest.raises(ValueError, match=rf"\(did you mean '{meant}'\?\); valid (methods|keys): "):
        fsdpcomp.CommState(method, config)


@pytest.mark.parametrize("method,config", [("int8", {"zzz": 1}), ("qqq", {}), ("topk", {"x": 1})])
def test_a_name_near_nothing_suggests_nothing(method, config):
    with pytest.raises(ValueError, match=r"unknown .*; valid (methods|keys): ") as e:
        fsdpcomp.CommState(method, config)
    assert "did you mean" not in str(e.value)


@pytest.mark.parametrize("method", ["topk", "randomk"])
def test_a_fraction_for_k_points_at_ratio(method):
    with pytest.raises(ValueError, match=r"'k' must be an integer, got float; for a fraction of the "
                                         r"elements use 'ratio' \(e\.g\. \{\"ratio\": 0\.01\}\)"):
        fsdpcomp.CommState(method, {"k": 0.01})


def test_near_name_rules():
    near = fsdpcomp._C.near_name
    assert near("rank", ["rank", "ranks"]) == "rank"        # exact beats near
    assert near("x", ["k"]) is None                         # one letter off a one-letter name: no
    assert near("seeds", ["seed", "step"]) == "seed"
    assert near("", ["k"]) is None
    with pytest.raises(TypeError, match="sequence of str"):
        near("k", [1])
