"""Helpers several test modules share (imported as a sibling module, like ``_harness_cases``)."""

from __future__ import annotations

import shutil
import tempfile

import torch
import torch.distributed as dist

from torch_shard import _shard_tensor, sharded_tensor
from torch_shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec, ShardMetadata
from torch_shard.testing import placement


def grid_spec(rows: int, cols: int, order=(0, 1, 2, 3)) -> EnumerableShardingSpec:
    """A 2 x 2 grid of blocks (torch.chunk split of each dim), block (i, j) on rank order[2 * i + j]."""
    r0, c0 = -(-rows // 2), -(-cols // 2)
    boxes = [
        ([0, 0], [r0, c0]),
        ([0, c0], [r0, cols - c0]),
        ([r0, 0], [rows - r0, c0]),
        ([r0, c0], [rows - r0, cols - c0]),
    ]
    return EnumerableShardingSpec([ShardMetadata(o, s, placement(rank)) for (o, s), rank in zip(boxes, order)])


def assert_group_still_works(case) -> None:
    """After an op raised on every rank, the default group still runs a scatter and a gather."""
    full = torch.arange(32.0, device=case.device).view(8, 4)
    st = _shard_tensor(full, ChunkShardingSpec(dim=0, placements=[placement(r) for r in range(4)]))
    out = torch.zeros(8, 4, device=case.device) if case.rank == 0 else None
    st.gather(0, out)
    if case.rank == 0:
        case.assertEqual(out, full)


def shard_slice(weight, full: torch.Tensor) -> torch.Tensor:
    """The part of the 2-D ``full`` that is this rank's (first) local shard of ``weight``."""
    md = weight.local_shards()[0].metadata
    return full[
        md.shard_offsets[0] : md.shard_offsets[0] + md.shard_sizes[0],
        md.shard_offsets[1] : md.shard_offsets[1] + md.shard_sizes[1],
    ]


def chunks(dim: int, ranks=range(4)) -> ChunkShardingSpec:
    """ChunkShardingSpec along ``dim``, chunk i on ``ranks[i]`` (the test device's placements)."""
    return ChunkShardingSpec(dim=dim, placements=[placement(r) for r in ranks])


def box_slice(full: torch.Tensor, md: ShardMetadata) -> torch.Tensor:
    """The part of ``full`` a shard's box covers (clipped to the tensor, so empty boxes past the end work),
    on the shard's placement device (a CPU reference compares with CUDA shards in the one-gpu mode)."""
    index = []
    for offset, size, extent in zip(md.shard_offsets, md.shard_sizes, full.shape):
        start = min(offset, extent)
        index.append(slice(start, min(start + size, extent)))
    part = full[tuple(index)]
    return part if md.placement is None else part.to(md.placement.device())


def filled(full: torch.Tensor, spec, process_group=None):
    """A ShardedTensor with layout ``spec`` holding ``full``'s values (no communication)."""
    st = sharded_tensor.empty(spec, *full.shape, dtype=full.dtype, process_group=process_group)
    for shard in st.local_shards():
        shard.tensor.copy_(box_slice(full, shard.metadata))
    return st


def shared_tmp_dir(case, prefix: str = "torch_shard_test_") -> str:
    """A temporary directory every rank of ``case`` names alike (made by rank 0, which removes it once
    the test, with_comms' last barrier included, is over)."""
    holder = [tempfile.mkdtemp(prefix=prefix) if case.rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    if case.rank == 0:
        case.addCleanup(shutil.rmtree, holder[0], True)
    return holder[0]
