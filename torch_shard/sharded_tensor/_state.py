"""What Python shows of a ShardedTensor's C++ state: metadata and local shards, read from the impl.

The C++ ``ShardedTensorImpl`` is the only store of the layout and the local shards (see
``NOTE [ ShardedTensor state ]`` in ``csrc/sharded_tensor_impl.cpp``). This module builds the Python
views users see, :class:`ShardedTensorMetadata` and a list of :class:`Shard`, and caches them under the
impl's version stamp, which changes on every write, whichever path made it. The shards it hands out
are bound to their tensor: assigning ``local_shards()[i].tensor`` writes through the one C++ setter.
"""

from __future__ import annotations

import copy
import weakref

import torch

from .._support import _torch_private as private
from .._support._native import LayoutArgs
from .._support._tensor_metadata import ShardedTensorMetadata, TensorProperties
from .._support._torch_private import RemoteDevice
from ..metadata import ShardMetadata
from ..sharding_spec._infer import _infer_sharding_spec_from_shards_metadata
from ._shard_checks import SIZE, shard_mismatch
from .shard import Shard

_ops = torch.ops.torch_shard
# Our own ops called on a ShardedTensor skip ShardedTensor.__torch_function__ (it would only pass them
# through, at the cost of a Python call each).
_plain = private.DisableTorchFunctionSubclass

_SLOT_TENSOR = Shard.tensor  # the dataclass slot descriptors, under the properties below
_SLOT_METADATA = Shard.metadata


class _BoundShard(Shard):
    """A local shard as ``ShardedTensor.local_shards()`` returns it: a :class:`Shard` whose ``tensor``
    writes through to its ShardedTensor.

    ``shard.tensor = t`` replaces the local shard in the C++ impl (checked: ``t`` must have the shard's
    size and the tensor's dtype), so gather, reshard, pickling and deepcopy see ``t``.
    ``shard.metadata = md`` accepts a value equal to the shard's metadata (nothing changes) and raises
    ValueError for any other (see NOTE [ Assigning a local shard's metadata ]). It compares, prints,
    copies and pickles as a plain :class:`Shard`.
    """

    __slots__ = ("_owner", "_slot", "_version")

    @property  # type: ignore[override]
    def tensor(self) -> torch.Tensor:
        return _SLOT_TENSOR.__get__(self)

    @tensor.setter
    def tensor(self, value: torch.Tensor) -> None:
        owner = self._owner()
        if owner is None:
            _SLOT_TENSOR.__set__(self, value)  # the ShardedTensor is gone: a detached Shard now
            return
        owner._write_local_tensor(self, value)

    @property  # type: ignore[override]
    def metadata(self) -> ShardMetadata:
        return _SLOT_METADATA.__get__(self)

    @metadata.setter
    def metadata(self, value: ShardMetadata) -> None:
        owner = self._owner()
        if owner is None:
            _SLOT_METADATA.__set__(self, value)  # the ShardedTensor is gone: a detached Shard now
            return
        check_metadata_assignment(self, value)

    def __eq__(self, other):
        if not isinstance(other, Shard):
            return NotImplemented
        return (self.tensor, self.metadata) == (other.tensor, other.metadata)

    __hash__ = None  # as the dataclass (eq without frozen)

    def __repr__(self):
        return f"Shard(tensor={self.tensor!r}, metadata={self.metadata!r})"

    def __reduce__(self):
        return (Shard, (self.tensor, self.metadata))

    def __copy__(self):
        return Shard(self.tensor, self.metadata)

    def __deepcopy__(self, memo):
        return Shard(copy.deepcopy(self.tensor, memo), copy.deepcopy(self.metadata, memo))


def _bound(owner, slot: int, version: int, tensor: torch.Tensor, metadata: ShardMetadata) -> _BoundShard:
    shard = object.__new__(_BoundShard)
    _SLOT_TENSOR.__set__(shard, tensor)
    _SLOT_METADATA.__set__(shard, metadata)
    shard._owner = weakref.ref(owner)
    shard._slot = slot
    shard._version = version
    return shard


class StateView:
    """Metadata and local shards of one version of a ShardedTensor's impl (built lazily)."""

    __slots__ = ("version", "tensors", "indices", "pin_memory", "layout_serial", "layout_fp", "metadata", "shards")

    def __init__(self, version, tensors, indices, pin_memory, layout_serial, layout_fp):
        self.version = version
        self.tensors = tensors
        self.indices = indices
        self.pin_memory = pin_memory
        self.layout_serial = layout_serial  # changes with the layout object (spec tracking)
        self.layout_fp = layout_fp  # what ranks agree on (boxes, owners, device types)
        self.metadata = None
        self.shards = None

    def __deepcopy__(self, memo):
        # A cache of the impl: a copied ShardedTensor builds its own (NOTE [ Staging a ShardedTensor
        # with DCP's default stager ]).
        return None


