"""Every layout upstream's ChunkShardingSpec can produce works in every op that communicates (issue 32).

ChunkShardingSpec cuts a dim of size S into W chunks of ceil(S / W), so the last chunks can be empty,
and upstream's metadata puts chunk i at offset ceil(S / W) * i, which for an empty chunk can lie PAST
the end: 5 rows over 4 ranks are [0, 2), [2, 4), [4, 5) and an empty chunk at offset 6. With the
placements permuted, the empty chunks land on any rank, rank 0 included. Every such layout goes through
every op that communicates, against the dense op: scatter, gather, reshard (from it and to it),
init_from_local_shards, torch.equal / torch.allclose, and sharded F.embedding / F.embedding_bag (every
mode, per-sample weights, a padding id, max_norm), forward and backward, row- and column-wise.

Column-wise max_norm renormalises each row by its norm over every rank's columns; that must equal the
dense op for every norm_type (``TestMaxNormEveryNormType``), p = inf included (the max over the column
shards of their largest magnitude, not a sum of p-th powers).
"""

import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from _shared import shard_slice

from torch_shard import _shard_tensor, shard_parameter
from torch_shard.sharded_tensor import init_from_local_shards
from torch_shard.sharding_spec import ChunkShardingSpec
from torch_shard.testing import ShardedTensorTestBase, placement, rank_device, run_tests, with_comms

WORLD = 4
# Sizes of the sharded dim over 4 ranks: an empty chunk at the end (9: 3, 3, 3, 0 at offset 9), one
# past the end (5: 2, 2, 1, 0 at offset 6), two empty chunks (2: 1, 1, 0 at 2, 0 at 3), three (1).
SIZES = (9, 5, 2, 1)
# Chunks on ranks in order (the empty ones on the last ranks), or rotated so rank 0 holds the last
# chunk (an empty one on rank 0, the group's first rank and the hub of its agreement rounds).
ORDERS = ((0, 1, 2, 3), (1, 2, 3, 0))
OTHER = 7  # the size of the dim that is not sharded


def _spec(dim, order):
    return ChunkShardingSpec(dim=dim, placements=[placement(r) for r in order])


def _layouts():
    for dim in (0, 1):
        for size in SIZES:
            for order in ORDERS:
                shape = (size, OTHER) if dim == 0 else (OTHER, size)
                yield dim, size, order, shape


class TestEveryChunkLayout(ShardedTensorTestBase):
    def _check_data_ops(self, dim, order, shape):
        device = rank_device(self.rank)
        full = torch.arange(math.prod(shape), dtype=torch.float32, device=device).view(shape)
        spec = _spec(dim, order)
        st = _shard_tensor(full.clone(), spec)
        self.assertEqual(st.local_shards()[0].tensor, shard_slice(st, full))
        out = torch.empty(shape, device=device) if self.rank == 3 else None
        st.gather(3, out)
        if self.rank == 3:
            self.assertEqual(out, full)
        # Reshard to the other dim (itself an uneven layout with this order reversed) and back.
        other = _spec(1 - dim, tuple(reversed(order)))
        st.reshard(other)
        self.assertEqual(st.local_shards()[0].tensor, shard_slice(st, full))
        st.reshard(spec)
        self.assertEqual(st.local_shards()[0].tensor, shard_slice(st, full))
        # The same shards handed back in, and compared.
        again = init_from_local_shards(copy.deepcopy(st.local_shards()), *shape)
        self.assertEqual(again.local_shards()[0].tensor, shard_slice(again, full))
        self.assertTrue(torch.equal(st, again))
        self.assertTrue(torch.allclose(st, again))
        with torch.no_grad():
            again.local_shards()[0].tensor.add_(1.0)
        # Only the ranks holding data changed it (never the ones with an empty chunk): every rank
        # answers False.
        self.assertFalse(torch.equal(st, again))

    def _compare(self, dense, spec, make_input, call, max_norm_inputs=None):
        """Forward on this rank and the shard's gradient (from every rank's forward) against the dense
        module. ``max_norm_inputs``: the module renormalises; the dense reference is renormalised first
        with every rank's ids (the sharded op renormalises every row any rank looks up)."""
        sharded = copy.deepcopy(dense)
        shard_parameter(sharded, "weight", spec)
        weight = sharded.weight
        inputs, grad = make_input(self.rank)
        out = call(sharded, inputs)
        (out * grad).sum().backward()
        if max_norm_inputs is not None:
            everyone = torch.cat([max_norm_inputs(r) for r in range(self.world_size)])
            F.embedding(everyone, dense.weight, max_norm=dense.max_norm, norm_type=dense.norm_type)
        self.assertEqual(out, call(dense, inputs), f"{spec} forward")
        dense.zero_grad()
        total = 0
        for r in range(self.world_size):
            inputs_r, grad_r = make_input(r)
            total = total + (call(dense, inputs_r) * grad_r).sum()
        total.backward()
        shard = weight.local_shards()[0].tensor
        self.assertEqual(shard.detach(), shard_slice(weight, dense.weight.detach()), f"{spec} weight")
        self.assertIsNotNone(shard.grad, f"{spec} backward")
        self.assertEqual(shard.grad, shard_slice(weight, dense.weight.grad), f"{spec} backward")

    def _check_lookups(self, dim, order, shape):
        device = rank_device(self.rank)
        rows, cols = shape
        spec = _spec(dim, order)

        def gen(rank):
            return torch.Generator().manual_seed(100 + rank)

        def embedding_input(rank):
            g = gen(rank)
            ids = torch.randint(0, rows, (3, 4), generator=g)
            return ids.to(device), torch.randn(3, 4, cols, generator=g).to(device)

        def bag_input(rank):
            g = gen(rank)
            ids = torch.randint(0, rows, (9,), generator=g)
            offsets = torch.tensor([0, 3, 3, 6])  # an empty bag
            psw = torch.rand(9, generator=g)
            return (ids.to(device), offsets.to(device), psw.to(device)), torch.randn(4, cols, generator=g).to(device)

        for max_norm in (None, 0.9):
            torch.manual_seed(0)
            dense = nn.Embedding(rows, cols, padding_idx=rows - 1 if max_norm is None else None, max_norm=max_norm)
            dense = dense.to(device)
            with torch.no_grad():
                dense.weight.mul_(2.0)
            self._compare(
                dense,
                spec,
                embedding_input,
                lambda m, ids: m(ids),
                None if max_norm is None else (lambda r: embedding_input(r)[0].reshape(-1)),
            )
            for mode in ("sum", "mean", "max"):
                torch.manual_seed(1)
                pad = 0 if mode == "sum" and max_norm is None else None
                dense = nn.EmbeddingBag(rows, cols, mode=mode, padding_idx=pad, max_norm=max_norm).to(device)
                with torch.no_grad():
                    dense.weight.mul_(2.0)

                def call(m, inputs, mode=mode):
                    ids, offsets, psw = inputs
                    return m(ids, offsets, per_sample_weights=psw if mode == "sum" else None)

                self._compare(
                    dense,
                    spec,
                    bag_input,
                    call,
                    None if max_norm is None else (lambda r: bag_input(r)[0][0]),
                )

    @with_comms(init_rpc=False)
    def test_data_ops_on_every_chunk_layout(self):
        for dim, size, order, shape in _layouts():
            with self.subTest(dim=dim, size=size, order=order):
                self._check_data_ops(dim, order, shape)

    @with_comms(init_rpc=False)
    def test_lookups_on_every_chunk_layout(self):
        for dim, size, order, shape in _layouts():
            with self.subTest(dim=dim, size=size, order=order):
                self._check_lookups(dim, order, shape)

    @with_comms(init_rpc=False)
    def test_issue_repro_five_rows_over_four_ranks(self):
        # Issue 32, finding 7: nn.Embedding(5, 6) sharded row-wise; the chunk at offset 6 is empty.
        torch.manual_seed(0)
        device = rank_device(self.rank)
        dense = nn.Embedding(5, 6).to(device)
        sharded = copy.deepcopy(dense)
        shard_parameter(sharded, "weight", _spec(0, (0, 1, 2, 3)))
        self.assertEqual(sharded.weight.metadata().shards_metadata[3].shard_offsets, [6, 0])
        ids = torch.tensor([0, 4], device=device)
        self.assertEqual(F.embedding(ids, sharded.weight), F.embedding(ids, dense.weight))


