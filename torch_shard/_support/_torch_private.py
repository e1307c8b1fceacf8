"""Every private torch name torch_shard uses, in one place.

torch keeps no promise about names that start with an underscore (``torch._C._DisableTorchDispatch``,
``torch.distributed.tensor.placement_types._StridedShard``, ``DTensor._local_tensor``): a torch release
may move or rename them. torch_shard reaches them only through this module, so such a release breaks
here, and ``tests/test_torch_private.py``, which resolves every name in ``__all__`` on each torch the
project is tested with, says which one.

Two kinds of names:

* torch's own objects, under the name torch_shard uses. Those from modules that ``import torch`` has
  already imported are bound at import; those from ``torch.distributed.tensor`` are resolved on first
  use (:func:`__getattr__`), because importing that package costs time at ``import torch_shard``, and
  ``torch.distributed.tensor._shards_wrapper`` imports ``torch.distributed._shard``, which
  ``torch_shard.compat`` must alias before anything imports it. Callers therefore read them as
  attributes of this module at call time (``_torch_private.StridedShard``), never with a
  module-level ``from`` import.
* small functions around a private attribute, method or constructor signature (``local_tensor``,
  ``dtensor_with_spec``, ``split_indices``), so that a changed signature is mended here too.

Not here: ``torch_shard/_support/_build_info.py`` reads ``torch._C._GLIBCXX_USE_CXX11_ABI`` itself, because
setup.py loads that file on its own, before the package (and this module) can be imported.
"""

from __future__ import annotations

import importlib

import torch
from torch.distributed import distributed_c10d
from torch.distributed.remote_device import _remote_device
from torch.utils import _pytree

# Names resolved on first use (see the module docstring for why): name -> (module, attribute).
_LAZY = {
    "DTensorSpec": ("torch.distributed.tensor._dtensor_spec", "DTensorSpec"),
    "TensorMeta": ("torch.distributed.tensor._dtensor_spec", "TensorMeta"),
    "StridedShard": ("torch.distributed.tensor.placement_types", "_StridedShard"),
    "LocalShardsWrapper": ("torch.distributed.tensor._shards_wrapper", "LocalShardsWrapper"),
}

__all__ = [
    *_LAZY,
    "DYNAMO_MODULE",
    "DisableTorchDispatch",
    "DisableTorchFunctionSubclass",
    "OpOverload",
    "OpOverloadPacket",
    "RemoteDevice",
    "calculate_correct_fan",
    "default_group",
    "group_ranks_by_group",
    "dtensor_spec",
    "dtensor_with_spec",
    "has_compatible_shallow_copy_type",
    "local_tensor",
    "make_subclass",
    "make_wrapper_subclass",
    "op_name",
    "pytree",
    "rank_not_in_group",
    "set_remote_device_device",
    "spec_of",
    "split_indices",
    "strided_shard",
]

# The module torch.compile imports, whose import torch_shard waits for (torch_shard/_support/_compile.py).
DYNAMO_MODULE = "torch._dynamo"

# Context managers: torch functions on Tensor subclasses run as on plain tensors; dispatch skips the
# Python (subclass) key.
DisableTorchFunctionSubclass = torch._C.DisableTorchFunctionSubclass
DisableTorchDispatch = torch._C._DisableTorchDispatch

OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket

# A torch function ShardedTensor answers itself (tensor.data = other asks it).
has_compatible_shallow_copy_type = torch._has_compatible_shallow_copy_type

make_subclass = torch.Tensor._make_subclass
make_wrapper_subclass = torch.Tensor._make_wrapper_subclass
calculate_correct_fan = torch.nn.init._calculate_correct_fan

# Flattening nested containers of tensors (tree_leaves, tree_map).
pytree = _pytree

# A shard's placement, "rank:<r>/<device>" parsed: the class upstream's ShardMetadata.placement has.
RemoteDevice = _remote_device


def set_remote_device_device(placement, device: torch.device) -> None:
    """Point ``placement`` (a RemoteDevice) at ``device`` in place, keeping its rank."""
    placement._device = device


def op_name(op) -> str:
    """The qualified name (``namespace::name``) of an OpOverload or OpOverloadPacket."""
    if isinstance(op, OpOverload):
        return op._schema.name
    return op._qualified_op_name


def default_group():
    """The default process group (torch.distributed's WORLD)."""
    return distributed_c10d._get_default_group()


def rank_not_in_group(group) -> bool:
    """Whether this rank is outside ``group`` (None stands for the default group)."""
    return distributed_c10d._rank_not_in_group(group)


def group_ranks_by_group() -> dict:
    """Every process group this process has made, with the group rank of each of its global ranks:
    ``{group: {global rank: group rank}}``."""
    return distributed_c10d._world.pg_group_ranks




def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # later reads find a plain module attribute, not this function
    return value


def _lazy(name: str):
    """A name of ``_LAZY`` from inside this module (where a bare name does not reach __getattr__)."""
    return globals().get(name) or __getattr__(name)


def local_tensor(dtensor) -> torch.Tensor:
    """The local tensor object a DTensor holds (not the autograd-connected view ``to_local()`` gives)."""
    return dtensor._local_tensor


def spec_of(dtensor):
    """A DTensor's DTensorSpec: its mesh, placements and global tensor metadata."""
    return dtensor._spec


def dtensor_with_spec(local: torch.Tensor, spec, requires_grad: bool):
    """A DTensor over ``local`` described by ``spec``, built directly (no checks, no communication, no
    autograd node: the caller's autograd Function connects it)."""
    from torch.distributed.tensor import DTensor

    return DTensor(local, spec, requires_grad=requires_grad)


def dtensor_spec(mesh, placements: tuple, size, stride, dtype: torch.dtype):
    """The DTensorSpec of a tensor of global ``size``, ``stride`` and ``dtype`` on ``mesh`` with
    ``placements``."""
    meta = _lazy("TensorMeta")(torch.Size(size), stride, dtype)
    return _lazy("DTensorSpec")(mesh, placements, tensor_meta=meta)


def strided_shard(dim: int, split_factor: int):
    """``_StridedShard(dim, split_factor=...)``, the placement FSDP2 + TP give a sharded dim."""
    return _lazy("StridedShard")(dim, split_factor=split_factor)


def split_indices(placement, index: torch.Tensor, num_chunks: int) -> list[torch.Tensor]:
    """``index`` split into ``num_chunks`` pieces as ``placement`` (a Shard or _StridedShard along dim 0)
    splits a tensor, without padding: the trailing pieces may be missing or empty."""
    pieces, _ = placement._split_tensor(index, num_chunks, with_padding=False, contiguous=False)
    return pieces
