"""The method configurations the method tests run: every method fsdpcomp has, the hybrids and
the variants whose behaviour differs (stochastic rounding, bit widths, modes)."""

CASES = [
    ("fp8", {}),
    ("fp8", {"format": "e5m2", "block_size": 64}),
    ("int8", {"stochastic": True}),
    ("intN", {"bits": 4}),
    ("intN", {"bits": 2, "stochastic": True, "block_size": 64}),
    ("intN", {"bits": 3}),
    ("intN", {"bits": 3, "scheme": "minmax", "stochastic": True}),
    ("qsgd", {"levels": 7, "bucket_size": 256}),
    ("nc", {}),
    ("topk", {"ratio": 0.05}),
    ("topk", {"k": 40, "quantize": "int8"}),
    ("topk", {"ratio": 0.1, "quantize": "qsgd"}),
    ("randomk", {"ratio": 0.1}),
    ("randomk", {"ratio": 0.2, "quantize": "nc"}),
    ("randomk", {"ratio": 0.25, "quantize": "intN"}),
    ("topk", {"ratio": 0.1, "quantize": "intN"}),
    ("thresholdv", {"threshold": 1.5}),
    ("thresholdv", {"threshold": 1.0, "quantize": "fp16"}),
    ("thresholdv", {"threshold": 1.0, "values": "sign"}),
    ("sketch", {"rows": 3, "cols": 512, "k": 64}),
    ("sketch", {"rows": 3, "cols": 512, "k": 64, "second_round": True}),
    ("gradiveq", {"dim": 16, "k": 4}),
    ("signsgd", {}),
    ("signsgd", {"mode": "majority", "scale": 0.5}),
    ("onebit", {}),
    ("dct", {}),  # more dct configs (every value codec, blocks 8-256): tests/cuda/test_cuda_dct.py
    ("dct", {"block": 32, "k": 3, "quantize": "intN", "value_bits": 2, "value_stochastic": True}),
]

# the wire ids: stable across versions (a payload's header names its method by them)
WIRE_IDS = {"none": 0, "fp16": 1, "bf16": 2, "int8": 3, "fp8": 4, "intN": 5, "qsgd": 6, "nc": 7,
            "topk": 8, "randomk": 9, "thresholdv": 10, "sketch": 11, "gradiveq": 12,
            "signsgd": 13, "onebit": 14, "dct": 15, "adaptive": 16}


# adaptive sends every unit exact (its default parts table: fp32) until a chooser sets the tables
# (issue 39; the Python chooser is not built yet): the tests of what a method does to the bytes at
# its defaults leave it out, tests/core/test_adaptive.py tests it with tables.
EXACT_AT_DEFAULTS = ("adaptive",)


def compressing_codecs() -> list[str]:
    """fsdpcomp.codecs() that compress at their defaults (all but EXACT_AT_DEFAULTS)."""
    import fsdpcomp
    return [m for m in fsdpcomp.codecs() if m not in EXACT_AT_DEFAULTS]


def case_id(case):
    method, cfg = case
    return method + "".join(f"-{k}={v}" for k, v in cfg.items())
