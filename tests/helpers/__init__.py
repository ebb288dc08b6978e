"""What the tests share beyond conftest.py's fixtures: method configurations (method_cases,
cuda_cases), ranks on gloo (dist_utils), small models (tiny_models, step_models), training runs of
the examples (train_utils), a simulated wire (wire_sim), the fsdpcomp a child process must import
(pkg_path), the other CPythons here (pythons), and the fuzzer (fuzz, also a script). tests/ is on sys.path (pyproject.toml's
pytest `pythonpath`), so a test imports them as `from helpers.method_cases import CASES`."""
