"""ShardedTensorBase and ShardedTensor: torch.Tensor subclasses backed by a C++ ShardedTensorImpl.

The class is assembled from one module per concern:

* this module: the classes, their state accessors (read from the C++ impl), the op tables and
  ``__torch_function__`` / ``__torch_dispatch__``, gather and reshard;
* ``_construction``: building from a spec, from local shards, from a local tensor;
* ``_rpc``: the registry of tensors built with ``init_rrefs=True`` and their remote shards;
* ``_pickling``: pickling, ``torch.save`` / ``torch.load`` and deepcopy;
* ``_device``: ``cpu()``, ``cuda()``, ``to()``;
* ``_checkpoint``: the torch.distributed.checkpoint protocol;
* ``_state``: the Python views (metadata, local shards) of the C++ state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .. import _C  # noqa: F401  (registers torch.ops.torch_shard)
from .._support import _compile
from .._support import _torch_private as private
from .._support._tensor_metadata import ShardedTensorMetadata, TensorProperties
from ..common_op_utils import _register_sharded_type
from ..metadata import ShardMetadata  # noqa: F401  (upstream's api module exports it)
from ..sharding_spec.api import ShardingSpec, _dispatch_custom_op, _has_custom_op, _register_scatter
from . import _construction, _from_local, _movement, _state
from ._checkpoint import (
    _DCPCheckpointable,
    _GroupHandle,
    _install_staged_shards,
    _LocalShardsForStaging,
    _StagedLocalShards,
)
from ._construction import _create_tensor_from_params, _flatten_tensor_size  # noqa: F401  (upstream names)
from ._device import _DeviceMoves
from ._pickling import ProcessGroupState, _Pickling, _rebuild_sharded_tensor  # noqa: F401
from ._rpc import _register_remote_shards, _RemoteShards, _sharded_tensor_map  # noqa: F401
from .shard import Shard

__all__ = ["ShardedTensor", "ShardedTensorBase"]

_ops = torch.ops.torch_shard

# Op tables consulted by __torch_function__: built-in implementations and user overrides.
_SHARDED_OPS: dict[Callable, Callable] = {}
_CUSTOM_SHARDED_OPS: dict[Callable, Callable] = {}
# Getters the impl answers by itself (filled by _ops/_common.py).
_PASSTHROUGH_OPS: dict[Callable, Callable] = {}


class ShardedTensorBase(torch.Tensor):
    """A tensor whose data is split into shards held by different ranks.

    The object is a ``torch.Tensor`` whose TensorImpl is the C++ ``ShardedTensorImpl``: it reports the
    global size, dtype and layout, owns no storage, and is the only store of the shard layout and this
    rank's local shards. :meth:`metadata` and :meth:`local_shards` are views of it; the Python object
    adds the sharding spec it was built with and the process group handle.
    """

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
        return _construction.build(cls, [], [], metadata, sharding_spec, None, validate=False)

    def __init__(self, *args, **kwargs):
        # Everything happens in __new__: the C++ impl needs its shards when it is created.
        pass

    def _init_python_state(self, process_group) -> None:
        """The Python-only fields: the spec handle (see ``_state.sharding_spec``), the group handle,
        the cached views of the impl, RPC bookkeeping."""
        self._state_view = None
        self._sharding_spec = None
        self._spec_layout_serial = None
        self.__dict__["_group"] = _GroupHandle(process_group)
        self._init_rrefs = False
        self._remote_shards = {}
        self._sharded_tensor_id = None
        # NOTE [ Staging a ShardedTensor with DCP's default stager ] (_checkpoint.py)
        self.__dict__["_staged_shards"] = _LocalShardsForStaging(self)

    @property
    def _process_group(self):
        handle = self.__dict__.get("_group")
        return handle.group if handle is not None else None

    @_process_group.setter
    def _process_group(self, group) -> None:
        self.__dict__["_group"] = _GroupHandle(group)

    @property
    def _staged_shards(self):
        return self.__dict__.get("_staged_shards")

    @_staged_shards.setter
    def _staged_shards(self, value) -> None:
        # DCP's stager sets the staged copy of the original's entry on the new ShardedTensor.
        if isinstance(value, _StagedLocalShards):
            _install_staged_shards(self, value)
        else:
            self.__dict__["_staged_shards"] = value

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
        return _construction.build(cls, local_shards, None, sharded_tensor_metadata, sharding_spec, None)

    def _shallow_rewrap(self, raw: torch.Tensor, requires_grad: bool):
        """A new Python ShardedTensor over ``raw`` (a detached copy of this impl: same layout, same
        shard tensors), with this tensor's spec and process group."""
        obj = private.make_subclass(type(self), raw, requires_grad)
        obj._init_python_state(self._process_group)
        _state.set_spec(obj, self.sharding_spec())
        obj._init_rrefs = self._init_rrefs
        obj._remote_shards = self._remote_shards
        return obj

    # --- state: read from the C++ impl ----------------------------------------------------------------

    def metadata(self) -> ShardedTensorMetadata:
        """Global metadata: every shard's offsets, sizes and placement, the size and properties."""
        return _state.metadata(self)

    def local_shards(self) -> list[Shard]:
        """The shards this rank holds (possibly none, possibly several).

        Assigning ``local_shards()[i].tensor = t`` replaces that shard's tensor (``t`` must have the
        shard's size and the tensor's dtype).
        """
        return _state.local_shards(self)

    @property
    def _local_shards(self) -> list[Shard]:
        # Upstream's attribute; code written for upstream reads and assigns it.
        return _state.local_shards(self)

    @_local_shards.setter
    def _local_shards(self, shards: list[Shard]) -> None:
        _state.replace_local_shards(self, list(shards))

    @property
    def _metadata(self) -> ShardedTensorMetadata:
        return _state.metadata(self)

    def sharding_spec(self) -> ShardingSpec:
        """The spec this tensor is sharded by."""
        return _state.sharding_spec(self)

    def _write_local_tensor(self, shard, tensor: torch.Tensor) -> None:
        _state.write_local_tensor(self, shard, tensor)

    def is_pinned(self) -> bool:  # type: ignore[override]
        """Whether the shards were created in pinned memory (from the tensor properties)."""
        return _state.read_state(self).pin_memory

    def __hash__(self):
        return id(self)

    def __repr__(self):  # type: ignore[override]
        return f"ShardedTensor({self.metadata()})"

    def __format__(self, format_spec):
        return repr(self)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if torch.compiler.is_compiling():
            # Dynamo never traces this method (NOTE [ ShardedTensor under torch.compile ]); other
            # tracers (non-strict export) must not either.
            raise RuntimeError("ShardedTensor is not supported under torch.compile / export")
        kwargs = kwargs or {}
        if _is_own_op(func):
            with private.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)

        st = _first_sharded_tensor(args, kwargs)
        pg = getattr(st, "_process_group", None)
        if func in _CUSTOM_SHARDED_OPS:
            return _CUSTOM_SHARDED_OPS[func](types, args, kwargs, pg)
        if func in _PASSTHROUGH_OPS:
            # size(), dtype, requires_grad, ...: answered by the impl itself, never overridden per spec
            # (and needed to build the spec, so they must not ask for it).
            return _PASSTHROUGH_OPS[func](types, args, kwargs, pg)
        if st is not None and _has_custom_op(st.sharding_spec(), func):
            return _dispatch_custom_op(st.sharding_spec(), func, types, args, kwargs, pg)
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
        if func.namespace == "torch_shard":
            # Our own kernels, called below the autograd keys (e.g. by repr() of an argument while
            # this method formats an error): they are registered for the backend keys too.
            with private.DisableTorchDispatch():
                return func(*args, **kwargs)
        if func is torch.ops.aten.detach.default:
            (src,) = args
            with private.DisableTorchFunctionSubclass(), private.DisableTorchDispatch():
                raw = func(src)
            return src._shallow_rewrap(raw, False)
        raise RuntimeError(
            f"torch function '{func}', with args: {args} and kwargs: {kwargs} not supported "
            f"for ShardedTensor!"
        )