class TestMaxNormEveryNormType(ShardedTensorTestBase):
    """max_norm renormalises (in place) every row any rank looks up by its whole norm, as the dense op
    does, for every norm_type: row-wise each owner renormalises its own rows; column-wise the norm
    combines every rank's columns (a sum of p-th powers; for p = inf the largest magnitude)."""

    @with_comms(init_rpc=False)
    def test_max_norm_equals_dense_for_every_norm_type(self):
        device = rank_device(self.rank)
        for dim, cols in ((0, 6), (1, 6), (1, 10)):  # columns 2, 2, 2, 0 and 3, 3, 3, 1
            for norm_type in (1.0, 2.0, 3.0, math.inf, 0.5, 1.5):
                for op in ("embedding", "embedding_bag"):
                    with self.subTest(dim=dim, cols=cols, norm_type=norm_type, op=op):
                        torch.manual_seed(0)
                        dense = (torch.randn(13, cols) * 2).to(device)
                        spec = _spec(dim, (0, 1, 2, 3))
                        weight = _shard_tensor(dense.clone(), spec)

                        def ids_of(rank):
                            return torch.randint(0, 13, (8,), generator=torch.Generator().manual_seed(rank)).to(device)

                        kwargs = {"max_norm": 1.0, "norm_type": norm_type}
                        if op == "embedding":
                            out = F.embedding(ids_of(self.rank), weight, **kwargs)
                        else:
                            offsets = torch.tensor([0, 3], device=device)
                            out = F.embedding_bag(ids_of(self.rank), weight, offsets, mode="sum", **kwargs)
                        everyone = torch.cat([ids_of(r) for r in range(self.world_size)])
                        # The dense op renormalises in place, on the CPU: on a GPU its kernel sums
                        # pow(w, p) without |w| for p other than 1 and 2 (NOTE [ max_norm on a sharded
                        # weight ]), where the sharded ops keep the definition on every device.
                        reference = dense.cpu()
                        F.embedding(everyone.cpu(), reference, **kwargs)
                        dense = reference.to(device)
                        if op == "embedding":
                            expected = F.embedding(ids_of(self.rank), dense)
                        else:
                            expected = F.embedding_bag(ids_of(self.rank), dense, offsets, mode="sum")
                        where = f"dim {dim}, {cols} columns, norm_type {norm_type}, {op}"
                        self.assertEqual(out, expected, msg=where)
                        self.assertEqual(weight.local_shards()[0].tensor, shard_slice(weight, dense), msg=where)


if __name__ == "__main__":
    run_tests()
