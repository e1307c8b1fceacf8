"""ShardedTensorBase and ShardedTensor: torch.Tensor subclasses backed by a C++ ShardedTensorImpl."""

from __future__ import annotations

import collections.abc
import copy
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d, rpc
from torch.utils import _pytree as pytree

from .. import _C  # noqa: F401  (registers torch.ops.torch_shard)
from .. import _native
from ..metadata import ShardMetadata
from ..sharding_spec.api import (
    ShardingSpec,
    _dispatch_custom_op,
    _has_custom_op,
    _infer_sharding_spec_from_shards_metadata,
)
from . import _from_local, _movement, _packing
from ._checkpoint import _DCPCheckpointable
from .metadata import ShardedTensorMetadata, TensorProperties
from .shard import Shard
from .utils import _PlacementResolver

__all__ = ["ShardedTensor", "ShardedTensorBase"]

_ops = torch.ops.torch_shard

# ShardedTensors created with init_rrefs=True, by per-process id, so RPC peers can hand them RRefs.
_sharded_tensor_lock = threading.Lock()
_sharded_tensor_current_id = 0
_sharded_tensor_map: dict[int, weakref.ReferenceType] = {}

# Op tables consulted by __torch_function__: built-in implementations and user overrides.
_SHARDED_OPS: dict[Callable, Callable] = {}
_CUSTOM_SHARDED_OPS: dict[Callable, Callable] = {}


def _register_remote_shards(sharded_tensor_id: int, rrefs: list[rpc.RRef[Shard]], rpc_rank: int):
    """RPC target: record ``rpc_rank``'s shards (as RRefs) on this process's copy of a tensor."""
    with _sharded_tensor_lock:
        if sharded_tensor_id not in _sharded_tensor_map:
            raise RuntimeError(
                f"Could not find sharded_tensor_id: {sharded_tensor_id} in map: "
                f"{_sharded_tensor_map.keys()}"
            )
        sharded_tensor = _sharded_tensor_map[sharded_tensor_id]()
        if sharded_tensor is None:
            raise RuntimeError("ShardedTensor weakref has been deallocated")
    sharded_tensor._register_remote_shards(rrefs, rpc_rank)


@dataclass
class ProcessGroupState:
    """Ranks and world sizes at save time, checked again when a ShardedTensor is loaded."""

    local_rank: int
    global_rank: int
    local_world_size: int
    global_world_size: int


def _rebuild_sharded_tensor(
    cls: type,
    local_tensors: list[torch.Tensor],
    local_indices: list[int],
    packed_shards: tuple,
    size: tuple,
    properties: TensorProperties,
    pg_state: ProcessGroupState,
    sharding_spec: ShardingSpec,
    init_rrefs: bool,
) -> ShardedTensor:
    """Unpickle a ShardedTensor: the same ranks must load what they saved (each rank's file holds only
    its local shards). The process group is the one set by ``load_with_process_group``, else the
    default group."""
    from ..api import _get_current_process_group

    if not distributed_c10d.is_initialized():
        raise RuntimeError(
            'Need to initialize default process group using "init_process_group" before loading '
            "ShardedTensor"
        )
    pg = _get_current_process_group()
    now = ProcessGroupState(
        dist.get_rank(pg), dist.get_rank(), dist.get_world_size(pg), dist.get_world_size()
    )
    for field, label in (
        ("local_rank", "Local rank"),
        ("global_rank", "Global rank"),
        ("local_world_size", "Local world size"),
        ("global_world_size", "Global world size"),
    ):
        saved, current = getattr(pg_state, field), getattr(now, field)
        if saved != current:
            raise RuntimeError(f"{label} at save time was {saved}, but at load time was {current}")
    shards_md = _packing.unpack_shards(packed_shards)
    metadata = ShardedTensorMetadata(shards_md, torch.Size(size), properties)
    local_shards = [Shard(tensor, shards_md[idx]) for tensor, idx in zip(local_tensors, local_indices)]
    st = cls._from_parts(local_shards, list(local_indices), metadata, sharding_spec, pg)
    st._post_init(init_rrefs)
    return st


