"""A CommState checkpoint (format 3, fsdpcomp/_checkpoint.py) as the tests read and corrupt it:
this process's RankState, and a copy of a state_dict with fields of it changed."""
import dataclasses

import torch.distributed as dist


def own(sd):
    """This process's part of a CommState.state_dict(): its RankState."""
    return sd[f"rank{dist.get_rank() if dist.is_initialized() else 0}"]


def with_own(sd, **changes):
    """A copy of sd whose RankState has `changes` (units, residuals, unit_states, ...)."""
    key = f"rank{dist.get_rank() if dist.is_initialized() else 0}"
    return dict(sd, **{key: dataclasses.replace(sd[key], **changes)})
