"""torch.nn.init on ShardedTensor: each local shard is filled from this rank's RNG stream."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..._support import _torch_private as private
from .. import _sharded_op_impl


def _param(kwargs, name):
    value = kwargs.get(name)
    if value is None:
        raise ValueError(f"param: {name} shouldn't be None!")
    return value


def _fill_local_shards(init: Callable, kwargs, names: tuple[str, ...], generator: bool = True):
    """Apply the dense ``init`` to every local shard of ``kwargs["tensor"]``, with the arguments
    ``names`` (each required; read and checked in this order) and, when ``generator``, the generator.
    torch.nn.init passes its arguments as kwargs. Returns the ShardedTensor."""
    kwargs = kwargs or {}
    st = _param(kwargs, "tensor")
    arguments = {name: _param(kwargs, name) for name in names}
    if generator:
        arguments["generator"] = kwargs.get("generator")
    for shard in st.local_shards():
        init(shard.tensor, **arguments)
    return st


@_sharded_op_impl(torch.nn.init.uniform_)
def uniform_(types, args=(), kwargs=None, pg=None):
    """Fill every local shard from U[a, b)."""
    return _fill_local_shards(torch.nn.init.uniform_, kwargs, ("a", "b"))


@_sharded_op_impl(torch.nn.init.normal_)
def normal_(types, args=(), kwargs=None, pg=None):
    """Fill every local shard from N(mean, std^2)."""
    return _fill_local_shards(torch.nn.init.normal_, kwargs, ("mean", "std"))


@_sharded_op_impl(torch.nn.init.kaiming_uniform_)
def kaiming_uniform_(types, args=(), kwargs=None, pg=None):
    """Kaiming-uniform fill whose bound comes from the GLOBAL fan (upstream uses each shard's own
    fan, which is wrong whenever the fan dim is sharded)."""
    kwargs = kwargs or {}
    st = _param(kwargs, "tensor")
    a = _param(kwargs, "a")
    mode = _param(kwargs, "mode")
    nonlinearity = _param(kwargs, "nonlinearity")
    generator = kwargs.get("generator")
    fan = private.calculate_correct_fan(torch.empty(st.size(), device="meta"), mode)
    bound = math.sqrt(3.0) * torch.nn.init.calculate_gain(nonlinearity, a) / math.sqrt(fan)
    with torch.no_grad():
        for shard in st.local_shards():
            shard.tensor.uniform_(-bound, bound, generator=generator)
    return st


@_sharded_op_impl(torch.nn.init.constant_)
def constant_(types, args=(), kwargs=None, pg=None):
    """Fill every local shard with ``val``."""
    return _fill_local_shards(torch.nn.init.constant_, kwargs, ("val",), generator=False)