def _new_shard_metadata(offsets: list[int], sizes: list[int], placement) -> ShardMetadata:
    # The values were validated by the C++ layout; skip __init__'s per-field checks.
    md = ShardMetadata.__new__(ShardMetadata)
    md.shard_offsets = offsets
    md.shard_sizes = sizes
    md.placement = placement
    return md


def _tensor_facts(st) -> tuple[torch.dtype, bool, torch.Size]:
    """(dtype, requires_grad, size) of the impl, without a trip through __torch_function__."""
    with private.DisableTorchFunctionSubclass():
        return st.dtype, st.requires_grad, st.size()


def metadata_from_impl(st, pin_memory: bool) -> ShardedTensorMetadata:
    """The ShardedTensorMetadata of ``st``'s impl: its shards in layout order, with placements parsed
    once per distinct placement."""
    with _plain():
        offsets, sizes, index, names, _owners, _chunk_dim = _ops._layout(st)
    parsed = [RemoteDevice(name) if name else None for name in names]
    shards = [
        _new_shard_metadata(off, size, parsed[i])
        for off, size, i in zip(offsets.tolist(), sizes.tolist(), index.tolist())
    ]
    return ShardedTensorMetadata(shards, _tensor_facts(st)[2], properties_of(st, pin_memory))


def properties_of(st, pin_memory: bool) -> TensorProperties:
    """The TensorProperties of ``st``'s impl (strided, contiguous, as every shard is)."""
    dtype, requires_grad, _size = _tensor_facts(st)
    return TensorProperties(
        dtype=dtype,
        layout=torch.strided,
        requires_grad=requires_grad,
        memory_format=torch.contiguous_format,
        pin_memory=pin_memory,
    )


def _fresh_view(st) -> StateView:
    with _plain():
        return StateView(*_ops._state(st))


def read_state(st) -> StateView:
    """The current view of ``st``'s impl (cached on ``st`` under the impl's version)."""
    view = st._state_view
    with _plain():
        version = _ops._version(st)
    if view is None or view.version != version:
        view = _fresh_view(st)
        st._state_view = view
    return view


def metadata(st) -> ShardedTensorMetadata:
    view = read_state(st)
    if view.metadata is None:
        view.metadata = metadata_from_impl(st, view.pin_memory)
    properties = view.metadata.tensor_properties
    requires_grad = _tensor_facts(st)[1]
    if properties.requires_grad != requires_grad:
        properties.requires_grad = requires_grad
    return view.metadata


def local_shards(st) -> list[Shard]:
    view = read_state(st)
    if view.shards is None:
        shards_md = metadata(st).shards_metadata
        view.shards = [
            _bound(st, k, view.version, tensor, shards_md[idx])
            for k, (tensor, idx) in enumerate(zip(view.tensors, view.indices))
        ]
    return view.shards


def sharding_spec(st):
    """The spec ``st`` was built or resharded with while its layout is still the one that spec gave;
    otherwise (the layout was changed by a direct C++ op call) the spec inferred from the layout."""
    view = read_state(st)
    if st._sharding_spec is None or st._spec_layout_serial != view.layout_serial:

        st._sharding_spec = _infer_sharding_spec_from_shards_metadata(metadata(st).shards_metadata)
        st._spec_layout_serial = view.layout_serial
    return st._sharding_spec


def set_spec(st, spec) -> None:
    """Record ``spec`` as describing ``st``'s current layout (None: infer it when asked)."""
    st._sharding_spec = spec
    st._spec_layout_serial = read_state(st).layout_serial if spec is not None else None


def layout_args(st):
    """``st``'s layout as the op schemas' argument group, read from the impl (no packing)."""

    with _plain():
        offsets, sizes, index, names, owners, _chunk_dim = _ops._layout(st)
    return LayoutArgs(None, offsets, sizes, index, list(names), list(owners))


def seed(st, metadata_: ShardedTensorMetadata, local: list[Shard], indices: list[int]) -> None:
    """Cache what the constructor already has (the metadata it built from, the shards it was given),
    so a fresh ShardedTensor answers metadata() and local_shards() without rebuilding them."""
    view = _fresh_view(st)
    view.metadata = metadata_
    view.shards = [_bound(st, k, view.version, s.tensor, s.metadata) for k, s in enumerate(local)]
    st._state_view = view


