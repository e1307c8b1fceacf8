"""Sharded embedding / embedding_bag on a sub-group, with placements out of rank order and with RPC
worker names, forward and backward against the dense module.

Placements name GLOBAL ranks (or workers) while the exchanges index ranks of the weight's process
group: on ``new_group([1, 3])`` global rank 3 is group rank 1, and "worker1/cpu" is whichever group
rank worker 1 is. Sizes are uneven (13 rows, 7 columns over 2 or 4 shards), so rows or columns sent
to the wrong rank change shapes or values.

Every member rank looks up its own input (seeded by its rank). Its output must equal the dense
module's on that input, and, after every member's ``loss_r.backward()``, its local shard's gradient
must equal the matching slice of the dense gradient of ``sum_r loss_r`` over the members (the
backward of the lookup returns each member's gradient to the rows' or columns' owner).
"""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
from _shared import shard_slice

from torch_shard import shard_parameter
from torch_shard.sharded_tensor import ShardedTensor
from torch_shard.sharding_spec import ChunkShardingSpec
from torch_shard.testing import (
    ShardedTensorTestBase,
    placement,
    rank_device,
    run_tests,
    with_comms,
    worker_placement,
)

NUM_EMBEDDINGS, EMBEDDING_DIM = 13, 7



class TestShardedEmbeddingPlacements(ShardedTensorTestBase):
    def _compare(self, dense: nn.Module, spec, group, members, make_input, call) -> None:
        """Shard a copy of ``dense`` by ``spec`` on ``group``; forward and backward of every member's
        input (``make_input(rank, generator)`` -> (inputs, output gradient)) against ``dense``."""
        sharded = copy.deepcopy(dense)
        shard_parameter(sharded, "weight", spec, process_group=group)
        weight = sharded.weight
        self.assertIsInstance(weight, ShardedTensor)
        self.assertEqual(weight.local_shards()[0].tensor, shard_slice(weight, dense.weight.detach()))

        inputs, grad = make_input(self.rank, torch.Generator().manual_seed(self.rank))
        out = call(sharded, inputs)
        self.assertEqual(out, call(dense, inputs), f"{spec} forward")
        (out * grad).sum().backward()

        dense.zero_grad()
        total = 0
        for r in members:
            inputs_r, grad_r = make_input(r, torch.Generator().manual_seed(r))
            total = total + (call(dense, inputs_r) * grad_r).sum()
        total.backward()
        shard = weight.local_shards()[0].tensor
        self.assertIsNotNone(shard.grad, f"{spec} backward")
        self.assertEqual(shard.grad, shard_slice(weight, dense.weight.grad), f"{spec} backward")

    def _run_all(self, placements, group, members) -> None:
        """Embedding and embedding_bag (sum with per-sample weights, mean, max), row- and column-wise."""
        if self.rank not in members:
            return  # a collective of the sub-group: ranks outside it do not call it
        device = rank_device(self.rank)

        def embedding_input(rank, g):
            ids = torch.randint(0, NUM_EMBEDDINGS, (3, 4), generator=g)
            return ids.to(device), torch.randn(3, 4, EMBEDDING_DIM, generator=g).to(device)

        def bag_input_1d(rank, g):
            ids = torch.randint(0, NUM_EMBEDDINGS, (9,), generator=g)
            offsets = torch.tensor([0, 2, 2, 6])  # with an empty bag
            psw = torch.rand(9, generator=g)
            return (ids.to(device), offsets.to(device), psw.to(device)), torch.randn(4, EMBEDDING_DIM, generator=g).to(device)

        def bag_input_2d(rank, g):
            ids = torch.randint(0, NUM_EMBEDDINGS, (5, 3), generator=g)
            return (ids.to(device), None, None), torch.randn(5, EMBEDDING_DIM, generator=g).to(device)

        for dim in (0, 1):
            spec = ChunkShardingSpec(dim=dim, placements=placements)
            torch.manual_seed(0)
            dense = nn.Embedding(NUM_EMBEDDINGS, EMBEDDING_DIM, padding_idx=4).to(device)
            self._compare(dense, spec, group, members, embedding_input, lambda m, ids: m(ids))
            for mode, make in (("sum", bag_input_1d), ("mean", bag_input_1d), ("max", bag_input_2d), ("mean", bag_input_2d)):
                torch.manual_seed(1)
                dense = nn.EmbeddingBag(NUM_EMBEDDINGS, EMBEDDING_DIM, mode=mode).to(device)

                def call(m, inputs, mode=mode):
                    ids, offsets, psw = inputs
                    return m(ids, offsets, per_sample_weights=psw if mode == "sum" else None)

                self._compare(dense, spec, group, members, make, call)

    @with_comms(init_rpc=False)
    def test_sub_group_rank_placements(self):
        group = dist.new_group([1, 3])  # every rank creates it; only 1 and 3 use it
        for order in ((3, 1), (1, 3)):
            self._run_all([placement(r) for r in order], group, [1, 3])

    @with_comms(init_rpc=False)
    def test_permuted_rank_placements(self):
        self._run_all([placement(r) for r in (1, 3, 0, 2)], dist.group.WORLD, [0, 1, 2, 3])

    @with_comms(init_rpc=False)
    def test_round_one_as_an_all_to_all_of_used_bytes(self):
        """The lookups' exchanges carry device-computed words and statuses in round 1 (NOTE [ One host
        read per exchange ]); with round 1 as an all-to-all of used bytes (NOTE [ Round 1 of used
        bytes ]: gloo builds it on the host) every lookup, forward and backward, gives the dense result.
        On other backends the switch changes nothing and the same checks run."""
        try:
            torch.ops.torch_shard_testing._set_exchange(hub=False)
            self._run_all([placement(r) for r in (1, 3, 0, 2)], dist.group.WORLD, [0, 1, 2, 3])
        finally:
            torch.ops.torch_shard_testing._set_exchange()

    @with_comms(init_rpc=False)
    def test_shared_inputs_of_every_size_through_every_round(self):
        """A column-wise lookup hands every peer the same packed message of its ids, which the exchange
        copies once per run of evenly spaced blocks (comm::write_payloads). Small inputs ride in round
        1, large ones take round 2; through the hub and as an all-to-all, every lookup, forward and
        backward, gives the dense result."""
        device = rank_device(self.rank)
        spec = ChunkShardingSpec(dim=1, placements=[placement(r) for r in (1, 3, 0, 2)])
        members = list(range(self.world_size))

        def bags_of(n):
            def make(rank, g):
                ids = torch.randint(0, NUM_EMBEDDINGS, (n,), generator=g)
                offsets = torch.arange(0, n, 5)
                grad = torch.randn(offsets.numel(), EMBEDDING_DIM, generator=g, dtype=torch.float64)
                return (ids.to(device), offsets.to(device)), grad.to(device)

            return make

        try:
            for hub in (True, False):
                torch.ops.torch_shard_testing._set_exchange(hub=hub)
                for n in (7, 60_000):
                    torch.manual_seed(2)
                    # float64: sums of thousands of gradients in another order than the dense op's.
                    dense = nn.EmbeddingBag(NUM_EMBEDDINGS, EMBEDDING_DIM, mode="sum").to(device, torch.float64)
                    self._compare(dense, spec, dist.group.WORLD, members, bags_of(n), lambda m, i: m(*i))
        finally:
            torch.ops.torch_shard_testing._set_exchange()

    @with_comms(init_rpc=True)
    def test_worker_name_placements(self):
        self._run_all([worker_placement(r) for r in (2, 0, 3, 1)], dist.group.WORLD, [0, 1, 2, 3])
        group = dist.new_group([1, 3])
        self._run_all([worker_placement(r) for r in (3, 1)], group, [1, 3])


if __name__ == "__main__":
    run_tests()
