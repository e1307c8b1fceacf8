"""A job that must exit with 0 under torchrun (tests/test_exit.py; NOTE [ Exit after gloo ]).

It ends the way the smoke script and many training scripts end: collectives on tensors made in Python
(``all_gather_object``), a barrier, ``destroy_process_group``, return. A caught exception's traceback
keeps this frame, and so a ShardedTensor and its process group, alive in a reference cycle, as any
``except`` around torch_shard code can. Without torch_shard's collection at exit, a gloo worker thread
may then still be freeing the gathered tensors when the interpreter finalizes, and the process aborts
("terminate called without an active exception").

``--without-fix`` unregisters that collection, to measure how often the race shows without it.
"""

from __future__ import annotations

import argparse
import atexit
import sys

import torch
import torch.distributed as dist

import torch_shard
from torch_shard import sharded_tensor
from torch_shard.sharding_spec import ChunkShardingSpec


def _start_reductions(count: int) -> None:
    """Starts ``count`` reductions of tensors made here and returns without waiting: the barrier after
    them holds their work objects, so their tensors are freed with it, on a gloo worker thread. (Many of
    them make the race with finalization likely enough to be seen in a few launches.)"""
    for i in range(count):
        dist.all_reduce(torch.full((4,), float(i)), async_op=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--without-fix", action="store_true")
    args = parser.parse_args()
    if args.without_fix:
        atexit.unregister(torch_shard._support._exit._collect_before_finalization)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world)])
    st = sharded_tensor.rand(spec, 8 * world, 4)  # noqa: F841 - held by this frame, which the cycle keeps
    try:
        raise ValueError("caught")
    except ValueError as exc:
        caught = exc  # noqa: F841 - the frame -> exception -> traceback -> frame cycle
    for _ in range(4):
        gathered: list = [None] * world
        dist.all_gather_object(gathered, [dist.get_rank()] * 64)
    _start_reductions(64)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