def write_local_tensor(st, shard: _BoundShard, tensor: torch.Tensor) -> None:
    """``shard.tensor = tensor`` for a shard of ``st.local_shards()``: through the one C++ setter."""
    view = read_state(st)
    if shard._version != view.version or view.shards is None or view.shards[shard._slot] is not shard:
        raise RuntimeError(
            "this Shard was returned by local_shards() before the ShardedTensor changed (a reshard or "
            "another write); call local_shards() again and assign to that shard"
        )
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"a local shard must be a torch.Tensor, not {type(tensor).__name__}")
    # The C++ setter checks everything (NOTE [ A local shard against its shard ]); the size first
    # here, for the message Shard gives.
    if shard_mismatch(tensor, shard.metadata.shard_sizes, None) == SIZE:
        raise ValueError(
            "Shard tensor size does not match with metadata.shard_lengths! "
            f"Found shard tensor size: {list(tensor.size())}, "
            f"metadata.shard_lengths: {shard.metadata.shard_sizes}, "
        )
    tensors = list(view.tensors)
    tensors[shard._slot] = tensor
    with _plain():
        _ops._set_local_shards(st, tensors, view.indices)
        version = _ops._version(st)
    # Same layout: keep the metadata and shard objects, restamp them with the new version.
    view.version = version
    view.tensors = tensors
    _SLOT_TENSOR.__set__(shard, tensor)
    for s in view.shards:
        s._version = view.version


# NOTE [ Assigning a local shard's metadata ]
# Upstream's Shard is a plain dataclass, and code written for it assigns ``shard.metadata`` on the
# shards of a live ShardedTensor: TorchRec's dynamic resharding copies an unchanged table's shard
# metadata from the old tensor onto the new one's local shards. Here the layout lives in the C++ impl
# and is the same on every rank, so an assignment is judged against it:
#
# * a value equal to the shard's metadata (offsets, sizes and placement) is accepted and changes
#   nothing: the shard keeps the metadata object the ShardedTensor's metadata() lists, so both stay one
#   object, as they are after construction;
# * any other value raises ValueError saying what to do instead. A shard's box is one entry of the
#   global layout that every rank holds; changing it on one rank alone would leave the ranks disagreeing
#   (or, if every rank changed its own, a layout nobody validated), and making an attribute assignment
#   collective would surprise. The ways that keep every rank consistent exist: ``reshard`` moves the
#   data to a new layout, ``init_from_local_shards`` builds a new tensor from ``Shard(tensor,
#   new_metadata)`` objects (one exchange, validated on every rank).
#
# A shard whose ShardedTensor is gone is a plain Shard and takes any value, as the tensor setter does.


def check_metadata_assignment(shard: _BoundShard, value) -> None:
    """``shard.metadata = value`` for a shard of a live ShardedTensor; see the NOTE above."""
    if not isinstance(value, ShardMetadata):
        raise TypeError(f"a shard's metadata must be a ShardMetadata, not {type(value).__name__}")
    current = _SLOT_METADATA.__get__(shard)
    if value == current:
        return
    raise ValueError(
        f"cannot set the metadata of a ShardedTensor's local shard to {value}: it holds {current}, and "
        "the layout is shared by every rank of the ShardedTensor. To move the data to another layout "
        "use ShardedTensor.reshard(spec); to describe these tensors with other metadata build a new "
        "ShardedTensor from Shard(tensor, metadata) objects with init_from_local_shards"
    )


def replace_local_shards(st, shards: list[Shard]) -> None:
    """``st._local_shards = shards``: match each shard to its entry of the metadata by offsets and
    sizes (in order when several entries share a box, as empty shards may) and write them through the
    one C++ setter. A shard that matches no entry is a ValueError; the list may repeat or leave out
    shards of this rank (data ops check that before they move anything)."""
    shards_md = metadata(st).shards_metadata
    by_box: dict[tuple, list[int]] = {}
    for idx, md in enumerate(shards_md):
        by_box.setdefault((tuple(md.shard_offsets), tuple(md.shard_sizes)), []).append(idx)
    used: dict[tuple, int] = {}
    indices = []
    for shard in shards:
        md = shard.metadata
        key = (tuple(md.shard_offsets), tuple(md.shard_sizes))
        candidates = by_box.get(key)
        if not candidates:
            raise ValueError(f"Local shard {md} is not one of the shards in the global metadata")
        k = used.get(key, 0)
        indices.append(candidates[min(k, len(candidates) - 1)])
        used[key] = k + 1
    with _plain():
        _ops._set_local_shards(st, [s.tensor for s in shards], indices)
