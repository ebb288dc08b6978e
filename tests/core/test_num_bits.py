"""`num_bits`, the seed study's spelling of a quantiser's width: accepted where it names what the
method already has (int8: 8, intN: its `bits`), a ValueError naming the valid values elsewhere."""
import argparse

import pytest
import torch

import fsdpcomp


def test_seed_command_line_runs_as_written():
    """The study's int8 run: --comm_compress int8 --comm_config_json '{"num_bits": 8}'."""
    parser = fsdpcomp.add_argparse_args(argparse.ArgumentParser())
    args = parser.parse_args(["--comm_compress", "int8", "--comm_config_json", '{"num_bits": 8}'])
    state = fsdpcomp.from_args(args)
    assert state.method == "int8"
    assert state.config == fsdpcomp.CommState("int8").config  # an alias: nothing else changes
    assert "num_bits" not in state.config


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_intn_num_bits_is_bits(gen, bits):
    by_alias = fsdpcomp.CommState("intN", {"num_bits": bits, "compress_own_chunk": True})
    by_key = fsdpcomp.CommState("intN", {"bits": bits, "compress_own_chunk": True})
    assert by_alias.config == by_key.config and by_alias.config["bits"] == bits
    both = fsdpcomp.CommState("intN", {"bits": bits, "num_bits": bits})
    assert both.config["bits"] == bits
    # the same payload bytes, so the same codes on the wire
    x = torch.randn(1000, generator=gen)
    payloads = []
    for state in (by_alias, by_key):
        p = torch.empty(state._core.payload_bytes(1000), dtype=torch.uint8)
        n = state._core.compress(x, p)
        payloads.append(p[:n].clone())
    assert torch.equal(payloads[0], payloads[1])


@pytest.mark.parametrize("method,config,message", [
    ("int8", {"num_bits": 4}, r"int8 config key 'num_bits' must be 8 .*got 4"),
    ("int8", {"num_bits": 16}, r"must be 8 .*got 16"),
    ("int8", {"num_bits": 8.0}, r"'num_bits' must be an integer, got float"),
    ("int8", {"num_bits": 2 ** 70}, r"must be 8, got an integer beyond 64 bits"),
    ("intN", {"num_bits": 8}, r"intN config key 'num_bits' \(the same as 'bits'\) must be 2, 3 or 4, got 8"),
    ("intN", {"num_bits": True}, r"must be an integer, got bool"),
    ("intN", {"num_bits": 2, "bits": 3}, r"'num_bits' \(2\) and 'bits' disagree"),
    ("topk", {"num_bits": 8}, r"'num_bits' sets the code width of int8 \(8\) or intN \(2, 3 or 4.*'topk'"),
    ("fp16", {"num_bits": 16}, r"method 'fp16' has no code width"),
])
def test_num_bits_elsewhere_is_a_clear_value_error(method, config, message):
    with pytest.raises(ValueError, match=message):
        fsdpcomp.CommState(method, config)
