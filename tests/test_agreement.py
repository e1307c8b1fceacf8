"""Bad arguments on ONE rank raise on EVERY rank, and the group stays usable afterwards.

Each data op agrees on its arguments in one small collective before any data moves; without that,
the rank that raises would leave the others waiting in the all-to-all (a hang). Every case below
passes bad input on a single rank only and checks that all four ranks raise, then that a correct
call on the same process group still works.
"""

import time
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _shared import assert_group_still_works

from torch_shard import _shard_tensor, sharded_tensor
from torch_shard.sharded_tensor import Shard, init_from_local_shards
from torch_shard.sharding_spec import ChunkShardingSpec, ShardMetadata
from torch_shard.testing import ShardedTensorTestBase, placement, rank_device, run_tests, with_comms


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
        # Rank 3 raises its own error; the others raise the same class, naming rank 3 and saying what
        # rank 3's device-side check found (NOTE [ Reasons travel ]).
        expected = (
            r"^Index out of range in Input \d+ 16 16$"
            if self.rank == 3
            else r"rank 3 of the process group rejected its arguments \(ValueError: Index out of range in Input \d+ 16 16\)"
        )
        with self.assertRaisesRegex(ValueError, expected):
            F.embedding_bag(ids, weight, mode="sum")
        assert_group_still_works(self)


_ops = torch.ops.torch_shard
BAD = 1
WORLD = 4


