"""Bad arguments on ONE rank raise on EVERY rank, and the group stays usable afterwards.

Each data op agrees on its arguments in one small collective before any data moves; without that,
the rank that raises would leave the others waiting in the all-to-all (a hang). Every case below
passes bad input on a single rank only and checks that all four ranks raise, then that a correct
call on the same process group still works.
"""

import torch
import torch.nn.functional as F
from _shared import assert_group_still_works

from torch_shard import _shard_tensor, sharded_tensor
from torch_shard.sharded_tensor import Shard, init_from_local_shards
from torch_shard.sharding_spec import ChunkShardingSpec, ShardMetadata
from torch_shard.testing import ShardedTensorTestBase, placement, run_tests, with_comms


def _rows():
    return ChunkShardingSpec(dim=0, placements=[placement(r) for r in range(4)])


def _cols():
    return ChunkShardingSpec(dim=1, placements=[placement(r) for r in range(4)])


class TestOneBadRank(ShardedTensorTestBase):
    @with_comms(init_rpc=False)
    def test_reshard_with_a_different_spec_on_one_rank(self):
        st = sharded_tensor.rand(_rows(), 8, 8)
        target = _rows() if self.rank == 2 else _cols()
        with self.assertRaisesRegex(ValueError, "does not match"):
            st.reshard(target)
        assert_group_still_works(self)

    @with_comms(init_rpc=False)
    def test_reshard_to_an_invalid_spec_on_one_rank(self):
        st = sharded_tensor.rand(_rows(), 8, 8)
        target = ChunkShardingSpec(dim=5, placements=[placement(0)]) if self.rank == 1 else _cols()
        with self.assertRaises(ValueError) as caught:
            st.reshard(target)
        # Rank 1 failed in Python, before its C++ call: the others still learn what went wrong there.
        if self.rank != 1:
            self.assertRegex(
                str(caught.exception), r"rank 1 of the process group rejected its arguments \(ValueError: .*dim"
            )
        # The tensor is untouched on every rank.
        self.assertEqual(st.metadata().shards_metadata[1].shard_offsets, [2, 0])
        assert_group_still_works(self)

    @with_comms(init_rpc=False)
    def test_gather_with_out_on_a_non_destination_rank(self):
        st = sharded_tensor.ones(_rows(), 8, 4)
        out = torch.zeros(8, 4, device=self.device) if self.rank in (0, 3) else None
        with self.assertRaises(ValueError) as caught:
            st.gather(0, out)
        # Rank 3 failed in C++, before the agreement: its message reaches the others.
        if self.rank != 3:
            self.assertRegex(
                str(caught.exception),
                r"rank 3 of the process group rejected its arguments \(ValueError: Argument ``dst_tensor`` must "
                r"NOT be specified on non-destination ranks",
            )
        assert_group_still_works(self)

    @with_comms(init_rpc=False)
    def test_gather_with_different_destinations(self):
        st = sharded_tensor.ones(_rows(), 8, 4)
        dst = 1 if self.rank == 3 else 0
        out = torch.zeros(8, 4, device=self.device) if self.rank == dst else None
        with self.assertRaisesRegex(ValueError, "does not match"):
            st.gather(dst, out)
        assert_group_still_works(self)

    @with_comms(init_rpc=False)
    def test_shard_tensor_of_a_different_size_on_one_rank(self):
        full = torch.rand(10, 4, device=self.device) if self.rank == 1 else torch.rand(8, 4, device=self.device)
        with self.assertRaises(ValueError):
            _shard_tensor(full, _rows())
        assert_group_still_works(self)

    @with_comms(init_rpc=False)
    def test_init_from_local_shards_with_a_bad_shard_on_one_rank(self):
        rows = 3 if self.rank == 2 else 2  # rank 2 overlaps rank 3
        shards = [Shard(torch.zeros(rows, 4, device=self.device), ShardMetadata([2 * self.rank, 0], [rows, 4], placement(self.rank)))]
        with self.assertRaises(ValueError):
            init_from_local_shards(shards, 8, 4)
        assert_group_still_works(self)

    @with_comms(init_rpc=False)
    def test_embedding_bag_with_an_out_of_range_id_on_one_rank(self):
        weight = sharded_tensor.rand(_rows(), 16, 4)
        ids = torch.randint(0, 16, (3, 5), device=self.device)
        if self.rank == 3:
            ids[0, 0] = 16
        # Rank 3 raises its own error; the others raise the same class, naming rank 3.
        expected = "Index out of range" if self.rank == 3 else "rank 3 of the process group rejected"
        with self.assertRaisesRegex(ValueError, expected):
            F.embedding_bag(ids, weight, mode="sum")
        assert_group_still_works(self)


if __name__ == "__main__":
    run_tests()
