"""FSDP1 (``FullyShardedDataParallel``): the communication hook, one function for every sharding
strategy FSDP1 allows a hook for, and what ``fsdpcomp.register`` does on an FSDP1 root: register
it and name every unit. By hand: ``model.register_comm_hook(state, fsdp_hook)``."""
from __future__ import annotations

import weakref
from typing import Hashable

import torch

from .._layout import Layout
from ..state import CommState
from ._checks import check_state, refuse_param_gather


class UnitHookState:
    """What FSDP1 hands the hook for one FSDP unit: the shared CommState and the unit's key (the
    FSDP module's name, so its flat parameter's residual). ``fsdpcomp.register`` sets one on
    every FSDP instance of the root; torch passes each instance its own ``_comm_hook_state``."""

    def __init__(self, state: CommState, key: Hashable):
        check_state(state, "UnitHookState")
        self.state = state
        self.key = key

    def __repr__(self) -> str:
        return f"fsdpcomp.UnitHookState({self.state!r}, key={self.key!r})"


class _FlatNames:
    """Names of the flat parameters a bare CommState's hook has seen, in the order of first
    sight ("flat_param0", ...): the same on every rank and in every process. By identity (a
    tensor compares elementwise, so it cannot be a dict key), checked against reuse of an id."""

    def __init__(self):
        self._by_id: dict[int, tuple[weakref.ref, str]] = {}
        self._count = 0

    def name(self, flat: torch.Tensor) -> str:
        entry = self._by_id.get(id(flat))
        if entry is not None and entry[0]() is flat:
            return entry[1]
        name = f"flat_param{self._count}"
        self._count += 1
        self._by_id[id(flat)] = (weakref.ref(flat), name)
        return name


def _current_flat_param() -> torch.Tensor | None:
    """The flat parameter whose gradient the hook reduces: FSDP1 runs it in a hook on the
    AccumulateGrad node of the unit's flat parameter, so autograd's current node names it.
    None outside autograd (a caller driving the hook by hand)."""
    flat = getattr(torch._C._current_autograd_node(), "variable", None)
    return flat if getattr(flat, "_is_flat_param", False) else None  # FSDP1 marks them so


def _matrices(flat: torch.Tensor | None) -> Layout | None:
    """Where each original parameter lies in the flat parameter (the matrices of a state that
    takes a layout): its per-parameter shapes, with the alignment padding between them
    (use_orig_params)."""
    if flat is None:
        return None
    # FSDP1's FlatParameter keeps its per-parameter layout only in these members
    numels, padding, shapes = flat._numels_with_padding, flat._is_padding_mask, iter(flat._shapes)
    return Layout.of_shapes([(n,) if pad else next(shapes) for n, pad in zip(numels, padding)])


def _flat_param_key(state: CommState, flat: torch.Tensor | None) -> str | None:
    """The key of the unit calling the hook: its flat parameter's name. None outside autograd
    (a caller driving the hook by hand): call order."""
    if flat is None:
        return None
    return state.hook_memo("fsdp1 flat parameter names", _FlatNames).name(flat)


def fsdp_hook(state: CommState | UnitHookState, grad: torch.Tensor, output: torch.Tensor | None = None) -> None:
    """FULL_SHARD / SHARD_GRAD_OP: ``hook(state, padded_grad, sharded_output)`` fills the output
    with the mean over ranks of this rank's chunk. NO_SHARD: ``hook(state, grad)`` replaces grad
    by the mean over ranks (all-reduce meaning). Any of fp32/bf16/fp16; sums are in fp32.

    Each FSDP unit keeps its own residual, keyed by its name (``UnitHookState``, set by
    ``fsdpcomp.register``) or, with a bare CommState, by its flat parameter, so a unit that gets
    no gradient in a step (FSDP1 then skips its hook) never shifts the others. Errors as
    CommState's."""
    flat = _current_flat_param()
    if isinstance(state, UnitHookState):
        state, key = state.state, state.key
    else:
        check_state(state, "fsdp_hook")
        key = _flat_param_key(state, flat)
    matrices = _matrices(flat) if state.takes_layout else None
    if output is None:
        state.all_reduce(grad, key, matrices=matrices)
    else:
        state.reduce_scatter(grad, output, key, matrices=matrices)


def register_fsdp1(root: torch.nn.Module, state: CommState) -> None:
    """``register_comm_hook`` with :func:`fsdp_hook` on an FSDP1 root, every unit named.

    torch's register_comm_hook gives every FSDP instance of the root the same hook state; each
    instance gets its own instead, naming its unit, so that FSDP1 skipping a unit's hook in a
    step (no gradient: an unused branch, a frozen layer) shifts no other unit's residual.
    ValueError for a ``param_gather`` other than "none" (FSDP1 has no all-gather hook)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp._common_utils import clean_tensor_name

    refuse_param_gather(state, "FullyShardedDataParallel")
    if state.process_group is None:
        state.process_group = root.process_group
    root.register_comm_hook(state, fsdp_hook)
    for name, module in root.named_modules():
        if isinstance(module, FSDP):
            # torch's FSDP1 keeps the hook state of each instance here and has no setter for it
            module._comm_hook_state = UnitHookState(state, clean_tensor_name(name) or "<root>")