class TestEveryOpOneBadArgument(ShardedTensorTestBase):
    """Every op that communicates, called directly (torch.ops.torch_shard.*, as a user may) with a bad
    argument on ONE rank, raises on every rank within seconds: the bad rank its own error, the others
    the same class naming it and carrying its message, instead of waiting for the group's timeout
    (issue 32, deliverable 5). Every check that can differ between ranks runs inside the op's agreement.
    The group works on afterwards. (_all_ranks_true and _gather_values take a bool and an int: no
    argument of theirs can be bad on one rank.)"""

    def _all_raise(self, name, good, bad):
        start = time.monotonic()
        error = None
        try:
            (bad if self.rank == BAD else good)()
        except Exception as exc:  # noqa: BLE001 - what each rank raised is compared below
            error = exc
        elapsed = time.monotonic() - start
        self.assertIsNotNone(error, f"{name}: rank {self.rank} did not raise")
        self.assertLess(elapsed, 10.0, f"{name}: rank {self.rank} raised after {elapsed:.1f} s")
        classes = [None] * WORLD
        dist.all_gather_object(classes, type(error).__name__)
        self.assertEqual(len(set(classes)), 1, f"{name}: {classes}: {error}")
        if self.rank != BAD:
            self.assertIn(f"rank {BAD} of the process group rejected its arguments ({classes[BAD]}: ", str(error))

    @with_comms(init_rpc=False)
    def test_every_communicating_op(self):
        group = dist.group.WORLD.group_name
        device = rank_device(self.rank)
        placements, owners = [placement(r) for r in range(WORLD)], list(range(WORLD))
        full = torch.arange(64.0, device=device).view(16, 4)

        def shard(dim):
            return lambda: _ops.shard(
                full if self.rank == 0 else None, 0, [16, 4], torch.float32, dim, None, None, None, placements,
                owners, False, group,
            )

        self._all_raise("shard", shard(0), shard(5))
        st = _shard_tensor(full, _rows())
        out = torch.empty(16, 4, device=device) if self.rank == 0 else None
        self._all_raise("gather", lambda: _ops.gather(st, 0, out), lambda: _ops.gather(st, 7, None))
        self._all_raise(
            "reshard",
            lambda: _ops.reshard(st, 1, None, None, None, placements, owners),
            lambda: _ops.reshard(st, 1, None, None, None, placements[:3], owners),
        )
        self._all_raise(
            "_agree_shard",
            lambda: _ops._agree_shard(0, [16, 4], torch.float32, 0, group),
            lambda: _ops._agree_shard(9, [16, 4], torch.float32, 0, group),
        )
        self._all_raise(
            "_abort",
            lambda: _ops._all_ranks_true(True, group),
            lambda: _ops._abort("no such op", "ValueError", group),
        )
        part = torch.arange(3, device=device)
        self._all_raise(
            "_share_inputs",
            lambda: _ops._share_inputs([part], 0, 0, group),
            lambda: _ops._share_inputs([part.view(1, 3)], 0, 0, group),
        )
        # The lookups and max_norm, on a 16 x 4 table: rows in blocks of 4, or columns in blocks of 1.
        local_rows = torch.rand(4, 4, device=device, requires_grad=True)
        local_cols = torch.rand(16, 1, device=device, requires_grad=True)
        ids = torch.tensor([1, 5, 9, 14], device=device)
        rows_layout = ([0, 4, 8, 12], [4, 4, 4, 4])
        cols_layout = ([0, 1, 2, 3], [1, 1, 1, 1])

        def lookup(op, local, layout, ids=ids):
            return lambda: op(local, ids, None, None, *layout, 16, -1, "embedding", False, True, 0, [], group)

        self._all_raise(
            "_rowwise_lookup",
            lookup(_ops._rowwise_lookup, local_rows, rows_layout),
            lookup(_ops._rowwise_lookup, local_rows[:3], rows_layout),
        )
        self._all_raise(
            "_colwise_lookup",
            lookup(_ops._colwise_lookup, local_cols, cols_layout),
            lookup(_ops._colwise_lookup, local_cols, cols_layout, ids.int()),
        )
        out, saved = lookup(_ops._rowwise_lookup, local_rows, rows_layout)()
        self._all_raise(
            "_rowwise_lookup_backward",
            lambda: _ops._rowwise_lookup_backward(torch.ones_like(out), saved, -1, "embedding", group),
            lambda: _ops._rowwise_lookup_backward(torch.ones(3, 4, device=device), saved, -1, "embedding", group),
        )
        out, saved = lookup(_ops._colwise_lookup, local_cols, cols_layout)()
        self._all_raise(
            "_colwise_lookup_backward",
            lambda: _ops._colwise_lookup_backward(torch.ones_like(out), saved, -1, "embedding", group),
            lambda: _ops._colwise_lookup_backward(torch.ones_like(out), saved[:3], -1, "embedding", group),
        )
        # Every check a backward makes of what its caller passed (backward_head): the mode, the gradient's
        # dims, and the saved counts' dtype and length (they are the last saved tensor of both ops).
        for name, forward, local, layout in (
            ("_rowwise_lookup_backward", _ops._rowwise_lookup, local_rows, rows_layout),
            ("_colwise_lookup_backward", _ops._colwise_lookup, local_cols, cols_layout),
        ):
            out, saved = lookup(forward, local, layout)()
            backward, grad = getattr(_ops, name), torch.ones_like(out)
            good = (grad, saved, -1, "embedding", group)
            bad_args = {
                "mode": (grad, saved, -1, "bogus", group),
                "1-D grad": (grad.flatten(), saved, -1, "embedding", group),
                "float counts": (grad, saved[:-1] + [saved[-1].double()], -1, "embedding", group),
                "short counts": (grad, saved[:-1] + [saved[-1][:-1]], -1, "embedding", group),
            }
            for what, args in bad_args.items():
                self._all_raise(f"{name} ({what})", partial(backward, *good), partial(backward, *args))

        def renorm(dim, local, layout, ids):
            return lambda: _ops._embedding_renorm_(local.detach(), ids, dim, *layout, 16, 1.0, 2.0, 0, [], group)

        for dim, local, layout in ((0, local_rows, rows_layout), (1, local_cols, cols_layout)):
            self._all_raise(
                f"_embedding_renorm_ dim {dim}", renorm(dim, local, layout, ids), renorm(dim, local, layout, ids.float())
            )
        assert_group_still_works(self)


if __name__ == "__main__":
    run_tests()
