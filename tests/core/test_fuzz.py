"""The fuzzer (tests/helpers/fuzz.py) on a bounded budget with a fixed seed: mutated payloads, configs,
tensors and checkpoints for every method config; only documented exceptions, no state change on
refusal, no accepted header corruption, finite in -> finite out. Also run under ASan + UBSan
(.ci/sanitize); `python tests/helpers/fuzz.py --seconds N` is the long run."""
from helpers import fuzz


def test_fuzz_bounded():
    tally = fuzz.run(seconds=None, per_method=40, seed=0)
    assert sum(tally.tried.values()) > 3000
    assert tally.ok(), tally.table()
    # every generator got through to the C side, accepted and refused inputs alike
    for entry in ("decompress", "decode", "decode_part", "config", "encode", "compress",
                  "load_state_dict", "reduce_scatter"):
        assert tally.tried[entry] > 0 and (tally.accepted[entry] > 0 or entry == "compress"), entry
