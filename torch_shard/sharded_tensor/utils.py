"""Placement parsing for ShardedTensor construction."""

from __future__ import annotations

import torch
from torch.distributed import distributed_c10d, rpc
from torch.distributed.remote_device import _remote_device


class _PlacementResolver:
    """Resolves placements to (global rank, device) for one process group.

    The group's global ranks and the RPC worker table are read once per resolver, so resolving N
    placements costs O(N + W) instead of upstream's O(N * W).
    """

    def __init__(self, pg):
        self._pg = pg
        self._pg_ranks: frozenset[int] | None = None
        self._pg_ranks_list: list[int] | None = None
        self._workers: dict[str, int] | None = None

    def _group_ranks(self) -> tuple[frozenset[int], list[int]] | None:
        if self._pg is None or distributed_c10d._rank_not_in_group(self._pg):
            return None
        if self._pg_ranks is None:
            self._pg_ranks_list = distributed_c10d.get_process_group_ranks(self._pg)
            self._pg_ranks = frozenset(self._pg_ranks_list)
        return self._pg_ranks, self._pg_ranks_list

    def __call__(self, remote_device: _remote_device | None) -> tuple[int, torch.device]:
        if remote_device is None:
            raise ValueError("remote device is None")
        worker_name = remote_device.worker_name()
        rank = remote_device.rank()
        device = remote_device.device()
        if rank is not None:
            ranks = self._group_ranks()
            if ranks is not None and rank not in ranks[0]:
                raise ValueError(
                    f"Global rank {rank} does not exist in input process group: {ranks[1]}"
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
