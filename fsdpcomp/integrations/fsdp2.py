"""FSDP2 (``fully_shard``): a compressed reduce-scatter for ``FSDPModule.set_custom_reduce_scatter``,
a compressed parameter all-gather for ``set_custom_all_gather``, a compressed cross-replica
all-reduce for ``set_all_reduce_hook`` (hybrid sharding with a 1-D FSDP mesh), and what
``fsdpcomp.register`` and ``fsdpcomp.register_replicate`` do on a ``fully_shard`` model."""
from __future__ import annotations

from typing import Hashable, Sequence

import torch
import torch.distributed as dist

from .._dist import Ranks
from .._layout import Layout
from ..state import CommState
from ._checks import check_alike, check_cuda_model, check_flat, check_model, check_state, completed, refuse_param_gather

try:  # torch >= 2.9 defines the protocols; subclassing them keeps torch's isinstance checks true
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _TorchAllGather
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _TorchReduceScatter
except ImportError:  # older torch: the classes still work, register() says what is missing
    _TorchAllGather = _TorchReduceScatter = object  # type: ignore[assignment,misc]


def _param_groups(module: torch.nn.Module) -> list:
    """An FSDPModule's parameter groups (each parameter's padded shard, HSDP or not)."""
    # torch has no public accessor for them
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return groups
    # torch <= 2.11 (the GPU image's): one optional group, _fsdp_param_group
    group = getattr(state, "_fsdp_param_group", None)
    return [] if group is None else [group]


def _matrices(state: CommState, module: torch.nn.Module | None, blocks: int, numel: int) -> Layout | None:
    """Where each parameter's gradient lies in a flat tensor of one FSDPModule (the matrices
    of a state that takes a layout): ``blocks`` blocks (the reduce-scatter input, one per rank; 1 for the replica
    all-reduce of a shard), each holding every parameter's padded dim-0 shard in FSDP2's order.
    A parameter sharded on another dim is summed exactly. None: the sizes do not fit."""
    if module is None or not state.takes_layout:  # the codecs take no layout
        return None
    groups = _param_groups(module)
    if len(groups) != 1:
        return None
    shapes = []
    for p in groups[0].fsdp_params:
        size = tuple(p.padded_sharded_param_size)
        dim = getattr(getattr(p, "fsdp_placement", None), "dim", 0)
        shapes.append(size if dim == 0 else (p.padded_sharded_param_size.numel(),))
    if blocks * sum(torch.Size(s).numel() for s in shapes) != numel:
        return None
    return Layout.of_shapes(shapes, blocks)


def _op_scale(op, world: int) -> float:
    """What torch's reduce-scatter with `op` computes, as a multiple of the mean over ranks:
    AVG 1, SUM world, PREMUL_SUM(f) f * world (FSDP2 passes these three, see torch's
    _get_gradient_divide_factors). Anything else has no meaning for gradients."""
    kind = getattr(op, "op", op)  # a ReduceOp instance carries its RedOpType in .op
    if kind == dist.ReduceOp.AVG:
        return 1.0
    if kind == dist.ReduceOp.SUM:
        return float(world)
    if kind == dist.ReduceOp.PREMUL_SUM:
        factor = getattr(op, "factor", None)
        if not isinstance(factor, (int, float)):
            raise ValueError(f"op PREMUL_SUM must carry a float factor (ReduceOp.PREMUL_SUM(f)), got {factor!r}")
        return float(factor) * world
    raise ValueError(f"op must be ReduceOp.AVG, SUM or PREMUL_SUM(f) for a gradient reduce-scatter, got {kind}")


class ReduceScatter(_TorchReduceScatter):
    """FSDP2's reduce-scatter, compressed by a CommState.

    ``module.set_custom_reduce_scatter(fsdpcomp.ReduceScatter(state))`` on every FSDPModule
    (``fsdpcomp.register`` does it, one object per module with its name as ``key``). With a
    ``key`` the module keeps its own residual whatever the order of the calls and whichever
    modules sit out a step; without one, units go by call order within a backward. Errors as
    CommState's; ValueError for an op other than AVG, SUM or PREMUL_SUM(f).
    """

    def __init__(self, state: CommState, key: Hashable | None = None, module: torch.nn.Module | None = None):
        check_state(state, "ReduceScatter")
        self.state = state
        self.key = key
        self.module = module  # the FSDPModule: its parameters' shapes (a layout's matrices)

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        # Fresh memory each call: FSDP2 keeps the input alive across groups and the output
        # becomes the sharded gradients (views), so neither may be reused.
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup | None = None, op=dist.ReduceOp.AVG,
                 async_op: bool = False):
        state = self.state
        reduce_group = group if group is not None else state.process_group
        world = Ranks.of(reduce_group).world
        for name, t in (("output_tensor", output_tensor), ("input_tensor", input_tensor)):
            check_flat(t, name)
        check_alike(output_tensor, input_tensor)
        if input_tensor.numel() != world * output_tensor.numel():
            raise ValueError(f"input_tensor has {input_tensor.numel()} elements; a reduce-scatter over {world} "
                             f"ranks into output_tensor of {output_tensor.numel()} needs {world * output_tensor.numel()}")
        scale = _op_scale(op, world)
        _bind_group(state, group)
        state.reduce_scatter(input_tensor, output_tensor, self.key, scale=scale,
                             matrices=_matrices(state, self.module, world, input_tensor.numel()))
        return completed(output_tensor, async_op)

    def __repr__(self) -> str:
        return f"fsdpcomp.ReduceScatter({self.state!r}, key={self.key!r})"


