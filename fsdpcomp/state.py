"""CommState: one named compressor (its C state: config, residuals, counters) plus the process
group it reduces over. The FSDP1 hook, the FSDP2 reduce-scatter, all-gather and replica
all-reduce and the DDP hook all drive it. It keeps the config, the counters and the checkpoint,
checks every call and claims its unit (_units.py); the collectives live in _exchange.py (and the
parameter all-gather in _param_gather.py), the numerics in C."""
from __future__ import annotations

from typing import Any, Hashable, Mapping

import torch
import torch.distributed as dist

from . import _C, _agree, _checkpoint, _methods
from ._alloc import allocate
from ._cuda_check import require_cuda
from ._config import gather_default, normalize_config
from ._dist import Ranks
from ._buffers import ELEMENT_SIZE
from ._exchange import Exchange, Wire
from ._param_gather import ParamGather
from ._layout import Layout
from ._powersgd import PowerSGD
from ._powersgd import Config as PowerConfig
from ._shard_gather import ShardGather
from ._units import UnitTable
from .counters import Counters

POWERSGD_STATE_VERSION = 1  # RankState.method_state["powersgd"]'s layout

def _check_tensor(t: Any, name: str) -> None:
    """What every gradient tensor a hook call reduces must be, checked before the call claims
    its unit: TypeError for what it is (not a tensor, dtype, device), ValueError for its layout."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in ELEMENT_SIZE:
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    if t.device.type not in ("cpu", "cuda"):
        raise TypeError(f"{name} must be on the CPU or a CUDA device, got {t.device}")
    if t.device.type == "cuda":
        require_cuda(f"{name} is")  # CudaError: no CUDA library, or a driver too old for it
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous()), got shape "
                         f"{tuple(t.shape)} with strides {t.stride()}")


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
        _methods.check(method)  # here, not in C: the C table has no powersgd to list
        config = normalize_config(config)
        # powersgd drives a `none` core: its units, step, counters and wire keys (_powersgd.py)
        self._power: PowerSGD | None = None
        power_keys = None
        if method == "powersgd":
            cfg, config, power_keys = PowerConfig.split(config, _C.method_info(""))
        try:
            self._core = _C.State("none" if power_keys else method, gather_default(config), allocate)
        except ValueError as e:  # the common keys, checked by the `none` core: named for powersgd
            raise ValueError(str(e).replace("none config key", "powersgd config key")) from None
        if power_keys:
            self._power = PowerSGD(cfg, self._core.config["seed"], self._core.config["error_stats_every"],
                                   self._core)
        self._power_keys = power_keys or {}
        self.process_group = process_group
        self._units = UnitTable(self._core)  # which unit a call is, where a step ends
        self._exchange = Exchange(self._core, Wire.of(self._core, config))
        self._param_gather = ParamGather(self._core, self._exchange.buffers)
        self._handshake = _agree.Handshake(self._core, "powersgd" if power_keys else None, power_keys)
        self._device: torch.device | None = None  # where the units live: one state, one device
        if self._exchange.wire.gather_compressed and self._core.config.get("second_round"):
            # a single payload (the all-gather stage) has no second round to fetch values with
            raise ValueError("config key 'allgather_compress' cannot be combined with "
                             "'second_round': the compressed all-gather decodes single payloads")

    # ---- what the user sees

    @property
    def method(self) -> str:
        return "powersgd" if self._power else self._core.method

    @property
    def config(self) -> dict[str, Any]:
        """The resolved config, defaults included."""
        return {**self._core.config, **self._power_keys}

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
        return self._param_gather.codec

    def counters(self) -> Counters:
        c = self._core.counters()
        if self._power:
            c["method"] = "powersgd"
            self._power.merge_counters(c)  # residual_bytes: its e's (its `none` core keeps none)
        else:  # the codecs compress from the first call: only powersgd has an exact warm-up
            c.update(warmup_calls_exact=0, warmup_steps_exact=0)
        # a rank's memory, every part of it this state holds: the residuals in all their homes
        # (the C core's, powersgd's e, the all-gather half's) and the collectives' buffers
        c["residual_bytes"] += sum(t.numel() * t.element_size() for t in self._exchange.shard_gather.residuals.values())
        buffers = self._exchange.buffers
        c.update(buffer_bytes=buffers.held_bytes, buffer_peak_bytes=buffers.peak_bytes)
        return Counters(c)

    def reset_counters(self) -> None:
        """Zeroes the counters; buffer_peak_bytes starts again from the buffers held now (the
        bytes held, residual_bytes and buffer_bytes, are not counts and stay)."""
        self._core.reset_counters()
        self._exchange.buffers.reset_peak()
        if self._power:
            self._power.reset_counts()

    def end_step(self) -> None:
        """Marks the end of a backward pass. Called automatically at the end of every backward
        that ran the hook; call it yourself only when driving the hook outside autograd."""
        self._units.end_step()

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint of this state (format 2, fsdpcomp/_checkpoint.py): method, config,
        world size and step, and under ``"rank<r>"`` this rank's RankState: each unit's size
        and key, the residuals (cloned) and the units' method state (gradiveq's basis: a
        resumed run encodes as the uninterrupted one would). A CommState is a DCP ``Stateful``:
        ``dcp.save({"model": ..., "fsdpcomp": state})`` gives every rank its own back; so does a
        torch.save of this dict per rank."""
        units = self._units.state_dict()
        step = units.pop("step")
        mine = _checkpoint.RankState(
            **units, gather_residuals=self._exchange.shard_gather.state_dict(),
            method_state=self._method_state())
        return _checkpoint.pack(self.method, self.config, step, mine)

    def _method_state(self) -> dict[str, Any]:
        """RankState.method_state: powersgd's {"version": 1, "q": unit -> [Q per matrix], "e": unit
        -> residual}; nothing for the other methods."""
        return {"powersgd": {"version": POWERSGD_STATE_VERSION, **self._power.state_dict()}} if self._power else {}

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
        power = None
        if saved.rank_state is None:
            units = self._units.check({"step": saved.step, "units": [], "residuals": []})
            gather = {}
        else:
            mine = saved.rank_state
            _checkpoint.check_rank_state(mine, "powersgd" if self._power else None)
            if self._units.keys:
                _checkpoint.check_same_units(self._units.keys, self._core.units(), mine)
            units = self._units.check(_checkpoint.unit_fields(mine, saved.step))
            gather = ShardGather.check(mine.gather_residuals, len(units.units))
            if self._power:
                power = PowerSGD.check(_powersgd_part(mine.method_state), len(units.units))
        self._units.restore(units)
        self._exchange.shard_gather.restore(gather)
        if self._power:
            self._power.restore(*(power or ({}, {})))  # residuals="drop": Q and e afresh too

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
        _check_tensor(grad, "grad")
        device = grad.device
        if self._device is not None and device != self._device:
            raise TypeError(f"grad is on {device} but this CommState's units live on {self._device}: "
                            "one state serves one device")
        if output is None:
            return
        _check_tensor(output, "output")
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
        matrices: where each parameter's gradient lies in grad (powersgd compresses those
        matrices; without it everything is summed exactly; the codecs ignore it).
        Returns the unit index. A refused call (TypeError/ValueError) changes nothing.
        """
        ranks = Ranks.of(self.process_group)
        self._check_call(grad, output, ranks.world)
        unit = self._claim(grad, key, ranks, matrices)
        # powersgd's exact warm-up steps go through the `none` core's reduce-scatter below: half
        # the bytes of the all-reduce its factors need
        if self._power and not self._power.warming(self.step):
            target = output if scale == 1.0 else torch.empty(output.numel(), dtype=torch.float32, device=grad.device)
            self._power.reduce(grad, target, unit, ranks, matrices, self.step, True, self._exchange.timed)
            if target is not output:
                output.copy_(target.mul_(scale))
            return unit
        if self._power:
            self._power.count_exact(self.step)
        target = output
        if scale != 1.0:
            target = self._exchange.buffers.typed("scaled_mean", output.numel(), torch.float32, grad.device)
        try:
            self._exchange.reduce_scatter(grad, target, unit, ranks)
        except _C.PayloadError as e:
            raise _agree.explain(e) from None
        self._exchange.sync(unit, ranks, grad.device)
        if target is not output:
            output.copy_(target.mul_(scale))
        return unit

    def _claim(self, grad: torch.Tensor, key: Hashable | None, ranks: Ranks, matrices: Layout | None) -> int:
        """The handshake (the first call of a shape: the ranks compare configs), then the unit."""
        if self._power:
            power = self._power
            self._handshake.before_reduce(ranks.group, grad, ranks.world,
                                          lambda: power.signature(matrices, grad.numel()),
                                          lambda: {"matrices": repr(power.signature(matrices, grad.numel())[-2:])})
        else:
            self._handshake.before_reduce(ranks.group, grad, ranks.world,
                                          lambda: self._exchange.signature(grad, ranks.world, ranks.rank))
        unit = self._units.claim(grad.numel(), key)
        self._device = grad.device
        return unit

    def all_reduce(self, grad: torch.Tensor, key: Hashable | None = None, *,
                   matrices: Layout | None = None) -> None:
        """grad = mean over ranks of grad, in place: compressed reduce-scatter, then an
        all-gather of the reduced shards, compressed too (allgather_compress) where that pays
        (powersgd: its two all-reduces). key, matrices as for reduce_scatter."""
        ranks = Ranks.of(self.process_group)
        self._check_call(grad, None, ranks.world)
        if self._power:
            unit = self._claim(grad, key, ranks, matrices)
            self._power.reduce(grad, grad, unit, ranks, matrices, self.step, False, self._exchange.timed)
            return
        n = grad.numel()
        reduced = self._exchange.buffers.like("shard", -(-n // ranks.world), grad)
        unit = self.reduce_scatter(grad, reduced, key)
        if ranks.world == 1:
            grad.copy_(reduced[:n])
            return
        self._exchange.all_gather(reduced, grad, unit, ranks)

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
        self._handshake.before_param_gather(ranks.group, shard, ranks.world)  # first gather of a shape
        return self._param_gather(output, shard, ranks, unit, segments or (shard.numel(),), async_op)


def _powersgd_part(method_state: Mapping[str, Any]) -> Any:
    """RankState.method_state's powersgd entry for PowerSGD.check: a checkpoint of this state
    without one (saved before its first call) restores none; another version is refused."""
    part = method_state.get("powersgd")
    if part is None:
        return {"q": {}, "e": {}}
    version = part.get("version") if isinstance(part, Mapping) else None
    if version != POWERSGD_STATE_VERSION:
        raise ValueError(f"state_dict powersgd state has version {version!r}, this fsdpcomp reads "
                         f"version {POWERSGD_STATE_VERSION}")
    return {k: v for k, v in part.items() if k != "version"}
