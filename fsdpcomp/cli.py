"""argparse integration: ``--comm_compress`` and ``--comm_config_json``, as training scripts
in this ecosystem spell them."""
from __future__ import annotations

import argparse

import torch.distributed as dist

from . import _methods
from .state import CommState


def add_argparse_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("fsdpcomp gradient compression")
    group.add_argument("--comm_compress", default="none", choices=_methods.names(),
                       help="gradient compressor for the reduce-scatter (default: none)")
    group.add_argument("--comm_config_json", default="{}",
                       help="JSON object of the compressor's config keys, e.g. "
                            "'{\"block_size\": 256, \"error_feedback\": true}'")
    return parser


def from_args(args: argparse.Namespace, process_group: dist.ProcessGroup | None = None) -> CommState:
    """The CommState the two flags describe (config errors raise ValueError naming the key)."""
    return CommState(args.comm_compress, args.comm_config_json, process_group=process_group)