def _bind_group(state: CommState, group: dist.ProcessGroup | None) -> None:
    """The state reduces over the group FSDP2 passes; one state serves one group."""
    if group is None:
        return
    if state.process_group is None:
        state.process_group = group
    elif state.process_group is not group:
        raise ValueError("this CommState reduces over a different process group than the one FSDP2 "
                         "passed: use one CommState per reduce-scatter group")


class AllReduceHook:
    """``module.set_all_reduce_hook(fsdpcomp.AllReduceHook(state))`` (or
    ``fsdpcomp.register_replicate(model, state)`` on every module): the cross-replica mean of
    the reduce-scatter output, compressed (compressed reduce-scatter + all-gather over
    ``state.process_group``, the replicate group).

    For hybrid sharding run ``fully_shard`` on the 1-D shard mesh and let this hook do the
    replicate dimension: torch's own 2-D HSDP all-reduce has no hook (torch calls the hook
    after it), so it cannot be compressed.
    """

    def __init__(self, state: CommState, key: Hashable | None = None, module: torch.nn.Module | None = None):
        check_state(state, "AllReduceHook")
        if state.process_group is None:
            raise ValueError("AllReduceHook's state needs its process_group: the replicate group")
        self.state = state
        self.key = key
        self.module = module  # the FSDPModule: its parameters' shapes (a layout's matrices)

    def __call__(self, reduce_output: torch.Tensor) -> None:
        check_flat(reduce_output, "reduce_output")
        self.state.all_reduce(reduce_output, self.key,
                              matrices=_matrices(self.state, self.module, 1, reduce_output.numel()))

    def __repr__(self) -> str:
        return f"fsdpcomp.AllReduceHook({self.state!r}, key={self.key!r})"


class AllGather(_TorchAllGather):
    """FSDP2's all-gather of one FSDPModule's parameters, through the CommState's parameter
    codec (config key ``param_gather``; _param_gather.py has what goes on the wire):
    ``m.set_custom_all_gather(AllGather(state, unit=i, module=m))``, as ``fsdpcomp.register``
    sets one on every FSDPModule.

    ``unit`` names the module in the payload headers (``fsdpcomp.register`` numbers the modules
    in the same order on every rank), so ranks that gather different modules at the same time
    get a PayloadError instead of each other's weights. ``module``, the FSDPModule this gathers
    for, tells where each parameter's shard lies in the flat shard: each is encoded as its own
    segment, so no block of scales spans two parameters (a LayerNorm gain of 1 would otherwise
    set the scale of the small weights beside it). Without it the shard is one segment.
    Errors: TypeError for a state, module or tensor of the wrong kind (with a codec: a dtype
    other than float32/bfloat16/float16, a device other than CPU or CUDA), ValueError for a
    negative unit or tensors whose sizes do not fit an all-gather.
    """

    def __init__(self, state: CommState, key: str | None = None, unit: int = 0,
                 module: torch.nn.Module | None = None):
        check_state(state, "AllGather")
        if isinstance(unit, bool) or not isinstance(unit, int):
            raise TypeError(f"unit must be an int, got {type(unit).__name__}")
        if unit < 0:
            raise ValueError(f"unit must be a non-negative int, got {unit!r}")
        if module is not None and not hasattr(module, "_get_fsdp_state"):
            raise TypeError(f"module must be the FSDPModule this all-gather serves, got {type(module).__name__}")
        self.state = state
        self.key = key
        self.unit = unit
        self.module = module
        self._segments: dict[int, tuple[int, ...]] = {}

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        # FSDP2 splits the output into the unsharded parameters after the call: fresh memory.
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup | None = None, async_op: bool = False):
        state = self.state
        world = Ranks.of(group if group is not None else state.process_group).world
        codec = state.param_codec is not None
        for name, t in (("output_tensor", output_tensor), ("input_tensor", input_tensor)):
            # `none` moves any dtype FSDP2 gathers, uint8 included
            check_flat(t, name, floats=codec, hint=" (parameters with their own all-gather extension, "
                       "e.g. float8 training, need param_gather 'none')")
        check_alike(output_tensor, input_tensor)
        n = input_tensor.numel()
        if n == 0 or output_tensor.numel() != world * n:
            raise ValueError(f"output_tensor has {output_tensor.numel()} elements; an all-gather over {world} "
                             f"ranks of input_tensor's {n} needs {world * n} (and at least one)")
        if codec and input_tensor.device.type not in ("cpu", "cuda"):
            raise TypeError(f"param_gather '{state.config['param_gather']}' runs on CPU and CUDA tensors; "
                            f"set param_gather 'none' for parameters on {input_tensor.device}")
        work = state.all_gather_params(output_tensor, input_tensor, group=group, unit=self.unit,
                                       segments=self._layout(n), async_op=async_op)
        return work if work is not None else completed(output_tensor, async_op)

    def _layout(self, n: int) -> tuple[int, ...]:
        """Elements of each segment of a shard of n elements (each parameter's padded shard, in
        FSDP2's order): a pure function of n and the module, so the same on every rank."""
        segments = self._segments.get(n)
        if segments is None:
            segments = (n,)
            if self.module is not None:
                groups = _param_groups(self.module)
                params = groups[0].fsdp_params if len(groups) == 1 else []
                sizes = tuple(p.padded_sharded_param_size.numel() for p in params)
                if sizes and sum(sizes) == n and all(sizes):  # else (a resharded post-forward shard): one
                    segments = sizes
            self._segments[n] = segments
        return segments

    def __repr__(self) -> str:
        return f"fsdpcomp.AllGather({self.state!r}, key={self.key!r}, unit={self.unit})"