def _flatten_tensor_size(size) -> torch.Size:
    """torch.Size from ``(10, 20)``, ``((10, 20),)`` or ``([10, 20],)``; TypeError for non-ints."""
    if len(size) == 1 and isinstance(size[0], collections.abc.Sequence):
        dims = list(size[0])
    else:
        dims = list(size)
    for dim in dims:
        if not isinstance(dim, int):
            raise TypeError(f"size has to be a sequence of ints, found: {dims}")
    return torch.Size(dims)


def _preferred_device(process_group) -> torch.device:
    """Device for a rank's bookkeeping when it holds no shard: cpu for gloo, the current GPU for NCCL."""
    if process_group is None or distributed_c10d._rank_not_in_group(process_group):
        return torch.device("cpu")
    backend = dist.get_backend(process_group)
    if backend == dist.Backend.NCCL and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _owner_ranks(shards_md: list[ShardMetadata], process_group) -> list[int]:
    """Owner of each shard as a rank of ``process_group`` (-1 for no placement rank or outside the
    group); global ranks as they are when there is no group."""
    resolver = _PlacementResolver(process_group) if process_group is not None else None
    owners = []
    for md in shards_md:
        rank = md.placement.rank() if md.placement is not None else None
        if rank is None:
            owners.append(-1)
        else:
            owners.append(resolver.group_rank(rank) if resolver is not None else rank)
    return owners


def _group_name(process_group) -> str:
    if process_group is None or distributed_c10d._rank_not_in_group(process_group):
        return ""
    return process_group.group_name


def _incompatible(expected, actual, prop_name: str, rank: int, is_property: bool = False) -> None:
    if expected == actual:
        return
    against = "tensor property" if is_property else "local ShardMetadata"
    raise ValueError(
        f"Local shards' tensor {prop_name} property is incompatible with {against} on rank {rank}: "
        f"{against} {prop_name}={expected}, local shard tensor {prop_name}={actual}."
    )


def _create_tensor_from_params(*size, local_device, tensor_properties: TensorProperties):
    """An uninitialised dense tensor of ``size`` with ``tensor_properties`` on ``local_device``."""
    return torch.empty(
        *size,
        dtype=tensor_properties.dtype,
        layout=tensor_properties.layout,
        device=local_device,
        requires_grad=tensor_properties.requires_grad,
        memory_format=tensor_properties.memory_format,
        pin_memory=tensor_properties.pin_memory,
    )


def _match_local_indices(local_shards: list[Shard], shards_metadata: list[ShardMetadata]) -> list[int]:
    """Index into ``shards_metadata`` of each local shard, matched by offsets and sizes (in order when
    several entries share a box, as empty shards may)."""
    by_box: dict[tuple, list[int]] = {}
    for idx, md in enumerate(shards_metadata):
        by_box.setdefault((tuple(md.shard_offsets), tuple(md.shard_sizes)), []).append(idx)
    indices = []
    for shard in local_shards:
        md = shard.metadata
        candidates = by_box.get((tuple(md.shard_offsets), tuple(md.shard_sizes)))
        if not candidates:
            raise ValueError(
                f"Local shard {md} is not one of the shards in the global metadata"
            )
        indices.append(candidates.pop(0))
    return indices