# Dynamo breaks the graph at any op on a ShardedTensor: NOTE [ ShardedTensor under torch.compile ].
_compile.prepare_sharded_tensor(ShardedTensorBase)


def _is_own_op(func) -> bool:
    # torch.ops.torch_shard.* calls with ShardedTensor arguments reach __torch_function__ too; they are
    # our C++ kernels and must run on the ShardedTensor itself.
    if isinstance(func, private.OpOverload):
        return func.namespace == "torch_shard"
    if isinstance(func, private.OpOverloadPacket):
        return private.op_name(func).startswith("torch_shard::")
    return False


def _first_sharded_tensor(args, kwargs):
    if args and isinstance(args[0], ShardedTensorBase):
        return args[0]
    for leaf in private.pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, ShardedTensorBase):
            return leaf
    return None


# The op tables' argument checks count these as distributed tensors (common_op_utils).
_register_sharded_type(ShardedTensorBase)


class ShardedTensor(_RemoteShards, _Pickling, _DeviceMoves, _DCPCheckpointable, ShardedTensorBase):
    """A tensor sharded across the ranks of a process group (``torch.distributed._shard``'s API).

    Usually built through :mod:`torch_shard.sharded_tensor` constructors (``empty``, ``ones``,
    ``rand``, ...), not directly. On each of 2 ranks::

        spec = ChunkShardingSpec(dim=0, placements=["rank:0/cpu", "rank:1/cpu"])
        st = torch_shard.sharded_tensor.zeros(spec, 10, 4)
        st.local_shards()[0].tensor.shape  # torch.Size([5, 4]): rank r holds rows 5r .. 5r + 4

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

    Tracing: a ShardedTensor cannot be traced, and neither can its ops (they communicate or read the
    C++ impl). Under ``torch.compile`` dynamo breaks the graph where a ShardedTensor enters a torch
    function and runs that call eagerly (``fullgraph=True`` raises ``torch._dynamo.exc.Unsupported``;
    NOTE [ ShardedTensor under torch.compile ] in ``torch_shard/_support/_compile.py``). Under
    ``FakeTensorMode`` or ``make_fx`` the ops raise a RuntimeError saying they cannot be traced.
    """

    def __new__(
        cls,
        sharding_spec: ShardingSpec,
        *size,
        dtype: torch.dtype | None = None, layout: torch.layout = torch.strided, requires_grad: bool = False,
        pin_memory: bool = False, memory_format: torch.memory_format = torch.contiguous_format,
        process_group=None, init_rrefs: bool = False,
    ):
        return _construction.new_sharded_tensor(
            cls, sharding_spec, size,
            dtype=dtype, layout=layout, requires_grad=requires_grad, pin_memory=pin_memory, memory_format=memory_format,
            process_group=process_group, init_rrefs=init_rrefs,
        )

    @classmethod
    def _init_from_local_shards(
        cls, local_shards: list[Shard], *global_size, process_group=None, init_rrefs: bool = False
    ) -> ShardedTensor:
        """Assemble a ShardedTensor from the shards every rank holds (collective, one exchange).

        ``global_size`` may contain None: then the shards (one per rank) are laid out row-wise in rank
        order and the size is recomputed. Errors are raised on every rank together.
        """
        (st,) = cls._build_from_local_shards([local_shards], [global_size], process_group, init_rrefs, False)
        return st

    @classmethod
    def _init_from_local_shards_many(
        cls,
        local_shards: Sequence[list[Shard]],
        global_sizes: Sequence[Sequence[int | None]],
        *,
        process_group=None,
        init_rrefs: bool = False,
    ) -> list[ShardedTensor]:
        """:meth:`_init_from_local_shards` for several tensors, with one exchange for all of them; see
        :func:`torch_shard.sharded_tensor.init_from_local_shards_many`."""
        return cls._build_from_local_shards(local_shards, global_sizes, process_group, init_rrefs, True)

    @classmethod
    def _build_from_local_shards(cls, local_shards, global_sizes, process_group, init_rrefs, many):

        pg = _construction.group_of(process_group)
        with _construction.no_automatic_gc():
            return cls._build_all(local_shards, global_sizes, pg, init_rrefs, many)

    @classmethod
    def _build_all(cls, local_shards, global_sizes, pg, init_rrefs, many):

        built = _from_local.gather_global_metadata_many(local_shards, global_sizes, pg, name_tensor=many)
        tensors = []
        for size, properties, shards, local_indices, layout_args in built:
            # No global ShardedTensorMetadata is built here: metadata() derives it from the impl on demand.
            st = _construction.build(
                cls,
                shards,
                local_indices,
                None,
                None,
                pg,
                layout_args=layout_args,
                validate=False,
                size=size,
                properties=properties,
            )
            st._post_init(init_rrefs)
            tensors.append(st)
        return tensors

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
        return _construction.from_local_tensor(
            cls, local_tensor, sharding_spec, global_size, process_group, init_rrefs
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
        return _construction.from_local_shards_and_global_metadata(
            cls, local_shards, sharded_tensor_metadata, process_group, init_rrefs, sharding_spec
        )

    def local_tensor(self) -> torch.Tensor:
        """This rank's only local shard as a dense tensor."""
        shards = self.local_shards()
        if len(shards) != 1:
            raise NotImplementedError("Only single local shard is supported.")
        return shards[0].tensor

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
        receives straight into ``out`` where the shards are contiguous runs of it (row chunks).

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
        elements that change owner cross the network, in one exchange; the rest are copied locally.
        The new metadata lists shards in rank order, as upstream does.
        """
        return _movement.reshard(self, resharding_spec)

    @classmethod
    def _scatter(cls, tensor: torch.Tensor, spec: ShardingSpec, src_rank: int, process_group) -> ShardedTensor:
        """``tensor`` (read on group rank ``src_rank``) sharded by ``spec`` into a ``cls``: one C++ call
        (what ``ChunkShardingSpec.shard`` and ``_shard_tensor`` do). Collective over ``process_group``."""
        return _movement.scatter(cls, tensor, spec, src_rank, process_group)

    def _with_local_shards(self, local_shards: list[Shard], metadata: ShardedTensorMetadata, init_rrefs: bool):
        """A new ShardedTensor with this tensor's layout, group and spec over ``local_shards`` (one per
        local shard of this tensor, in the same order) and ``metadata`` (the same shards, possibly other
        tensor properties)."""
        view = _state.read_state(self)
        st = _construction.build(
            type(self),
            local_shards,
            list(view.indices),
            metadata,
            self.sharding_spec(),
            self._process_group,
            layout_args=_state.layout_args(self),
            validate=False,
        )
        st._post_init(init_rrefs)
        return st


# ChunkShardingSpec.shard returns a ShardedTensor: the specs sit below this class, which registers how.
_register_scatter(ShardedTensor._scatter)
