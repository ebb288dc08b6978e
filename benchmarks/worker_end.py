# How a benchmark's rank process ends: rank 0's result written atomically, the group left together, and no interpreter finalization.
"""One copy for comm_worker.py, step_worker.py and mem_worker.py."""
from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist


def finish(rank: int, result: dict | None, path: str) -> None:
    """Rank 0 writes `result` to `path` (through a temporary file: a run that died leaves no
    result and is run again); then every rank leaves the group together."""
    if rank == 0:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, path)
    dist.barrier()
    dist.destroy_process_group()


def exit_now() -> None:
    """The result is written: skip interpreter finalization, where a torch C++ thread still
    joinable now and then aborted a rank ("terminate called without an active exception"),
    failing a run whose numbers were already saved (tests/helpers/dist_utils.py does the same)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