class ShardedTensorBase(torch.Tensor):
    """A tensor whose data is split into shards held by different ranks.

    The object is a ``torch.Tensor`` whose TensorImpl is the C++ ``ShardedTensorImpl``: it reports the
    global size, dtype and layout, owns no storage, and carries this rank's local shards and the global
    shard layout, so C++ kernels reach the shards without Python. The Python object additionally keeps
    the sharding spec and :class:`ShardedTensorMetadata` objects users inspect.
    """

    _sharding_spec: ShardingSpec
    _metadata: ShardedTensorMetadata
    _local_shards: list[Shard]

    def __new__(cls, sharding_spec: ShardingSpec, *size, **kwargs):
        if not isinstance(sharding_spec, ShardingSpec):
            raise ValueError(f"Expecting ShardingSpec but got: {type(sharding_spec)}")
        sizes = _flatten_tensor_size(size)
        dtype = kwargs.get("dtype")
        properties = TensorProperties(
            dtype=dtype if dtype is not None else torch.get_default_dtype(),
            layout=kwargs.get("layout", torch.strided),
            requires_grad=kwargs.get("requires_grad", False),
            memory_format=kwargs.get("memory_format", torch.contiguous_format),
            pin_memory=kwargs.get("pin_memory", False),
        )
        metadata = sharding_spec.build_metadata(sizes, properties)
        return cls._from_parts([], [], metadata, sharding_spec, None, torch.device("cpu"))

    def __init__(self, *args, **kwargs):
        # Everything happens in __new__: the C++ impl needs its shards when it is created.
        pass

    @classmethod
    def _from_parts(
        cls,
        local_shards: list[Shard],
        local_indices: list[int] | None,
        metadata: ShardedTensorMetadata,
        sharding_spec: ShardingSpec | None,
        process_group,
        device: torch.device | None = None,
        shard_ranks: list[int] | None = None,
    ):
        """Build the C++ impl and wrap it. No validation beyond what the impl itself checks."""
        shards_md = metadata.shards_metadata
        if local_indices is None:
            local_indices = _match_local_indices(local_shards, shards_md)
        if device is None:
            device = local_shards[0].tensor.device if local_shards else _preferred_device(process_group)
        if shard_ranks is None:
            shard_ranks = _owner_ranks(shards_md, process_group)
        offsets, sizes = _native.shard_box_tensors(shards_md)
        props = metadata.tensor_properties
        raw = _ops._make_sharded(
            [shard.tensor for shard in local_shards],
            local_indices,
            list(metadata.size),
            offsets,
            sizes,
            shard_ranks,
            props.dtype,
            device,
            props.pin_memory,
            _group_name(process_group),
        )
        obj = torch.Tensor._make_subclass(cls, raw, props.requires_grad)
        obj._sharding_spec = (
            sharding_spec if sharding_spec is not None else _infer_sharding_spec_from_shards_metadata(shards_md)
        )
        obj._metadata = metadata
        obj._local_shards = local_shards
        obj._process_group = process_group
        obj._init_rrefs = False
        obj._remote_shards = {}
        obj._sharded_tensor_id = None
        return obj

    @classmethod
    def _init_from_local_shards_and_global_metadata(
        cls,
        local_shards: list[Shard],
        sharded_tensor_metadata: ShardedTensorMetadata,
        sharding_spec: ShardingSpec | None = None,
    ) -> ShardedTensorBase:
        """Build a ShardedTensorBase from local shards and complete global metadata, without a
        process group and without per-shard checks (local shards may be non-contiguous views).

        The global layout is still validated (no overlap, full coverage of the size).
        """
        shards_metadata = sharded_tensor_metadata.shards_metadata
        if len(shards_metadata) == 0:
            raise ValueError("shards_metadata must not be empty!")
        if sharded_tensor_metadata.tensor_properties.layout != torch.strided:
            raise ValueError("Only torch.strided layout is currently supported")
        _native.validate_shards(shards_metadata, sharded_tensor_metadata.size)
        return cls._from_parts(local_shards, None, sharded_tensor_metadata, sharding_spec, None)

    def _shallow_rewrap(self, raw: torch.Tensor, requires_grad: bool):
        """A new Python ShardedTensor over ``raw`` (a detached copy of this impl) sharing the metadata."""
        obj = torch.Tensor._make_subclass(type(self), raw, requires_grad)
        for name in ("_sharding_spec", "_metadata", "_local_shards", "_process_group", "_init_rrefs", "_remote_shards"):
            setattr(obj, name, getattr(self, name, None))
        obj._sharded_tensor_id = None
        return obj

    def metadata(self) -> ShardedTensorMetadata:
        """Global metadata: every shard's offsets, sizes and placement, the size and properties."""
        return self._metadata

    def local_shards(self) -> list[Shard]:
        """The shards this rank holds (possibly none, possibly several)."""
        return self._local_shards

    def sharding_spec(self) -> ShardingSpec:
        """The spec this tensor is sharded by."""
        return self._sharding_spec

    def is_pinned(self) -> bool:  # type: ignore[override]
        """Whether the shards were created in pinned memory (from the tensor properties)."""
        return self._metadata.tensor_properties.pin_memory

    def __hash__(self):
        return id(self)

    def __repr__(self):  # type: ignore[override]
        return f"ShardedTensor({self._metadata})"

    def __format__(self, format_spec):
        return repr(self)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if torch.compiler.is_compiling():
            # A C++ impl holding per-rank shards cannot be fakeified or traced (TENSORIMPL_NOTES B.7).
            raise RuntimeError("ShardedTensor is not supported under torch.compile / export")
        kwargs = kwargs or {}
        if _is_own_op(func):
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)

        st = _first_sharded_tensor(args, kwargs)
        pg = getattr(st, "_process_group", None)
        if func in _CUSTOM_SHARDED_OPS:
            return _CUSTOM_SHARDED_OPS[func](types, args, kwargs, pg)
        if st is not None and _has_custom_op(st._sharding_spec, func):
            return _dispatch_custom_op(st._sharding_spec, func, types, args, kwargs, pg)
        if func in _SHARDED_OPS:
            return _SHARDED_OPS[func](types, args, kwargs, pg)
        raise RuntimeError(
            f"torch function '{func.__name__}', with args: {args} and kwargs: {kwargs} not supported "
            f"for ShardedTensor!"
        )

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # Reached by ATen calls from C++ (autograd internals, _make_subclass, dispatch modes). The only
        # one a ShardedTensor answers here is detach; see NOTE [ ShardedTensorImpl detach ] in
        # csrc/sharded_tensor_impl.cpp. Everything else gets the same error as __torch_function__.
        kwargs = kwargs or {}
        if func is torch.ops.aten.detach.default:
            (src,) = args
            with torch._C.DisableTorchFunctionSubclass(), torch._C._DisableTorchDispatch():
                raw = func(src)
            return src._shallow_rewrap(raw, False)
        raise RuntimeError(
            f"torch function '{func}', with args: {args} and kwargs: {kwargs} not supported "
            f"for ShardedTensor!"
        )


