"""Sharding tensors and module parameters, and module hooks for sharded outputs."""

from __future__ import annotations

import zlib

import torch
import torch.nn as nn

from ._support import _native
from ._support import _torch_private as private
from ._support._agreement import abort_and_raise
from ._support._placement import _PlacementResolver
from ._support._tensor_metadata import TensorProperties
from .sharded_tensor import ShardedTensor
from .sharded_tensor._pickling import _get_current_process_group, load_with_process_group  # noqa: F401
from .sharder import Sharder
from .sharding_spec import ChunkShardingSpec, ShardingSpec

__all__ = ["_shard_tensor", "load_with_process_group", "shard_module", "shard_parameter"]



def _shard_tensor(
    tensor: torch.Tensor, sharding_spec: ShardingSpec, src_rank: int = 0, process_group=None
) -> ShardedTensor:
    """Shard a full tensor held on ``src_rank`` into a ShardedTensor laid out by ``sharding_spec``.

    Collective: every rank of ``process_group`` calls it with the same ``src_rank`` and spec and a
    tensor of the same size and dtype (only ``src_rank``'s data is read). Each rank receives only its
    own shards. ``src_rank`` is a rank of ``process_group``.

    Raises:
        ValueError: ``tensor`` is not contiguous, or ``src_rank`` / ``sharding_spec`` differ across
            ranks (raised on every rank).
        NotImplementedError: the spec cannot scatter (e.g. EnumerableShardingSpec, as upstream).
    """
    return _shard_tensor_checked(tensor, sharding_spec, src_rank, process_group, None)


def _spec_fingerprint(spec: ShardingSpec, tensor: torch.Tensor, pg) -> int:
    """What ranks agree on about ``spec`` before it shards ``tensor`` itself (chunk specs are agreed
    inside the C++ scatter).

    The fingerprint of the layout the spec gives ``tensor`` (C++, the one the data ops agree on) when
    the spec can build one. A user's spec need not: upstream never asks it for metadata here and goes
    straight to its ``shard()``, which may accept tensors its ``build_metadata`` refuses (or raise
    NotImplementedError of its own). Then the ranks agree on the spec's class instead, and
    ``shard()`` is reached on every rank or on none (NOTE [ Agreeing on a spec that shards itself ]).
    """
    try:
        args = _native.layout_args_for_spec(
            spec, tensor.size(), lambda: TensorProperties.create_from_tensor(tensor), _PlacementResolver(pg)
        )
    except Exception:  # noqa: BLE001 - whatever a user's build_metadata raises, shard() decides
        return _unbuildable_spec_fingerprint(spec)
    return _native.layout_fingerprint(args, tensor.size(), tensor.dtype)


# NOTE [ Agreeing on a spec that shards itself ]
# Every rank must reach a spec's shard() with the same src_rank, size, dtype and spec, or none may
# (a rank left behind would wait in whatever collective shard() starts). The layout fingerprint says
# "same spec" exactly, but only for specs whose build_metadata works for this tensor. For the others
# the ranks compare the spec's class (a CRC-32 of its module and qualified name) with a marker saying
# that no layout could be built: two ranks whose specs
# disagree on whether a layout exists, or on the class, still fail the agreement together. What this
# cannot see is two instances of one such class with different fields; upstream compares the objects
# with ==, which for a class without __eq__ is identity and fails across processes anyway.
_UNBUILDABLE = 0x5EC0_0000_0000_0000


def _unbuildable_spec_fingerprint(spec: ShardingSpec) -> int:
    name = f"{type(spec).__module__}.{type(spec).__qualname__}"
    return _UNBUILDABLE ^ zlib.crc32(name.encode())


def _shard_tensor_checked(tensor, sharding_spec, src_rank, process_group, error):
    pg = process_group if process_group is not None else private.default_group()
    if error is None and isinstance(tensor, torch.Tensor) and not tensor.is_contiguous():
        error = ValueError("input tensor is not a contiguous Tensor")
    if error is not None:
        abort_and_raise("shard", error, pg)
    if _native.is_chunk_spec(sharding_spec) and type(sharding_spec).shard is ChunkShardingSpec.shard:
        # One C++ call: it agrees on src_rank, size, dtype and layout, then scatters.
        return ShardedTensor._scatter(tensor, sharding_spec, src_rank, pg)
    # Specs that shard themselves (EnumerableShardingSpec raises NotImplementedError, as upstream):
    # agree on src_rank, size, dtype and spec first, as upstream does, then let the spec shard.
    try:
        spec_fp = _spec_fingerprint(sharding_spec, tensor, pg)
    except Exception as exc:  # noqa: BLE001 - every rank must hear about it
        abort_and_raise("shard", exc, pg)
    torch.ops.torch_shard._agree_shard(src_rank, list(tensor.size()), tensor.dtype, spec_fp, pg.group_name)
    return sharding_spec.shard(tensor, src_rank=src_rank, process_group=pg)


