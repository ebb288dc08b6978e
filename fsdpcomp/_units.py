"""The unit table of a CommState: which unit (residual, method state) a call belongs to, and where
a step, one backward pass, ends.

A call with a key (an FSDP1 unit's module name, an FSDP2 module's name, a DDP bucket's
parameter names) claims that key's unit, whatever the order of the calls and whichever units sit
out a step; a key claimed twice starts a new step. A call without a key takes the next unit in
call order within the step.

The end of a backward is caught with the autograd engine's final callback, queued on the graph
task of each call. Reentrant activation checkpointing runs a block's backward as a nested graph
task inside the outer one: a callback that finds itself nested (an autograd node is still
running: the checkpoint's) moves up instead, onto the outer task, through a hook on that node,
so the step ends with the outermost backward and never inside it. A backward that raises drops
its callbacks unrun; the next call finds them gone and closes that step first, so a failed
backward never leaves its step open (and every later call on a new unit)."""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Hashable, Mapping

import torch

SLOTS = ("scatter", "gather", "factors")  # the C State's residual slots (csrc/python/state.h)


@dataclass(frozen=True)
class SavedUnits:
    """A checkpoint's unit table, checked (UnitTable.check) and not yet restored."""
    units: list
    keys: list
    open_keys: list
    step: Any
    residuals: dict  # slot -> one residual (tensor or None) per unit
    unit_states: list | None


