"""docs/methods.md's table is generated from method_info(): it must match the code."""
import importlib.util
import os

import fsdpcomp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_methods_table", os.path.join(ROOT, "docs", "gen_methods_table.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_methods_table_is_up_to_date():
    gen = load_generator()
    with open(gen.DOC) as f:
        text = f.read()
    assert gen.render(text) == text, "run: PYTHONPATH=. python docs/gen_methods_table.py"


def test_every_method_is_in_the_table_with_its_properties():
    with open(os.path.join(ROOT, "docs", "methods.md")) as f:
        text = f.read()
    for m in fsdpcomp.methods():
        info = fsdpcomp.method_info(m)
        line = next(l for l in text.splitlines() if l.startswith(f"| `{m}` |"))
        assert ("unbiased" if info["unbiased"] else "biased") in line
        assert ("| " + ("-" if info["id"] is None else str(info["id"])) + " |") in line
