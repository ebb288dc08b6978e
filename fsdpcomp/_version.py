"""The package version, one place for __init__ and the results records (pyproject.toml says it too)."""
__version__ = "0.1.0"
