"""Remote shards over ``torch.distributed.rpc``: ShardedTensors built with ``init_rrefs=True``.

Each process keeps a registry of such tensors by a per-process id, so RPC peers can hand it RRefs to
their shards; every rank then knows, for every other rank, RRefs to that rank's local shards.
"""

from __future__ import annotations

import threading
import weakref

import torch
import torch.distributed as dist
from torch.distributed import rpc

from .shard import Shard

# ShardedTensors created with init_rrefs=True, by per-process id, so RPC peers can hand them RRefs.
_sharded_tensor_lock = threading.Lock()
_sharded_tensor_current_id = 0
_sharded_tensor_map: dict[int, weakref.ReferenceType] = {}


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


class _RemoteShards:
    """Mixin of :class:`ShardedTensor`: the ``init_rrefs`` machinery and :meth:`remote_shards`."""

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
        local_shards = self.local_shards()
        if local_shards:
            # Plain Shards travel (the RRef owner keeps them; peers fetch copies).
            rrefs: list[rpc.RRef[Shard]] = [rpc.RRef(Shard(s.tensor, s.metadata)) for s in local_shards]
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
