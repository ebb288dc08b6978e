"""The package version, one place for __init__ and the results records (pyproject.toml says it too)."""
__version__ = "0.1.0"
# The torch releases fsdpcomp supports: pyproject.toml's dependency, which says why
# (tests/core/test_newcomer_errors.py checks the two agree). Named when torch is missing.
TORCH_SUPPORTED = ">=2.9,<2.14"