def _is_own_op(func) -> bool:
    # torch.ops.torch_shard.* calls with ShardedTensor arguments reach __torch_function__ too; they are
    # our C++ kernels and must run on the ShardedTensor itself.
    if isinstance(func, torch._ops.OpOverload):
        return func.namespace == "torch_shard"
    if isinstance(func, torch._ops.OpOverloadPacket):
        return func._qualified_op_name.startswith("torch_shard::")
    return False


def _first_sharded_tensor(args, kwargs):
    if args and isinstance(args[0], ShardedTensorBase):
        return args[0]
    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, ShardedTensorBase):
            return leaf
    return None


class ShardedTensor(ShardedTensorBase, _DCPCheckpointable):
    """A tensor sharded across the ranks of a process group (``torch.distributed._shard``'s API).

    Usually built through :mod:`torch_shard.sharded_tensor` constructors (``empty``, ``ones``,
    ``rand``, ...), not directly.

    Args:
        sharding_spec (ShardingSpec): how to shard the tensor.
        size (int...): the global size, as varargs or one list/tuple/torch.Size.

    Keyword args:
        dtype (torch.dtype, optional): defaults to ``torch.get_default_dtype()``.
        layout (torch.layout): only ``torch.strided``.
        requires_grad (bool): whether autograd records operations on the returned tensor.
        pin_memory (bool): allocate the CPU shards in pinned memory (needs an accelerator).
        memory_format (torch.memory_format): only ``torch.contiguous_format``.
        process_group (ProcessGroup, optional): defaults to the default group. Placements name
            GLOBAL ranks, which must belong to this group.
        init_rrefs (bool): build RRefs to every remote shard (needs ``torch.distributed.rpc``); this
            makes construction collective.

    Each rank allocates only the shards placed on it; without ``init_rrefs`` construction does not
    communicate.
    """

    def __new__(
        cls,
        sharding_spec: ShardingSpec,
        *size,
        dtype: torch.dtype | None = None,
        layout: torch.layout = torch.strided,
        requires_grad: bool = False,
        pin_memory: bool = False,
        memory_format: torch.memory_format = torch.contiguous_format,
        process_group=None,
        init_rrefs: bool = False,
    ):
        if not isinstance(sharding_spec, ShardingSpec):
            raise ValueError(f"Expecting ShardingSpec but got: {type(sharding_spec)}")
        sizes = _flatten_tensor_size(size)
        properties = TensorProperties(
            dtype=dtype if dtype is not None else torch.get_default_dtype(),
            layout=layout,
            requires_grad=requires_grad,
            memory_format=memory_format,
            pin_memory=pin_memory,
        )
        # Spec errors ("Invalid sharding dim") come first, as upstream.
        metadata = sharding_spec.build_metadata(sizes, properties)
        if layout != torch.strided:
            raise ValueError("Only torch.strided layout is currently supported")
        if memory_format != torch.contiguous_format:
            raise ValueError("Only torch.contiguous_format memory_format is currently supported")

        process_group = process_group if process_group is not None else distributed_c10d._get_default_group()
        resolve = _PlacementResolver(process_group)
        my_rank = dist.get_rank()
        local_shards: list[Shard] = []
        local_indices: list[int] = []
        shard_ranks: list[int] = []
        for idx, shard_md in enumerate(metadata.shards_metadata):
            rank, device = resolve(shard_md.placement)
            shard_ranks.append(resolve.group_rank(rank))
            if rank == my_rank:
                tensor = _create_tensor_from_params(
                    *shard_md.shard_sizes, local_device=device, tensor_properties=properties
                )
                local_shards.append(Shard(tensor=tensor, metadata=shard_md))
                local_indices.append(idx)
        st = cls._from_parts(
            local_shards, local_indices, metadata, sharding_spec, process_group, shard_ranks=shard_ranks
        )
        st._post_init(init_rrefs)
        return st

    @classmethod
    def _init_from_local_shards(
        cls, local_shards: list[Shard], *global_size, process_group=None, init_rrefs: bool = False
    ) -> ShardedTensor:
        """Assemble a ShardedTensor from the shards every rank holds (collective, one exchange).

        ``global_size`` may contain None: then the shards (one per rank) are laid out row-wise in rank
        order and the size is recomputed. Errors are raised on every rank together.
        """
        pg = process_group if process_group is not None else distributed_c10d._get_default_group()
        metadata, local_indices = _from_local.gather_global_metadata(local_shards, global_size, pg)
        spec = _infer_sharding_spec_from_shards_metadata(metadata.shards_metadata)
        st = cls._from_parts(local_shards, local_indices, metadata, spec, pg)
        st._post_init(init_rrefs)
        return st

    @classmethod
    def _init_from_local_tensor(
        cls,
        local_tensor: torch.Tensor,
        sharding_spec: ShardingSpec,
        *global_size,
        process_group=None,
        init_rrefs: bool = False,
    ) -> ShardedTensor:
        """Wrap this rank's ``local_tensor`` as its shard(s) of a tensor of ``global_size`` sharded by
        ``sharding_spec`` (no communication unless ``init_rrefs``)."""
        if not local_tensor.is_contiguous():
            raise ValueError("local_tensor is not a contiguous Tensor.")
        sizes = _flatten_tensor_size(global_size)
        properties = TensorProperties.create_from_tensor(local_tensor)
        metadata = sharding_spec.build_metadata(sizes, properties)
        pg = process_group if process_group is not None else distributed_c10d._get_default_group()
        resolve = _PlacementResolver(pg)
        current_rank = dist.get_rank()
        local_shards = [
            Shard(tensor=local_tensor, metadata=md)
            for md in metadata.shards_metadata
            if resolve(md.placement)[0] == current_rank
        ]
        return cls._init_from_local_shards_and_global_metadata(
            local_shards, metadata, process_group=pg, init_rrefs=init_rrefs, sharding_spec=sharding_spec
        )

    @classmethod
    def _init_from_local_shards_and_global_metadata(  # type: ignore[override]
        cls,
        local_shards: list[Shard],
        sharded_tensor_metadata: ShardedTensorMetadata,
        process_group=None,
        init_rrefs: bool = False,
        sharding_spec: ShardingSpec | None = None,
    ) -> ShardedTensor:
        """Build a ShardedTensor from this rank's shards and the complete global metadata, with no
        communication: every local shard is checked against the metadata, and the layout against the
        global size. Each rank trusts its own copy of the metadata."""
        pg = process_group if process_group is not None else distributed_c10d._get_default_group()
        current_rank = dist.get_rank()
        shards_metadata = sharded_tensor_metadata.shards_metadata
        properties = sharded_tensor_metadata.tensor_properties
        resolve = _PlacementResolver(pg)
        local_count = sum(1 for md in shards_metadata if resolve(md.placement)[0] == current_rank)
        if len(local_shards) != local_count:
            raise RuntimeError(
                f"Number of local shards ({len(local_shards)}) does not match number of local shards "
                f"metadata in sharded_tensor_metadata ({local_count}) on rank ({current_rank}) "
            )
        if len(shards_metadata) == 0:
            raise ValueError("shards_metadata must not be empty!")
        if properties.layout != torch.strided:
            raise ValueError("Only torch.strided layout is currently supported")
        for local_shard in local_shards:
            md, tensor = local_shard.metadata, local_shard.tensor
            if md.placement is None:
                raise AssertionError("Must specify placement for `Shard`!")
            rank, device = md.placement.rank(), md.placement.device()
            _incompatible(properties.layout, tensor.layout, "layout", rank, True)
            if not tensor.is_contiguous():
                raise ValueError("Only torch.contiguous_format memory_format is currently supported")
            _incompatible(md.shard_sizes, list(tensor.size()), "size", rank)
            _incompatible(properties.pin_memory, tensor.is_pinned(), "pin_memory", rank, True)
            _incompatible(device, tensor.device, "device", rank)
            _incompatible(properties.dtype, tensor.dtype, "dtype", rank, True)
            _incompatible(properties.requires_grad, tensor.requires_grad, "requires_grad", rank, True)
        _native.validate_shards(shards_metadata, sharded_tensor_metadata.size)
        st = cls._from_parts(local_shards, None, sharded_tensor_metadata, sharding_spec, pg)
        st._post_init(init_rrefs)
        return st

    def _post_init(self, init_rrefs: bool) -> None:
        self._init_rrefs = init_rrefs
        if not init_rrefs:
            return
        global _sharded_tensor_current_id
        with _sharded_tensor_lock:
            self._sharded_tensor_id = _sharded_tensor_current_id
            _sharded_tensor_map[self._sharded_tensor_id] = weakref.ref(self)
            _sharded_tensor_current_id += 1
        if not rpc._is_current_rpc_agent_set():
            raise RuntimeError(
                "RPC Framework needs to be initialized using torch.distributed.rpc.init_rpc if "
                "init_rrefs is set to True"
            )
        self._init_rpc()

    def __del__(self):
        sharded_tensor_id = self.__dict__.get("_sharded_tensor_id")
        if sharded_tensor_id is None:
            return
        with _sharded_tensor_lock:
            _sharded_tensor_map.pop(sharded_tensor_id, None)

    def _init_rpc(self) -> None:
        """Exchange RRefs to local shards with every other rank (collective over all RPC workers)."""
        pg_rank = dist.get_rank()
        rpc_rank = rpc.get_worker_info().id
        if pg_rank != rpc_rank:
            raise ValueError(
                f"Default ProcessGroup and RPC ranks must be the same for ShardedTensor, found "
                f"process group rank: {pg_rank} and RPC rank: {rpc_rank}"
            )
        self._remote_shards = {}
        # Ids differ per process; learn every worker's id for this tensor.
        worker_infos = rpc._get_current_rpc_agent().get_worker_infos()
        rank_to_name = {info.id: info.name for info in worker_infos}
        all_ids = rpc.api._all_gather(self._sharded_tensor_id)
        if self._local_shards:
            rrefs: list[rpc.RRef[Shard]] = [rpc.RRef(shard) for shard in self._local_shards]
            futures = [
                rpc.rpc_async(
                    rank,
                    _register_remote_shards,
                    args=(all_ids[rank_to_name[rank]], rrefs, pg_rank),
                )
                for rank in range(dist.get_world_size())
                if rank != pg_rank
            ]
            torch.futures.wait_all(futures)
        # Nobody may ask for remote shards before everyone has registered theirs.
        rpc.api._all_gather(None)

    def _register_remote_shards(self, remote_shards: list[rpc.RRef[Shard]], rpc_rank: int) -> None:
        self._remote_shards[rpc_rank] = remote_shards

    def remote_shards(self) -> dict[int, list[rpc.RRef[Shard]]]:
        """RRefs to the shards of every other rank that holds shards, keyed by that rank."""
        if not self._init_rrefs:
            raise RuntimeError(
                "ShardedTensor created with init_rrefs=False, no RRefs to remote shards available"
            )
        return self._remote_shards

    def local_tensor(self) -> torch.Tensor:
        """This rank's only local shard as a dense tensor."""
        if len(self._local_shards) != 1:
            raise NotImplementedError("Only single local shard is supported.")
        return self._local_shards[0].tensor

    def gather(
        self,
        dst: int = 0,
        out: torch.Tensor | None = None,
        enforce_dtype: bool = False,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Assemble the whole tensor into ``out`` on rank ``dst`` of the tensor's process group.

        Collective: every rank calls it; ``out`` is given on ``dst`` only. Each rank sends exactly its
        shards, in their own dtype (no padding to the largest rank, no float32 staging), and ``dst``
        receives straight into ``out`` when the shards tile its memory in rank order (row chunks).

        Args:
            dst (int): rank (in the tensor's process group) that receives the tensor.
            out (torch.Tensor, optional): on ``dst``, a tensor of the global size; values are written
                in ``out``'s dtype. Must be None on every other rank.
            enforce_dtype (bool): deprecated, accepted for compatibility (the transfer is lossless).
            dtype (torch.dtype, optional): if given, ``out`` must have this dtype.
        """
        _movement.gather(self, dst, out, enforce_dtype, dtype)

    def reshard(self, resharding_spec: ShardingSpec) -> ShardedTensor:
        """Move this tensor to the layout of ``resharding_spec``, in place; returns ``self``.

        Any layout to any layout: chunk or enumerable specs on any dims, several shards per rank,
        empty shards, placements on a subset of ranks, any permutation of placements. Only the
        elements that change owner cross the network, in one all-to-all; the rest are copied locally.
        The new metadata lists shards in rank order, as upstream does.
        """
        return _movement.reshard(self, resharding_spec)

    def _with_local_shards(self, local_shards: list[Shard], metadata: ShardedTensorMetadata, init_rrefs: bool):
        """A new ShardedTensor with the same layout, process group and spec over ``local_shards``."""
        st = type(self)._from_parts(
            local_shards,
            list(_ops._local_shard_indices(self)),
            metadata,
            self._sharding_spec,
            self._process_group,
            shard_ranks=list(_ops._shard_layout(self)[2]),
        )
        st._post_init(init_rrefs)
        return st

    def __reduce_ex__(self, protocol):
        # Tensor.__reduce_ex__ would read storage. A ShardedTensor pickles as its local shards (plain
        # tensors, so torch.save writes only this rank's data), its metadata and spec, and the ranks
        # it was saved from, checked on load.
        pg = self._process_group
        pg_state = ProcessGroupState(
            dist.get_rank(pg), dist.get_rank(), dist.get_world_size(pg), dist.get_world_size()
        )
        return (
            _rebuild_sharded_tensor,
            (
                type(self),
                [shard.tensor for shard in self._local_shards],
                list(_ops._local_shard_indices(self)),
                _packing.pack_shards(self._metadata.shards_metadata),
                tuple(self._metadata.size),
                self._metadata.tensor_properties,
                pg_state,
                self._sharding_spec,
                self._init_rrefs,
            ),
        )

    def cpu(
        self, memory_format: torch.memory_format = torch.preserve_format, process_group=None
    ) -> ShardedTensor:
        """This tensor with every shard on the CPU (``self`` when all placements already are)."""
        if memory_format not in (torch.preserve_format, torch.contiguous_format):
            raise RuntimeError("Only `torch.contiguous_format` or `torch.preserve_format` is supported!")
        if all(md.placement.device().type == "cpu" for md in self._metadata.shards_metadata):
            return self
        return self._moved(torch.device("cpu"), self.dtype, process_group, non_blocking=False)

    def cuda(
        self,
        device=None,
        non_blocking: bool = False,
        memory_format: torch.memory_format = torch.preserve_format,
        process_group=None,
    ) -> ShardedTensor:
        """A new ShardedTensor with every shard on this rank's current CUDA device."""
        if memory_format not in (torch.preserve_format, torch.contiguous_format):
            raise RuntimeError("Only `torch.contiguous_format` or `torch.preserve_format` is supported!")
        if device is not None:
            device = torch.device(device) if not isinstance(device, torch.device) else device
            if device.index is not None and device.index != torch.cuda.current_device():
                raise AssertionError(
                    'Only device without device id (e.g. "cpu" or "cuda") is expected for ShardedTensor!'
                )
        current = torch.device("cuda", torch.cuda.current_device())
        return self._moved(current, self.dtype, process_group, non_blocking=non_blocking)

    def to(self, *args, **kwargs) -> ShardedTensor:  # type: ignore[override]
        """Convert dtype and/or device, as ``Tensor.to``: ``to(dtype)``, ``to(device)``,
        ``to(device, dtype)``, ``to(tensor)``, or keywords ``dtype``, ``device``, ``copy``,
        ``non_blocking``, ``memory_format``, ``process_group``. A CUDA target is this rank's current
        device. Returns ``self`` when nothing changes and ``copy`` is False."""
        current_device = self._local_shards[0].tensor.device if self._local_shards else _preferred_device(self._process_group)
        current_dtype = self.dtype
        device_to, dtype_to = current_device, current_dtype
        if len(args) == 1:
            if isinstance(args[0], torch.dtype):
                dtype_to = args[0]
            elif isinstance(args[0], torch.device):
                device_to = args[0]
            elif isinstance(args[0], (str, int)):
                device_to = torch.device(args[0])
            elif isinstance(args[0], torch.Tensor):
                dtype_to, device_to = args[0].dtype, args[0].device
            else:
                raise RuntimeError(f"ShardedTensor.to() have wrong arguments: {args}")
        elif len(args) == 2:
            device_to, dtype_to = args
        elif len(args) > 2:
            raise RuntimeError(f"ShardedTensor.to() have wrong arguments: {args}")
        dtype_to = kwargs.get("dtype", dtype_to)
        device_to = kwargs.get("device", device_to)
        device_to = torch.device(device_to) if isinstance(device_to, (str, int)) else device_to
        if device_to.type == "cuda":
            current_idx = torch.cuda.current_device()
            if device_to.index != current_idx:
                warnings.warn(
                    "ShardedTensor.to only move tensor to its current device"
                    "If you want to put to different device, use `reshard` instead.",
                    stacklevel=2,
                )
            device_to = torch.device("cuda", current_idx)
        copy_tensor = kwargs.get("copy", False)
        non_blocking = kwargs.get("non_blocking", False)
        memory_format = kwargs.get("memory_format", torch.preserve_format)
        if memory_format not in (torch.preserve_format, torch.contiguous_format):
            raise RuntimeError("Only `torch.contiguous_format` or `torch.preserve_format` is supported!")
        process_group = kwargs.get("process_group")
        if not copy_tensor and dtype_to == current_dtype and device_to == current_device:
            return self
        return self._moved(device_to, dtype_to, process_group, non_blocking=non_blocking)

    def _moved(self, device, dtype, process_group, non_blocking: bool) -> ShardedTensor:
        """A new ShardedTensor with local shards converted to ``device``/``dtype`` and every placement
        in the metadata rewritten to ``device``'s type (ranks kept)."""
        local_shards = []
        for shard in self._local_shards:
            tensor = shard.tensor.to(device=device, dtype=dtype, non_blocking=non_blocking)
            md = copy.deepcopy(shard.metadata)
            md.placement._device = tensor.device
            local_shards.append(Shard(tensor, md))
        metadata = copy.deepcopy(self._metadata)
        metadata.tensor_properties.dtype = dtype
        for md in metadata.shards_metadata:
            placement_device = md.placement.device()
            if placement_device.type != device.type:
                md.placement._device = device if device.type != "cuda" else torch.device("cuda", device.index)
        # A ChunkShardingSpec stays a ChunkShardingSpec with the rewritten placements.
        pg = process_group if process_group is not None else self._process_group
        st = type(self)._init_from_local_shards_and_global_metadata(
            local_shards, metadata, process_group=pg, init_rrefs=self._init_rrefs
        )
        return st

    def __deepcopy__(self, memo):
        # Tensor.__deepcopy__ would read storage; deep-copy shards and metadata, share the group.
        local_shards = copy.deepcopy(self._local_shards, memo)
        metadata = copy.deepcopy(self._metadata, memo)
        return self._with_local_shards(local_shards, metadata, self._init_rrefs)
