"""Every rank of a load learns what every other rank found before any of them writes a tensor.

NOTE [ Agreeing on a load's outcome ]
DCP gives a storage reader no process group, but a load's plans pass through the reader twice: each
rank's ``prepare_local_plan`` and the coordinator's ``prepare_global_plan``, whose result reaches
every rank's ``read_data``. The reader writes its global rank into its local plan, the coordinator
collects them, and each rank then knows who else is loading. After staging and checking its reads,
each rank sends its outcome (corruptions found, or another error) to the others over the group of
those ranks (the default group when every rank loads, else the group DCP was given, found by its
members), so every rank raises the same error or none does; nobody waits on a rank that raised.
The common case costs one collective: an all-reduce of one flag saying whether any rank found
anything; only when one did do the ranks gather each other's outcomes (an object all-gather, two
more collectives) to name every corruption.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ._errors import CheckpointCorruptionError, CheckpointLoadError, Corruption
from ._timing import spent


@dataclass(frozen=True)
class LocalRank:
    """A local plan's ``storage_data``: the global rank that made it."""

    rank: int | None


@dataclass(frozen=True)
class Participants:
    """A final plan's ``storage_data``: the global ranks of the load, in the group's order."""

    ranks: tuple[int, ...]


@dataclass
class Outcome:
    """What one rank found while staging its reads."""

    rank: int | None
    corruptions: list[Corruption] = field(default_factory=list)
    error: str | None = None  # another failure (unreadable file, ...), as text


def this_rank() -> int | None:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


def group_of(ranks: tuple[int, ...]):
    if len(ranks) == dist.get_world_size() and sorted(ranks) == list(range(len(ranks))):
        return dist.group.WORLD
    wanted = set(ranks)
    for group, members in dist.distributed_c10d._world.pg_group_ranks.items():
        if set(members) == wanted:
            return group
    raise RuntimeError(f"torch_shard.checkpoint: no process group with the loading ranks {sorted(ranks)}")


def flag_device(group) -> torch.device:
    """Where the group's collectives take a tensor: as ``all_gather_object`` chooses (CUDA for NCCL)."""
    choose = getattr(dist.distributed_c10d, "_get_object_coll_device", None)
    kind = choose(group) if choose is not None else "cpu"
    if kind == "cpu":
        return torch.device("cpu")
    module = getattr(torch, kind, None)
    if module is not None and hasattr(module, "current_device"):
        return torch.device(kind, module.current_device())
    return torch.device(kind)


def exchange(outcome: Outcome, participants: Participants | None) -> list[Outcome]:
    """Every participant's outcome when any of them found a problem; else only this rank's (clean)
    outcome, after one all-reduce (only this rank's, too, when it loads alone or ranks are unknown)."""
    if participants is None or len(participants.ranks) <= 1 or None in participants.ranks:
        return [outcome]
    if this_rank() not in participants.ranks:
        return [outcome]
    group = group_of(participants.ranks)
    troubled = bool(outcome.corruptions) or outcome.error is not None
    flag = torch.tensor([int(troubled)], dtype=torch.int32, device=flag_device(group))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    if not flag.item():
        return [outcome]
    gathered: list = [None] * len(participants.ranks)
    dist.all_gather_object(gathered, outcome, group=group)
    return gathered


def agree(outcome: Outcome, participants: Participants | None, path: str, failure: BaseException | None) -> None:
    """Learn every participant's outcome and raise, on every rank alike, what any of them found: every
    corruption as one :class:`CheckpointCorruptionError`, else every other error as one
    :class:`CheckpointLoadError` (chained to ``failure``, this rank's own exception, if it had one)."""
    clock = time.perf_counter()
    outcomes = exchange(outcome, participants)
    spent("agree_s", clock)
    corruptions = [c for o in outcomes for c in o.corruptions]
    if corruptions:
        raise CheckpointCorruptionError(path, corruptions)
    failed = [f"rank {o.rank}: {o.error}" if o.rank is not None else o.error for o in outcomes if o.error]
    if failed:
        raise CheckpointLoadError(
            path, f"torch_shard.checkpoint: loading '{path}' failed, so nothing was loaded: {'; '.join(failed)}"
        ) from failure
