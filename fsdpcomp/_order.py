"""Checks that the call order a CommState keys its residuals by names the same parameter group
(FSDP2) or bucket (DDP) every step, so one group's residual is never added to another's."""
from __future__ import annotations

import weakref
from typing import Hashable

from .state import CommState

_ORDERS: "weakref.WeakKeyDictionary[CommState, CallOrder]" = weakref.WeakKeyDictionary()


class CallOrder:
    """The key seen at each call position of a step, learnt from the first step that reaches
    that position. Positions restart when the state's step advances (end of backward)."""

    def __init__(self, state: CommState):
        self._state = weakref.ref(state)
        self._keys: list[Hashable] = []
        self._step = -1
        self._pos = 0

    def claim(self, key: Hashable) -> int:
        """Position of this call in the step; raises if another key held it before. Called
        just before the state's own begin(), so both count the same calls."""
        state = self._state()
        step = state.step if state is not None else 0
        if step != self._step:
            self._step, self._pos = step, 0
        pos = self._pos
        if pos < len(self._keys) and self._keys[pos] != key:
            raise RuntimeError(
                f"fsdpcomp keys residuals by call order, and call {pos} of step {step} came from "
                f"{key!r} but came from {self._keys[pos]!r} in earlier steps: the reduction order "
                "changed (a different set of parameters got gradients?), so residuals would be "
                "mixed between groups. Use one CommState per stable set of groups.")
        if pos == len(self._keys):
            self._keys.append(key)
        self._pos = pos + 1
        return pos

    @property
    def keys(self) -> list[Hashable]:
        return list(self._keys)


def call_order(state: CommState) -> CallOrder:
    """The one CallOrder of `state`, shared by every hook object that drives it."""
    order = _ORDERS.get(state)
    if order is None:
        order = CallOrder(state)
        _ORDERS[state] = order
    return order