class UnitTable:
    """The unit table and step boundary of one CommState: each unit's key here, its size,
    residual and method state, and the step, in the C core. The only Python that calls the
    core's unit functions (begin, end_step, step, units, residuals, unit_states, restore)."""

    def __init__(self, core):
        self._core = core
        self._keys: list[Hashable | None] = []  # per unit: its key, or None (call order)
        self._index: dict[Hashable, int] = {}
        self._keyed: bool | None = None  # named units or call order; None: not yet known
        self._claimed: set[Hashable] = set()  # keys claimed in the open step
        self._calls = 0  # calls in the open step
        # graph task id -> a weakref to the end-of-backward callback queued on it and not yet
        # run, and the hooks waiting to move a nested task's end onto its outer task
        self._ends: dict[int, weakref.ref] = {}
        self._climbs: list[weakref.ref] = []

    @property
    def step(self) -> int:
        return self._core.step

    @property
    def keys(self) -> tuple:
        """Each unit's key in unit order (None: a unit of call order)."""
        return tuple(self._keys)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._index

    # ---- claiming a unit

    def claim(self, numel: int, key: Hashable | None) -> int:
        """The unit of a call of `numel` elements (key None: call order). Checked before anything
        changes: a refused claim (ValueError: another size than the unit's first call, a keyed
        call on a state keyed by call order or the other way round; TypeError: an unhashable
        key) leaves no trace."""
        keyed = key is not None
        if self._keyed is not None and self._keyed != keyed:
            this = f"has the key {key!r}" if keyed else "has no key"
            raise ValueError(f"this CommState keys its units {'by call order' if keyed else 'by name'} "
                             f"and this call {this}: one state serves either named units (as "
                             "fsdpcomp.register sets them up) or units in call order")
        if keyed:
            try:
                want = self._index.get(key)
            except TypeError:
                raise TypeError(f"a unit key must be hashable, got {type(key).__name__}") from None
            if want is None:  # a new key: a new unit, or the next unnamed one of an old checkpoint
                want = next((u for u, k in enumerate(self._keys) if k is None), len(self._keys))
        else:
            want = -1
        new_step = self._calls > 0 and ((keyed and key in self._claimed) or self._backward_failed())
        try:
            unit = self._core.begin(numel, want, new_step)
        except ValueError as e:
            raise ValueError(f"{e} (unit key {key!r})" if keyed else str(e)) from None
        if new_step:
            self._step_ended()
        if unit == len(self._keys):
            self._keys.append(key)
        if keyed:
            self._keys[unit] = key
            self._index[key] = unit
            self._claimed.add(key)
        self._keyed = keyed
        self._calls += 1
        self._watch(torch._C._current_graph_task_id())
        return unit

    def end_step(self) -> None:
        self._core.end_step()
        self._step_ended()

    def _step_ended(self) -> None:
        self._claimed.clear()
        self._calls = 0
        self._ends.clear()  # callbacks still queued find the step gone and do nothing
        self._climbs.clear()

    # ---- the end of a backward

    def _watch(self, task: int) -> None:
        """Queues the step's end on graph task `task` (once per task and step)."""
        if task < 0 or task in self._ends:  # -1: not inside a backward; the caller ends steps
            return
        end = _EndOfBackward(self, task, self._core.step)
        torch.autograd.Variable._execution_engine.queue_callback(end)
        self._ends[task] = weakref.ref(end)

    def _backward_failed(self) -> bool:
        """A backward that raised dropped its queued callbacks, and the hooks of its nodes, unrun."""
        pending = list(self._ends.values()) + self._climbs
        return any(ref() is None for ref in pending)

    def backward_ended(self, end: "_EndOfBackward") -> None:
        """An end-of-backward callback ran: ends the step, or moves up when the task is nested."""
        if self._ends.get(end.task) is not None and self._ends[end.task]() is end:
            del self._ends[end.task]
        if end.step != self._core.step:
            return  # queued for a step that has ended since
        node = torch._C._current_autograd_node()
        if node is not None:  # a nested graph task: the node running it belongs to the outer one
            climb = _Climb(self, end.step)
            try:
                node.register_hook(climb)  # kept by the node, so it goes with the graph
            except RuntimeError:
                return  # a node that takes no hooks: the next step's first repeated key ends it
            self._climbs.append(weakref.ref(climb))
            return
        if self._calls > 0:
            self.end_step()

    def climbed(self, climb: "_Climb") -> None:
        """A nested backward's node finished, in the outer graph task: the step's end goes there."""
        if self._core.step == climb.step:
            self._climbs = [r for r in self._climbs if r() is not climb]
            self._watch(torch._C._current_graph_task_id())

    # ---- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Step, unit sizes and keys, the keys claimed in the open step, every residual by slot
        (cloned) and the units' method state (gradiveq's basis)."""
        return {
            "step": self._core.step,
            "units": self._core.units(),
            "unit_keys": list(self._keys),
            "open_keys": [k for k in self._keys if k in self._claimed],
            "residuals": {slot: [None if r is None else r.detach().clone() for r in self._core.residuals(slot)]
                          for slot in SLOTS},
            "unit_states": [None if b is None else torch.frombuffer(bytearray(b), dtype=torch.float32)
                            for b in self._core.unit_states()],
        }

    @staticmethod
    def check(state_dict: Mapping[str, Any]) -> SavedUnits:
        """A checkpoint's unit table, checked before anything is restored: ValueError for a
        missing key, a wrong count or a NaN/Inf residual, TypeError for a wrong type. A
        checkpoint from before units had keys has none: its units go to the keys of the next
        calls in call order, as they were made; one from before unit states were saved has
        none: they restart from the seed."""
        for key in ("step", "units", "residuals"):
            if key not in state_dict:
                raise ValueError(f"fsdpcomp state_dict is missing '{key}'")
        for key, kinds in (("units", (list, tuple)), ("residuals", (dict, list, tuple)),
                           ("unit_states", (list, tuple, type(None)))):
            value = state_dict.get(key)
            if not isinstance(value, kinds):
                raise TypeError(f"state_dict '{key}' must be a {' or '.join(k.__name__ for k in kinds)}, "
                                f"got {type(value).__name__}")
        by_slot = state_dict["residuals"]
        if not isinstance(by_slot, Mapping):  # a list: the reduce-scatter's (a state without slots)
            by_slot = {"scatter": by_slot}
        for slot, table in by_slot.items():
            if slot not in SLOTS:
                raise ValueError(f"state_dict 'residuals' is keyed by slot ({', '.join(SLOTS)}), got {slot!r}")
            if not isinstance(table, (list, tuple)):
                raise TypeError(f"state_dict residuals['{slot}'] must be a list, one entry per unit, got "
                                f"{type(table).__name__}")
        tables = {f"residuals['{slot}']": table for slot, table in by_slot.items()}
        for key, table in (*tables.items(), ("unit_states", state_dict.get("unit_states") or [])):
            for u, r in enumerate(table):
                if r is not None and not isinstance(r, torch.Tensor):
                    raise TypeError(f"state_dict {key}[{u}] must be a tensor or None, got {type(r).__name__}")
        units = list(state_dict["units"])
        keys, open_keys = _check_keys(len(units), state_dict.get("unit_keys"), state_dict.get("open_keys"))
        # their sizes, dtypes and values: the core's restore (check_residual), before it changes anything
        residuals = {slot: [None if r is None else r.detach().clone() for r in table]
                     for slot, table in by_slot.items()}
        unit_states = state_dict.get("unit_states")
        if unit_states is not None:
            unit_states = [None if t is None else torch.as_tensor(t).detach().cpu().contiguous()
                           for t in unit_states]
        step = state_dict["step"]
        step = int(step) if isinstance(step, (int, torch.Tensor)) else step  # the core names a bad one
        return SavedUnits(units, keys, open_keys, step, residuals, unit_states)

    def restore(self, saved: SavedUnits) -> None:
        """The core's restore (sizes, residuals, step, method state; it checks what only it can,
        and leaves the step closed), then the keys."""
        self._core.restore(saved.units, saved.residuals, saved.step, saved.unit_states)
        self._keys = list(saved.keys)
        self._index = {k: u for u, k in enumerate(self._keys) if k is not None}
        self._keyed = True if self._index else None  # unnamed units: the next calls decide
        self._step_ended()
        self._claimed = set(saved.open_keys)
        self._calls = len(saved.open_keys)


def _check_keys(n_units: int, unit_keys: Any, open_keys: Any) -> tuple[list, list]:
    if unit_keys is None:
        return [None] * n_units, []
    if not isinstance(unit_keys, (list, tuple)) or len(unit_keys) != n_units:
        raise ValueError(f"state_dict 'unit_keys' must list one key per unit ({n_units}), got "
                         f"{unit_keys!r:.200}")
    keys = list(unit_keys)
    named = [k for k in keys if k is not None]
    try:
        if len(set(named)) != len(named):
            raise ValueError("state_dict 'unit_keys' names a unit twice")
        open_keys = list(open_keys or [])
        if any(k not in set(named) for k in open_keys):
            raise ValueError("state_dict 'open_keys' names a unit 'unit_keys' does not have")
    except TypeError:
        raise TypeError("state_dict 'unit_keys' must hold hashable keys") from None
    return keys, open_keys


class _EndOfBackward:
    """The final callback of one graph task: ends the step, or moves up when the task is nested."""

    def __init__(self, units: UnitTable, task: int, step: int):
        self._units = weakref.ref(units)  # a dropped state must not be kept alive by autograd
        self.task, self.step = task, step

    def __call__(self) -> None:
        units = self._units()
        if units is not None:
            units.backward_ended(self)


class _Climb:
    """A post hook on the node that ran a nested backward: runs in the outer graph task, and
    queues the step's end there."""

    def __init__(self, units: UnitTable, step: int):
        self._units = weakref.ref(units)
        self.step = step

    def __call__(self, *grads):
        units = self._units()
        if units is not None:
            units.climbed(self)
