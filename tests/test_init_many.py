"""init_from_local_shards_many: N ShardedTensors from local shards in ONE metadata exchange.

Each tensor must come out exactly as a separate init_from_local_shards call builds it (layout, local
shards, values, recalculated sizes), the whole call must cost one exchange, and bad input on one
rank (for one tensor, or for the call itself) must raise on every rank and leave the group usable.
"""

from unittest import mock

import torch
from _shared import assert_group_still_works

from torch_shard.sharded_tensor import (
    Shard,
    ShardedTensor,
    _from_local,
    init_from_local_shards,
    init_from_local_shards_many,
)
from torch_shard.sharding_spec import ChunkShardingSpec, ShardMetadata
from torch_shard.testing import ShardedTensorTestBase, placement, run_tests, with_comms

_ops = torch.ops.torch_shard


def _row_shard(rank: int, rows: int, cols: int, fill: float, device) -> list[Shard]:
    md = ShardMetadata([rank * rows, 0], [rows, cols], placement(rank))
    return [Shard(torch.full((rows, cols), fill + rank, device=device), md)]


def _cases(rank: int, device) -> tuple[list, list]:
    """(local shards per tensor, global size per tensor) for this rank: row and column chunks,
    several shards on one rank and none on others, an empty shard, a 1-D tensor, a recalculated size."""
    shards, sizes = [], []
    shards.append(_row_shard(rank, 2, 3, 0.0, device))  # rows
    sizes.append([8, 3])
    shards.append([Shard(torch.full((5, 1), 10.0 + rank, device=device), ShardMetadata([0, rank], [5, 1], placement(rank)))])
    sizes.append(torch.Size([5, 4]))  # columns
    if rank == 1:  # all of a 6x2 tensor on rank 1, in three row blocks (one of them empty)
        shards.append(
            [
                Shard(torch.full((4, 2), 20.0, device=device), ShardMetadata([0, 0], [4, 2], placement(1))),
                Shard(torch.zeros(0, 2, device=device), ShardMetadata([4, 0], [0, 2], placement(1))),
                Shard(torch.full((2, 2), 21.0, device=device), ShardMetadata([4, 0], [2, 2], placement(1))),
            ]
        )
    else:
        shards.append([])
    sizes.append((6, 2))
    shards.append([Shard(torch.arange(3.0, device=device) + 3 * rank, ShardMetadata([3 * rank], [3], placement(rank)))])
    sizes.append(12)  # 1-D, given as an int
    rows = rank + 1  # row counts 1, 2, 3, 4: the size is recalculated
    shards.append([Shard(torch.full((rows, 2), 30.0 + rank, device=device), ShardMetadata([0, 0], [rows, 2], placement(rank)))])
    sizes.append([None, 2])
    return shards, sizes


def _full(st: ShardedTensor, device) -> torch.Tensor:
    """The whole tensor on every rank (gathered to 0, then broadcast)."""
    out = torch.empty(st.size(), device=device) if torch.distributed.get_rank() == 0 else None
    st.gather(0, out)
    out = out if out is not None else torch.empty(st.size(), device=device)
    torch.distributed.broadcast(out, 0)
    return out


