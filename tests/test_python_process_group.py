"""torch_shard on a process group whose backend is written in Python: torch's threaded test group.

Upstream runs ``TestShardedTensorSubGroupInit`` on this group (``spawn_threads_and_init_comms``: four
ranks as threads of one process, collectives implemented in Python). Such a group registers no C++
backend and has no point-to-point messages, so the exchange must reach it only through the
collectives it overrides (NOTE [ Round 1 through a hub ]: the hub and point-to-point round 2 are off
for it). The first test is upstream's body, unchanged; the others move data on the same group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import spawn_threads_and_init_comms
from torch.testing._internal.distributed import multi_threaded_pg

import torch_shard
from torch_shard.sharded_tensor import Shard, ShardedTensor
from torch_shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec, ShardMetadata
from torch_shard.testing import TestCase, run_tests

WORLD = 4

if not hasattr(multi_threaded_pg.ThreadLocalWorld, "comms"):
    # torch 2.11's threaded world lacks the `comms` list its own destroy_process_group walks (each rank
    # thread then dies with an AttributeError as the test ends); it holds torchcomms communicators,
    # which this group never has.
    multi_threaded_pg.ThreadLocalWorld.comms = property(lambda self: [])


def _spec(dim: int) -> ChunkShardingSpec:
    return ChunkShardingSpec(dim=dim, placements=[f"rank:{r}/cpu" for r in range(WORLD)])


class TestThreadedProcessGroup(TestCase):
    @spawn_threads_and_init_comms(world_size=WORLD)
    def test_sub_process_group_sharded_tensor_init(self):
        world_pg = dist.GroupMember.WORLD
        self.assertTrue(world_pg is not None)
        rank = dist.get_rank()

        sub_group_sz = 2
        sub_pg_ranks = [r for r in range(4) if r % sub_group_sz == rank % sub_group_sz]
        sub_pg = dist.new_group(
            sub_pg_ranks,
            backend=dist.get_backend(world_pg),
            use_local_synchronization=True,
        )
        dist.barrier(sub_pg)

        ShardedTensor._init_from_local_shards(
            [
                Shard(
                    tensor=torch.tensor([1, 2, 3], device="meta"),
                    metadata=ShardMetadata(
                        shard_offsets=[3 * (rank // sub_group_sz)],
                        shard_sizes=[3],
                        placement=f"rank:{rank}/meta",
                    ),
                )
            ],
            6,
            process_group=sub_pg,
        )

    @spawn_threads_and_init_comms(world_size=WORLD)
    def test_scatter_reshard_gather_on_a_python_backend(self):
        """Data ops with small and large payloads (one round, and a second round), a mismatch that
        raises on every rank, and the group working on afterwards."""
        rank = dist.get_rank()
        for rows, cols in ((8, 4), (256, 128)):
            full = torch.arange(rows * cols, dtype=torch.float32).view(rows, cols)
            st = torch_shard._shard_tensor(full if rank == 0 else torch.zeros(rows, cols), _spec(0), src_rank=0)
            self.assertEqual(st.local_tensor(), full.chunk(WORLD)[rank])
            st.reshard(_spec(1))
            self.assertEqual(st.local_tensor(), full.chunk(WORLD, dim=1)[rank])
            grid = EnumerableShardingSpec(
                [
                    ShardMetadata([0, 0], [rows, cols // 2], "rank:3/cpu"),
                    ShardMetadata([0, cols // 2], [rows, cols // 2], "rank:1/cpu"),
                ]
            )
            st.reshard(grid)
            out = torch.empty(rows, cols) if rank == 2 else None
            st.gather(2, out)
            if rank == 2:
                self.assertEqual(out, full)
        with self.assertRaisesRegex(IndexError, "dst 9|rank 1 of the process group rejected"):
            st.gather(9 if rank == 1 else 0, torch.empty(256, 128) if rank == 0 else None)
        out = torch.empty(256, 128) if rank == 0 else None
        st.gather(0, out)
        if rank == 0:
            self.assertEqual(out, full)


if __name__ == "__main__":
    run_tests()