def fsdp2_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every FSDPModule in `model`, itself included; [] on a torch without FSDP2."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return []
    return [(name, m) for name, m in model.named_modules() if isinstance(m, FSDPModule)]


def register_fsdp2(model: torch.nn.Module, state: CommState) -> None:
    """Sets a ReduceScatter keyed by the module's name and an AllGather numbered by its position
    (the same on every rank) on each FSDPModule; checks them all first so that a refusal leaves
    no module half-registered. RuntimeError on a torch without the custom collectives;
    ValueError for a module with several parameter groups."""
    modules = fsdp2_modules(model)
    if not hasattr(modules[0][1], "set_custom_reduce_scatter") or not hasattr(modules[0][1], "set_custom_all_gather"):
        raise RuntimeError(
            f"torch {torch.__version__} has fully_shard but no FSDPModule.set_custom_reduce_scatter / "
            "set_custom_all_gather (added in torch 2.9): fsdpcomp cannot compress its collectives; upgrade torch")
    for name, module in modules:
        groups = _param_groups(module)
        if len(groups) > 1:
            raise ValueError(f"FSDPModule '{name or '<root>'}' has {len(groups)} parameter groups "
                             "(shard_placement_fn with several meshes): torch allows one custom "
                             "reduce-scatter per module only with a single group")
    for unit, (name, module) in enumerate(modules):
        module.set_custom_reduce_scatter(ReduceScatter(state, key=name or "<root>", module=module))
        module.set_custom_all_gather(AllGather(state, key=name or "<root>", unit=unit, module=module))


def register_replicate(model: torch.nn.Module, state: CommState) -> None:
    """Hybrid sharding done by hand: ``model`` is sharded with ``fully_shard`` on the 1-D shard
    mesh and ``state.process_group`` is the replicate group; every FSDPModule gets an
    AllReduceHook (keyed by its name) that averages its reduce-scatter output across replicas.

    Checked before anything is set: fsdpcomp.CudaError for a model on CUDA this fsdpcomp cannot
    run (as for ``register``), ValueError for a ``param_gather`` other than "none" or a
    module sharded on a 2-D (HSDP) mesh, TypeError for a model without FSDPModules,
    RuntimeError on a torch without ``set_all_reduce_hook``."""
    check_state(state, "register_replicate")
    check_model(model, "register_replicate", "a torch.nn.Module sharded with fully_shard (FSDPModule modules)")
    check_cuda_model(model)
    refuse_param_gather(state, "register_replicate (the replica all-reduce)")
    modules = fsdp2_modules(model)
    if not modules:
        raise TypeError(f"{type(model).__name__} has no fully_shard (FSDPModule) modules")
    if not hasattr(modules[0][1], "set_all_reduce_hook"):
        raise RuntimeError(f"torch {torch.__version__} has no FSDPModule.set_all_reduce_hook: upgrade torch")
    for name, module in modules:
        # torch marks a group sharded on a 2-D mesh only in this member
        if any(group._is_hsdp for group in _param_groups(module)):
            raise ValueError(f"FSDPModule '{name or '<root>'}' is sharded on a 2-D (HSDP) mesh: torch runs "
                             "its own replica all-reduce there and calls the hook after it; shard on "
                             "the 1-D shard mesh instead")
    for name, module in modules:
        module.set_all_reduce_hook(AllReduceHook(state, key=name or "<root>", module=module))
