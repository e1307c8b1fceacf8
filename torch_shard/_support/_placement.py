"""Placement parsing: from a placement (``rank:1/cpu``, ``worker2/cuda:0``) to ranks and devices.

A leaf module (torch and torch.distributed only): specs, the layout arguments of the C++ ops and the
ShardedTensor all resolve placements, so it sits below them all. ``torch_shard.sharded_tensor.utils``
re-exports it under upstream's module name.
"""

from __future__ import annotations

import weakref

import torch
from torch.distributed import distributed_c10d, rpc

from . import _torch_private as private
from ._torch_private import RemoteDevice

# Global rank -> group rank of each process group's members, read once per group (a group's membership
# never changes). Weak keys: a destroyed group's entry goes with it.
_GROUP_RANKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _group_ranks(pg) -> dict[int, int] | None:
    """Global rank -> group rank for ``pg``'s members; None when this process is not one."""
    if pg is None or private.rank_not_in_group(pg):
        return None
    ranks = _GROUP_RANKS.get(pg)
    if ranks is None:
        ranks = {g: i for i, g in enumerate(distributed_c10d.get_process_group_ranks(pg))}
        _GROUP_RANKS[pg] = ranks
    return ranks


class _PlacementResolver:
    """Resolves placements to (global rank, device), and global ranks to ranks of one process group.

    Every owner lookup in torch_shard goes through :meth:`group_rank`: placements name GLOBAL ranks,
    while the C++ core and the collectives work with ranks of the tensor's group. The group's ranks are
    read once per group and the RPC worker table once per resolver, so resolving N placements costs
    O(N + W) instead of upstream's O(N * W).
    """

    def __init__(self, pg):
        self._pg = pg
        self._to_group: dict[int, int] | None | bool = False  # False: not read yet
        self._workers: dict[str, int] | None = None

    def _ranks(self) -> dict[int, int] | None:
        if self._to_group is False:
            self._to_group = _group_ranks(self._pg)
        return self._to_group

    def group_rank(self, global_rank: int) -> int:
        """``global_rank``'s rank in the group; -1 outside it or when this process is not a member."""
        to_group = self._ranks()
        return -1 if to_group is None else to_group.get(global_rank, -1)

    def owner(self, remote_device: RemoteDevice) -> int:
        """Group rank that holds shards placed on ``remote_device`` (validated as :meth:`__call__`)."""
        return self.group_rank(self(remote_device)[0])

    def __call__(self, remote_device: RemoteDevice | None) -> tuple[int, torch.device]:
        if remote_device is None:
            raise ValueError("remote device is None")
        worker_name = remote_device.worker_name()
        rank = remote_device.rank()
        device = remote_device.device()
        if rank is not None:
            to_group = self._ranks()
            if to_group is not None and rank not in to_group:
                raise ValueError(
                    f"Global rank {rank} does not exist in input process group: {list(to_group)}"
                )
            return rank, device
        if worker_name is not None:
            if not rpc._is_current_rpc_agent_set():
                raise RuntimeError(
                    f"RPC framework needs to be initialized for using worker names: {worker_name}"
                )
            if self._workers is None:
                infos = rpc._get_current_rpc_agent().get_worker_infos()
                self._workers = {info.name: info.id for info in infos}
            if worker_name not in self._workers:
                raise ValueError(f"Invalid worker name: {worker_name}")
            return self._workers[worker_name], device
        raise ValueError(f"remote device {remote_device} has neither a rank nor a worker name")


def _parse_and_validate_remote_device(pg, remote_device) -> tuple[int, torch.device]:
    """(global rank, device) of a placement, checking the rank belongs to ``pg``.

    Raises ValueError when ``remote_device`` is None, names a rank outside ``pg`` or an unknown RPC
    worker; RuntimeError when it names a worker and RPC is not initialised. The device is not checked
    for existence ("rank:1/cuda:1" validates on a machine without GPUs).
    """
    return _PlacementResolver(pg)(remote_device)
