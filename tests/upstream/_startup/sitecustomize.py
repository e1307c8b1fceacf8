"""Interpreter start-up hook of tests/upstream/run_upstream.py (on PYTHONPATH only while it runs).

Every process of a run (pytest and each rank it starts, forked or spawned) gets the same set-up:

* ``TORCH_SHARD_UPSTREAM_MODE=torch_shard``: install ``torch_shard.compat`` before anything imports
  ``torch.distributed._shard``, so upstream's imports resolve to torch_shard and upstream's test base
  names to :mod:`torch_shard.testing` (gloo and CPU placements without 4 GPUs).
* ``TORCH_SHARD_UPSTREAM_MODE=upstream``: upstream's library and test base, with the test base made
  to run on a CPU-only machine the way torch_shard's does (see ``_patch_upstream_test_base``).
"""

from __future__ import annotations

import os

_MODE = os.environ.get("TORCH_SHARD_UPSTREAM_MODE")


def _cpu_only() -> bool:
    import torch

    return not (torch.cuda.is_available() and torch.cuda.device_count() >= 4)


def _patch_upstream_test_base() -> None:
    """Upstream's ShardedTensorTestBase on gloo/CPU when fewer than 4 GPUs exist.

    The same choices torch_shard's test base makes: NCCL -> gloo, no TensorPipe device maps,
    ``rank:r/cpu`` placements in the shared spec helpers, the shared Megatron model on the CPU, and a
    ``device_type`` attribute (``"cpu"``) that newer test files read.
    """
    import functools

    import torch
    import torch.testing._internal.distributed._shard.sharded_tensor as base
    import torch.testing._internal.distributed._shard.sharded_tensor._test_ops_common as ops_common
    import torch.testing._internal.distributed._shard.sharded_tensor._test_st_common as st_common
    import torch.testing._internal.distributed._shard.test_common as test_common
    from torch.distributed import rpc
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec, ShardMetadata

    original_with_comms = base.with_comms

    def with_comms(func=None, init_rpc=True, backend="nccl"):
        if backend in ("nccl", "xccl", "hccl"):
            backend = "gloo"
        return original_with_comms(func, init_rpc=init_rpc, backend=backend)

    base.with_comms = with_comms

    original_init_pg = base.ShardedTensorTestBase.init_pg

    def init_pg(self, backend="nccl"):
        return original_init_pg(self, backend="gloo" if backend in ("nccl", "xccl", "hccl") else backend)

    base.ShardedTensorTestBase.init_pg = init_pg

    def init_rpc(self):
        options = rpc.TensorPipeRpcBackendOptions()
        options.init_method = f"file://{self.file_name}"
        rpc.init_rpc(
            name=f"worker{self.rank:d}", rank=self.rank, world_size=self.world_size, rpc_backend_options=options
        )

    base.ShardedTensorTestBase.init_rpc = init_rpc
    # torch_shard's test base names the device its ranks use; newer upstream test files read it.
    if not hasattr(base.ShardedTensorTestBase, "device_type"):
        base.ShardedTensorTestBase.device_type = property(lambda self: "cpu")

    st_common.PLACEMENTS[:] = [f"rank:{r}/cpu" for r in range(len(st_common.PLACEMENTS))]

    def cpu_spec(spec):
        if isinstance(spec, ChunkShardingSpec):
            return ChunkShardingSpec(dim=spec.dim, placements=[f"rank:{p.rank()}/cpu" for p in spec.placements])
        if isinstance(spec, EnumerableShardingSpec):
            return EnumerableShardingSpec(
                [
                    ShardMetadata(m.shard_offsets, m.shard_sizes, f"rank:{m.placement.rank()}/cpu")
                    for m in spec.shards
                ]
            )
        return spec

    for name in ("generate_chunk_sharding_specs_for_test", "generate_enumerable_sharding_specs_for_test"):
        original = getattr(ops_common, name)
        setattr(
            ops_common,
            name,
            functools.wraps(original)(lambda *a, _f=original, **k: [cpu_spec(s) for s in _f(*a, **k)]),
        )

    original_megatron_init = test_common.SimpleMegatronLM.__init__

    def megatron_init(self, linear_size, rank=None, dtype=torch.float32):
        original_megatron_init(self, linear_size, rank=None, dtype=dtype)

    test_common.SimpleMegatronLM.__init__ = megatron_init


if _MODE == "torch_shard":
    import torch_shard.compat  # noqa: F401
elif _MODE == "upstream":
    if _cpu_only():
        _patch_upstream_test_base()
