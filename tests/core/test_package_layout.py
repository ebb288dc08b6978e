"""The shape of fsdpcomp/ a reader relies on: no import cycle (every import, at any depth), the
integrations import the state and their shared checks but never each other, no module over 400
lines, and at most five reaches into another object's private members, each with a comment
saying why (torch's, where it has no public accessor)."""
import ast
import os
import re

import pytest

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "fsdpcomp")
# obj._member where obj is neither self/cls nor a module (torch._C, dist.distributed_c10d, ...)
REACH = re.compile(r"\b(?!self\b|cls\b|torch\b|_C\b|_?distributed_c10d\b|Variable\b|fsdp\b|os\b)"
                   r"[A-Za-z_]\w*(\(\))?\._[a-z]\w*")


def _modules():
    # the compiled modules are known by name: a fresh checkout (CI imports the installed package)
    # has no .so beside the sources, and `from . import _C` must not read as the package itself
    mods, ext = {}, {"fsdpcomp._C", "fsdpcomp._fsdpcomp_cuda"}
    for d, _, files in os.walk(PKG):
        rel = os.path.relpath(d, os.path.dirname(PKG)).split(os.sep)
        for f in files:
            if f.endswith(".so"):
                ext.add(".".join(rel + [f.split(".")[0]]))
            elif f.endswith(".py"):
                name = rel if f == "__init__.py" else rel + [f[:-3]]
                mods[".".join(name)] = os.path.join(d, f)
    return mods, ext


def _graph():
    mods, ext = _modules()
    graph = {m: set() for m in mods}
    for m, path in mods.items():
        pkg = m if path.endswith("__init__.py") else m.rpartition(".")[0]
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in node.names]
                targets = [t for t in subs if t in mods or t in ext]
                if len(targets) < len(subs):  # `from pkg import name`: the package itself
                    targets.append(base)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[m].update(t for t in targets if t in mods and t != m)
    return graph


def test_no_import_cycle():
    graph = _graph()
    assert "fsdpcomp.state" in graph and "fsdpcomp.integrations.fsdp2" in graph
    cycles, seen, stack = [], {}, []

    def visit(m):
        seen[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if seen.get(n) == 1:
                cycles.append(" -> ".join(stack[stack.index(n):] + [n]))
            elif n not in seen:
                visit(n)
        stack.pop()
        seen[m] = 2

    for m in sorted(graph):
        if m not in seen:
            visit(m)
    assert not cycles, cycles


def test_integrations_do_not_import_each_other():
    graph = _graph()
    # _layout: each integration describes its parameters' layout with its Layout type
    allowed = {"fsdpcomp.state", "fsdpcomp._dist", "fsdpcomp.integrations._checks", "fsdpcomp._layout"}
    for name in ("fsdp1", "fsdp2", "ddp"):
        mod = f"fsdpcomp.integrations.{name}"
        assert graph[mod] <= allowed, f"{mod} imports {sorted(graph[mod] - allowed)}"


@pytest.mark.parametrize("path", sorted(_modules()[0].values()), ids=lambda p: os.path.relpath(p, PKG))
def test_module_is_at_most_400_lines(path):
    with open(path, encoding="utf-8") as f:
        assert len(f.readlines()) <= 400


def test_private_reaches_are_few_and_commented():
    reaches = []
    for path in sorted(_modules()[0].values()):
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            code = line.split("#", 1)[0]
            if line.lstrip().startswith(("from ", "import ")) or not REACH.search(code):
                continue
            commented = "#" in line or (i > 0 and lines[i - 1].lstrip().startswith("#"))
            reaches.append((os.path.relpath(path, PKG), i + 1, line.strip(), commented))
    # 6: FSDP1's per-parameter layout (powersgd's matrices) is only in FlatParameter's members;
    # 8: what C++ still holds of a collective's tensors (_dist.py's settled collectives)
    assert len(reaches) <= 8, reaches
    assert all(r[3] for r in reaches), [r for r in reaches if not r[3]]


def test_state_and_integrations_name_no_method():
    """What differs between methods is its Reducer's (_reducer.py): CommState and the
    integrations never ask which method they drive; _methods.py alone maps names to reducers."""
    paths = [os.path.join(PKG, "state.py")] + [os.path.join(PKG, "integrations", f)
                                               for f in os.listdir(os.path.join(PKG, "integrations"))
                                               if f.endswith(".py")]
    for path in paths:
        with open(path, encoding="utf-8") as f:
            assert "powersgd" not in f.read(), path  # torch's own "PowerSGD" hook may be cited


def test_no_module_level_table_of_instances():
    """Per-instance state lives in its instance (a state's hook memos, a ShardGather's device
    verdicts), where it dies with it; _agree.py's per-process-group table is the one exception:
    what a group settled holds for every state on it."""
    for path in sorted(_modules()[0].values()):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if "WeakKeyDictionary" in text:
            assert path.endswith("_agree.py"), path


def test_test_files_have_unique_basenames():
    """pytest imports test files by basename (no __init__.py in tests/): two files of one name in
    different folders stop the whole run at collection."""
    import collections
    import pathlib
    names = collections.Counter(p.name for p in pathlib.Path(__file__).parents[1].rglob("test_*.py"))
    assert not [n for n, c in names.items() if c > 1], names.most_common(3)