def shard_parameter(
    module: nn.Module, param_name: str, sharding_spec: ShardingSpec, src_rank: int = 0, process_group=None
) -> None:
    """Replace ``module.<param_name>`` with ``nn.Parameter`` of a ShardedTensor sharded from ``src_rank``.

    Collective, like :func:`_shard_tensor`. Argument errors are raised on every rank together.

    Raises:
        AttributeError: the module has no such attribute.
        ValueError: the attribute is not a Tensor or not contiguous; ranks disagree on src_rank/spec.
    """
    error: BaseException | None = None
    tensor = None
    if not hasattr(module, param_name):
        error = AttributeError(f"{module._get_name()} has no attribute `{param_name}`")
    else:
        tensor = getattr(module, param_name)
        if not isinstance(tensor, torch.Tensor):
            error = ValueError(
                f"Expected {type(module).__name__}.{param_name} to be a Tensor, but found {type(tensor).__name__}"
            )
        elif not tensor.is_contiguous():
            error = ValueError(f"param: {param_name} is not a contiguous Tensor")
    st = _shard_tensor_checked(tensor, sharding_spec, src_rank, process_group, error)
    if param_name not in module._parameters:
        delattr(module, param_name)
    module.register_parameter(param_name, nn.Parameter(st))


def _reshard_output(module: nn.Module, resharding_spec: ShardingSpec) -> nn.Module:
    """Make ``module``'s ShardedTensor output come out resharded by ``resharding_spec``."""

    def hook_func(_module, _input, output):
        if isinstance(output, ShardedTensor):
            return output.reshard(resharding_spec)
        return None

    module.register_forward_hook(hook_func)
    return module


def _collect_local_shard(module: nn.Module) -> nn.Module:
    """Make ``module``'s ShardedTensor output come out as this rank's local tensor.

    For a ChunkShardingSpec output whose local chunk has length 1 along the sharded dim, that dim is
    squeezed away.
    """

    def hook_func(_module, _input, output):
        if isinstance(output, ShardedTensor):
            local_tensor = output.local_tensor()
            spec = output.sharding_spec()
            if isinstance(spec, ChunkShardingSpec) and local_tensor.size(spec.dim) == 1:
                local_tensor = local_tensor.squeeze(spec.dim)
            return local_tensor
        return None

    module.register_forward_hook(hook_func)
    return module


def shard_module(module: nn.Module, plan, src_rank: int = 0, process_group=None) -> None:
    """Shard ``module`` in place according to a :class:`~torch_shard.sharding_plan.ShardingPlan`.

    Example (on each of 2 ranks)::

        model = nn.Sequential(nn.Linear(4, 8))
        spec = ChunkShardingSpec(dim=0, placements=["rank:0/cpu", "rank:1/cpu"])
        shard_module(model, ShardingPlan(plan={"0.weight": spec}))  # model[0].weight: a ShardedTensor

    Parameters named in ``plan.plan`` with a ShardingSpec are sharded with :func:`shard_parameter`;
    submodules named with a Sharder are replaced, in their parent, by what ``Sharder.shard`` returns,
    when that is a complete module (its class defines ``forward``). A result without ``forward``
    cannot stand in for the submodule: the submodule stays in place, in whatever state the Sharder
    left it (see NOTE [ Sharder results ]). Then ``output_plan`` and ``return_local_tensor`` install
    output hooks. Collective: every rank of ``process_group`` calls it with the same plan.

    Raises:
        KeyError: a Sharder entry with an empty module path.
        RuntimeError: a parameter entry inside a submodule a Sharder handles.
        TypeError: a plan value that is neither a ShardingSpec nor a Sharder, or an output_plan value
            that is not a ShardingSpec.
        AttributeError: a path that names no submodule or parameter.
    """
    sharder_paths = [name for name, spec in plan.plan.items() if isinstance(spec, Sharder)]
    for name, spec in plan.plan.items():
        if isinstance(spec, ShardingSpec):
            module_path, _, param_name = name.rpartition(".")
            for sharder_path in sharder_paths:
                if module_path.startswith(sharder_path):
                    raise RuntimeError(
                        f"ShardingPlan is in-valid, trying to shard a parameter: {name}, but there's "
                        f"already a Sharder entry for module {sharder_path}, parameter sharding should "
                        f"not conflict with the submodule tree that a Sharder is working with!"
                    )
            submodule = module.get_submodule(module_path)
            shard_parameter(submodule, param_name, spec, src_rank=src_rank, process_group=process_group)
        elif isinstance(spec, Sharder):
            if name == "":
                raise KeyError("Module path must not be empty for custom sharder!")
            parent_path, _, child_name = name.rpartition(".")
            parent = module.get_submodule(parent_path)
            child = parent.get_submodule(child_name)
            # NOTE [ Sharder results ]
            # Upstream's shard_module assigns a Sharder's result to an attribute literally named
            # `mod_name` of the parent, so the submodule the model calls is never replaced. Sharders
            # written against it therefore shard the submodule they are given in place (e.g.
            # shard_module on its parameters) and return a holder of the sharded parts, often
            # without a forward of its own. torch_shard installs the result under the submodule's
            # name, which is what a Sharder means; a holder without forward would break the model's
            # next call ("missing the required forward function"), so such a result is not installed
            # and the in-place-sharded submodule keeps serving. Nothing is attached under
            # `mod_name`.
            sharded = spec.shard(child)
            complete = isinstance(sharded, nn.Module) and type(sharded).forward is not nn.Module.forward
            if sharded is not child and complete:
                setattr(parent, child_name, sharded)
        else:
            raise TypeError(f"Only `ShardingSpec` and `Sharder` are supported to shard '{name}'")

    if plan.output_plan is not None:
        for module_path, output_spec in plan.output_plan.items():
            if not isinstance(output_spec, ShardingSpec):
                raise TypeError(f"Only `ShardingSpec` is supported as output_plan for '{module_path}'")
            _reshard_output(module.get_submodule(module_path), output_spec)
    if plan.return_local_tensor is not None:
        for module_path in plan.return_local_tensor:
            _collect_local_shard(module.get_submodule(module_path))