class TestInitFromLocalShardsMany(ShardedTensorTestBase):
    @with_comms(init_rpc=False)
    def test_same_tensors_as_separate_calls(self):
        shards, sizes = _cases(self.rank, self.device)
        many = init_from_local_shards_many(shards, sizes)
        self.assertEqual(len(many), len(shards))
        fresh_shards, fresh_sizes = _cases(self.rank, self.device)
        for i, (st, local, size) in enumerate(zip(many, fresh_shards, fresh_sizes)):
            size = (size,) if isinstance(size, int) else tuple(size)
            one = init_from_local_shards(local, *size)
            self.assertIsInstance(st, ShardedTensor)
            self.assertEqual(st.size(), one.size(), msg=f"tensor {i}")
            self.assertEqual(st.metadata(), one.metadata(), msg=f"tensor {i}")
            self.assertEqual(
                [(s.metadata, s.tensor) for s in st.local_shards()],
                [(s.metadata, s.tensor) for s in one.local_shards()],
                msg=f"tensor {i}",
            )
            self.assertEqual(_full(st, self.device), _full(one, self.device), msg=f"tensor {i}")
        self.assertEqual(many[4].size(), torch.Size([10, 2]))
        # As init_from_local_shards does, the recalculated box is written into the caller's Shard.
        self.assertEqual(shards[4][0].metadata.shard_offsets, [self.rank * (self.rank + 1) // 2, 0])
        # The tensors hold the very tensors they were given (no copy).
        self.assertIs(many[0].local_shards()[0].tensor, shards[0][0].tensor)

    @with_comms(init_rpc=False)
    def test_one_exchange_for_all_tensors(self):
        count = 20
        shards = [_row_shard(self.rank, 2, 3, float(i), self.device) for i in range(count)]
        exchanges = []
        real = _from_local._exchange

        def counted(message, group):
            exchanges.append(len(message[1]))
            return real(message, group)

        with mock.patch.object(_from_local, "_exchange", counted):
            _ops._comm_stats(True)
            init_from_local_shards(_row_shard(self.rank, 2, 3, 0.0, self.device), 8, 3)
            rounds_one = _ops._comm_stats(True)[2]
            many = init_from_local_shards_many(shards, [[8, 3]] * count)
            rounds_many = _ops._comm_stats(False)[2]
        self.assertEqual(exchanges, [1, count])
        # N tensors take no more communication rounds than one tensor does.
        self.assertLessEqual(rounds_many, rounds_one)
        self.assertEqual([st.local_tensor()[0, 0].item() for st in many], [float(i + self.rank) for i in range(count)])

    @with_comms(init_rpc=False)
    def test_bound_shards_with_a_recalculated_size(self):
        # Shards of a live ShardedTensor cannot take another box: their tensors are used with new Shards.
        src = init_from_local_shards(_row_shard(self.rank, 2, 3, 0.0, self.device), 8, 3)
        bound = src.local_shards()
        (st,) = init_from_local_shards_many([bound], [[None, 3]])
        self.assertEqual(st.size(), torch.Size([8, 3]))
        self.assertIs(st.local_tensor(), bound[0].tensor)
        self.assertEqual(src.local_shards()[0].metadata.shard_offsets, [2 * self.rank, 0])

    @with_comms(init_rpc=False)
    def test_empty_call(self):
        self.assertEqual(init_from_local_shards_many([], []), [])

    @with_comms(init_rpc=False)
    def test_bad_tensor_on_one_rank_raises_on_every_rank(self):
        shards = [_row_shard(self.rank, 2, 3, float(i), self.device) for i in range(3)]
        if self.rank == 2:  # tensor 1 overlaps rank 1's shard on rank 2 only
            shards[1] = [Shard(torch.zeros(2, 3, device=self.device), ShardMetadata([2, 0], [2, 3], placement(2)))]
        with self.assertRaisesRegex(ValueError, "init_from_local_shards_many: tensor 1 of 3: .*overlap"):
            init_from_local_shards_many(shards, [[8, 3]] * 3)
        assert_group_still_works(self)

    @with_comms(init_rpc=False)
    def test_local_error_names_the_rank_on_the_others(self):
        shards = [_row_shard(self.rank, 2, 3, float(i), self.device) for i in range(3)]
        if self.rank == 3:  # a placement naming another rank fails rank 3's local checks for tensor 2
            shards[2] = [Shard(torch.zeros(2, 3, device=self.device), ShardMetadata([6, 0], [2, 3], placement(0)))]
        expected = "rank does not match" if self.rank == 3 else "tensor 2 of 3: init_from_local_shards failed on rank 3"
        with self.assertRaisesRegex(ValueError, expected):
            init_from_local_shards_many(shards, [[8, 3]] * 3)
        assert_group_still_works(self)

    @with_comms(init_rpc=False)
    def test_different_numbers_of_tensors_raise_on_every_rank(self):
        count = 3 if self.rank == 0 else 2
        shards = [_row_shard(self.rank, 2, 3, 0.0, self.device) for _ in range(count)]
        with self.assertRaisesRegex(ValueError, "same number of tensors, got 3 on rank 0, 2 on rank 1"):
            init_from_local_shards_many(shards, [[8, 3]] * count)
        # A rank in init_from_local_shards and ranks in the batched call: one tensor against two.
        if self.rank == 1:
            call = lambda: init_from_local_shards(_row_shard(self.rank, 2, 3, 0.0, self.device), 8, 3)  # noqa: E731
        else:
            call = lambda: init_from_local_shards_many([_row_shard(self.rank, 2, 3, 0.0, self.device)] * 2, [[8, 3]] * 2)  # noqa: E731
        with self.assertRaisesRegex(ValueError, "same number of tensors"):
            call()
        assert_group_still_works(self)

    @with_comms(init_rpc=False)
    def test_bad_arguments_on_one_rank_raise_on_every_rank(self):
        shards = [_row_shard(self.rank, 2, 3, 0.0, self.device)]
        bad = {
            1: (shards, [[8, 3], [8, 3]], ValueError, "got 1 lists of local shards and 2 global sizes"),
            2: (shards[0], [[8, 3]], TypeError, r"local_shards\[0\] must be a list of Shards, not Shard"),
            3: (shards[0][0], [[8, 3]], TypeError, "local_shards must be a sequence .* not Shard"),
        }
        for culprit, (local, sizes, error, text) in bad.items():
            args = (local, sizes) if self.rank == culprit else (shards, [[8, 3]])
            expected = text if self.rank == culprit else f"init_from_local_shards_many failed on rank {culprit}"
            with self.assertRaisesRegex(error, expected):
                init_from_local_shards_many(*args)
        assert_group_still_works(self)

    @with_comms(init_rpc=False)
    def test_tensors_are_independent(self):
        a, b = init_from_local_shards_many([_row_shard(self.rank, 2, 3, 0.0, self.device), _row_shard(self.rank, 2, 3, 5.0, self.device)], [[8, 3]] * 2)
        a.local_shards()[0].tensor = torch.full((2, 3), -1.0, device=self.device)
        self.assertEqual(b.local_tensor(), torch.full((2, 3), 5.0 + self.rank, device=self.device))
        a.reshard(ChunkShardingSpec(dim=1, placements=[placement(r) for r in range(3)]))
        self.assertEqual(_full(a, self.device), torch.full((8, 3), -1.0, device=self.device))
        self.assertEqual(b.metadata().shards_metadata[self.rank].shard_offsets, [2 * self.rank, 0])


if __name__ == "__main__":
    run_tests()
