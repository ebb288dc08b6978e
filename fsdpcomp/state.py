"""CommState: one named compressor, a Reducer (_reducer.py: the collectives and the state
they keep), plus the process group it reduces over. The FSDP1 hook, the FSDP2 reduce-scatter,
all-gather and replica all-reduce and the DDP hook all drive it. It checks every call, claims
its unit (_units.py), and keeps the checkpoint's frame (_checkpoint.py); everything a method does
differently is its reducer's, which _methods.py picks by the method's name."""
from __future__ import annotations

from typing import Any, Hashable, Mapping

import torch
import torch.distributed as dist

from . import _C, _checkpoint, _methods
from ._config import normalize_config
from ._dist import Ranks
from ._cuda_check import require_cuda
from ._layout import Layout
from ._tensor_checks import check_grad
from ._units import UnitTable
from .counters import Counters


class CommState:
    """A gradient compressor attached to a process group.

    Args:
        method: a name from ``fsdpcomp.methods()``.
        config: dict or JSON string of config keys (``fsdpcomp.method_info(method)`` lists them).
        process_group: the group to reduce over; None means the default group at call time
            (or a single rank when torch.distributed is not initialised).

    Errors, here and in every hook that drives it: TypeError for an argument of the wrong
    kind (not a tensor, a dtype other than float32/bfloat16/float16, a device the call cannot
    use, a state that is not a CommState); ValueError for a value that does not fit (a size, a
    layout, a config key, a unit key used inconsistently); fsdpcomp.PayloadError for a payload
    from another rank that does not decode; fsdpcomp.CudaError for the first CUDA tensor when
    this fsdpcomp cannot run on CUDA here (built without CUDA, or a driver too old for its CUDA
    library: the message says which and what to do). A refused call changes nothing.
    """

    def __init__(self, method: str = "none", config: Mapping[str, Any] | str | None = None,
                 process_group: dist.ProcessGroup | None = None):
        if not isinstance(method, str):
            raise TypeError(f"method must be a str, got {type(method).__name__}")
        self._reducer = _methods.make_reducer(method, normalize_config(config))
        self._core = self._reducer.core  # the unit table's: units, step, residuals
        self.process_group = process_group
        self._units = UnitTable(self._core)  # which unit a call is, where a step ends
        self._device: torch.device | None = None  # where the units live: one state, one device
        self._hook_memos: dict[str, Any] = {}  # hook_memo's

    # ---- what the user sees

    @property
    def method(self) -> str:
        return self._reducer.name

    @property
    def config(self) -> dict[str, Any]:
        """The resolved config, defaults included."""
        return self._reducer.config

    @property
    def takes_layout(self) -> bool:
        """Whether this state's method reads ``matrices`` (where each parameter's gradient lies
        in a call's flat tensor): an integration describes them only then."""
        return self._reducer.takes_layout

    @property
    def step(self) -> int:
        return self._units.step

    @property
    def unit_keys(self) -> tuple:
        """Each unit's key, in unit order (None: a unit of call order, or of a checkpoint saved
        before units had keys)."""
        return self._units.keys

    @property
    def param_codec(self) -> "_C.State | None":
        """The C codec of the parameter all-gathers (config key ``param_gather``); None: "none"."""
        return self._reducer.param_gather.codec

    def hook_memo(self, name: str, make):
        """What an integration keeps per state (FSDP1's flat-parameter names, DDP's count of
        backward passes): made by make() on first use, it lives and dies with this state."""
        memo = self._hook_memos.get(name)
        if memo is None:
            memo = self._hook_memos[name] = make()
        return memo

    def counters(self) -> Counters:
        return Counters(self._reducer.counters())

    def reset_counters(self) -> None:
        """Zeroes the counters; buffer_peak_bytes starts again from the buffers held now (the
        bytes held, residual_bytes and buffer_bytes, are not counts and stay)."""
        self._reducer.reset_counters()

    def end_step(self) -> None:
        """Marks the end of a backward pass. Called automatically at the end of every backward
        that ran the hook; call it yourself only when driving the hook outside autograd."""
        self._units.end_step()

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint of this state (format 3, fsdpcomp/_checkpoint.py): method, config,
        world size and step, and under ``"rank<r>"`` this rank's RankState: each unit's size
        and key, every residual by slot (cloned) and the units' method state (gradiveq's basis: a
        resumed run encodes as the uninterrupted one would). A CommState is a DCP ``Stateful``:
        ``dcp.save({"model": ..., "fsdpcomp": state})`` gives every rank its own back; so does a
        torch.save of this dict per rank."""
        units = self._units.state_dict()
        step = units.pop("step")
        mine = _checkpoint.RankState(**units, **self._reducer.state_dict())
        return _checkpoint.pack(self.method, self.config, step, mine)

    def load_state_dict(self, state_dict: Mapping[str, Any], *, residuals: str = "keep") -> None:
        """Restores a state_dict() of a state with the same method and config, saved by this
        rank at this world size. Everything is checked first, and a refused load leaves this
        state as it was: ValueError names what differs (a missing key, another method or
        config, another world size, another rank's state, a unit of another size than this
        state's, a count that does not fit, a NaN/Inf residual); TypeError a value of the wrong
        type. residuals="drop" keeps only the method, config and step and starts every unit's
        residual and method state afresh, on purpose: to resume at another world size (with
        DCP: ``state.without_residuals()``)."""
        saved = _checkpoint.unpack(state_dict, self.method, self.config, residuals)
        reducer, checked = self._reducer, None
        if saved.rank_state is None:
            units = self._units.check({"step": saved.step, "units": [], "residuals": []})
        else:
            mine = saved.rank_state
            _checkpoint.check_rank_state(mine, reducer.method_state_key)
            if self._units.keys:
                _checkpoint.check_same_units(self._units.keys, self._core.units(), mine)
            units = self._units.check(_checkpoint.unit_fields(mine, saved.step))
            checked = reducer.check(mine, list(units.units))
        self._units.restore(units)
        reducer.restore(checked)  # None (residuals="drop"): every residual afresh

    def without_residuals(self) -> "_checkpoint.WithoutResiduals":
        """For ``torch.distributed.checkpoint.load``: a view of this state that reads a
        checkpoint's method, config and step, at any world size, and starts the residuals
        afresh (``load_state_dict(sd, residuals="drop")``), e.g.
        ``dcp.load({"model": msd, "fsdpcomp": state.without_residuals()}, checkpoint_id=path)``."""
        return _checkpoint.WithoutResiduals(self)

    def __repr__(self) -> str:
        return f"CommState(method={self.method!r}, config={self.config!r})"

    # ---- the collectives the hooks call

    def _check_call(self, grad: Any, output: Any, world: int) -> None:
        """Everything a reduce-scatter call's tensors must be, before it claims a unit."""
        check_grad(grad, "grad")
        device = grad.device
        if self._device is not None and device != self._device:
            raise TypeError(f"grad is on {device} but this CommState's units live on {self._device}: "
                            "one state serves one device")
        if output is None:
            return
        check_grad(output, "output")
        if output.device != device:
            raise TypeError(f"output is on {output.device} but grad is on {device}: all tensors of "
                            "a call must share a device")
        shard = -(-grad.numel() // world)
        if output.numel() < shard:
            raise ValueError(f"output has {output.numel()} elements, the shard needs {shard} "
                             f"(grad has {grad.numel()} elements over {world} ranks)")

    def reduce_scatter(self, grad: torch.Tensor, output: torch.Tensor, key: Hashable | None = None, *,
                       scale: float = 1.0, matrices: Layout | None = None) -> int:
        """output = scale * (sum over ranks of rank r's chunk of grad) / world, compressed on the
        wire; a scale other than 1 is applied to the fp32 mean, rounded once to output's dtype.

        grad: flat, contiguous, len = world * shard (FSDP pads it); output: the shard.
        key: the unit's name (its residual and method state); None: the next unit in call order.
        matrices: where each parameter's gradient lies in grad (read where ``takes_layout``: a
        low-rank method compresses those matrices and sums the rest exactly).
        Returns the unit index. A refused call (TypeError/ValueError) changes nothing.
        """
        ranks = Ranks.of(self.process_group)
        self._check_call(grad, output, ranks.world)
        unit = self._claim(grad, key, ranks, matrices)
        target = output
        if scale != 1.0:
            target = self._reducer.exchange.buffers.typed("scaled_mean", output.numel(), torch.float32, grad.device)
        self._reducer.reduce_scatter(grad, target, unit, ranks, self.step, matrices)
        if target is not output:
            output.copy_(target.mul_(scale))
        return unit

    def _claim(self, grad: torch.Tensor, key: Hashable | None, ranks: Ranks, matrices: Layout | None) -> int:
        """The handshake (the first call of a shape: the ranks compare configs), then the unit."""
        self._reducer.agree(grad, ranks, matrices)
        unit = self._units.claim(grad.numel(), key)
        self._device = grad.device
        return unit

    def all_reduce(self, grad: torch.Tensor, key: Hashable | None = None, *,
                   matrices: Layout | None = None) -> None:
        """grad = mean over ranks of grad, in place: for the codecs a compressed reduce-scatter,
        then an all-gather of the reduced shards, compressed too (allgather_compress) where that
        pays; a reducer of its own (e.g. low-rank factors) does its own. key, matrices as for
        reduce_scatter."""
        ranks = Ranks.of(self.process_group)
        self._check_call(grad, None, ranks.world)
        unit = self._claim(grad, key, ranks, matrices)
        self._reducer.all_reduce(grad, unit, ranks, self.step, matrices)

    def all_gather_params(self, output: torch.Tensor, shard: torch.Tensor, *,
                          group: dist.ProcessGroup | None = None, unit: int = 0,
                          segments: tuple[int, ...] | None = None, async_op: bool = False):
        """FSDP2's parameter all-gather (what fsdpcomp.AllGather calls once it has checked the
        tensors): output = every rank's shard, through the ``param_gather`` codec. unit: the
        module's number in the payload headers; segments: elements of each piece of the shard
        encoded on its own (default: the whole shard). group None: the state's process group.
        Returns torch's Work for an uncompressed gather with async_op, else None."""
        ranks = Ranks.of(group if group is not None else self.process_group)
        if shard.device.type == "cuda":
            require_cuda("shard is")
        return self._reducer.gather_params(output, shard, ranks, unit, segments or (shard.numel(),), async_op)
