"""Training through a sharded EmbeddingBag (ours, not an upstream port).

Model: ``EmbeddingBag(V=40, D=8, mode="sum") -> Linear(8, 4)``. The EmbeddingBag weight is sharded
with ``shard_parameter`` (row-wise in one test, column-wise in the other, each over the three
placement orders upstream's op tests use), the Linear stays a dense replica on every rank, and the
model is trained for 5 SGD (and Adam) steps with ``ShardedOptimizer`` over ``named_params_with_sharded_tensor``.
Every rank trains on its own batch (different on every rank and every step; 2-D input on even
steps, 1-D input with offsets, including an empty bag, on odd steps).

What the distributed run computes, and so what the dense reference must compute:

* Each rank r calls ``loss_r.backward()`` on its own loss. The sharded lookup's backward is the
  reverse of the forward exchange, so the local shard on rank q receives, from EVERY rank r, the
  gradient of loss_r with respect to the rows/columns q owns: shard grad = the q-slice of
  ``sum_r d loss_r / d W``.
* The replicated Linear only sees loss_r's gradient; the test all-reduces (SUM) its gradients, as
  data-parallel training does, so every replica stays identical and also follows ``sum_r loss_r``.

Hence the distributed model does SGD on ``L = sum_r loss_r``. The dense reference (an unsharded copy
made before sharding) therefore evaluates the loss on ALL ranks' batches and steps on the sum: every
rank regenerates each rank's batch from the same per-(step, rank) seeds (equivalent to gathering the
inputs, without a collective in the reference). Checked at every step: this rank's loss equals the
reference's loss on this rank's batch, the local shard's gradient and the Linear's (all-reduced)
gradient equal the reference's, and after the step the local shard equals the matching slice of the
dense weight; at the end also the Linear.
"""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

from torch_shard import shard_parameter
from torch_shard.sharded_optim import ShardedOptimizer, named_params_with_sharded_tensor
from torch_shard.sharded_tensor import ShardedTensor
from torch_shard.sharding_spec._internals import get_chunked_dim_size, get_split_size
from torch_shard.testing import (
    TEST_WORLD_SIZE,
    ShardedTensorTestBase,
    rank_device,
    run_tests,
    with_comms,
)
from torch_shard.testing._test_ops_common import generate_chunk_sharding_specs_for_test

NUM_EMBEDDINGS = 40
EMBEDDING_DIM = 8
OUT_FEATURES = 4
NUM_BAGS = 4
STEPS = 5
LR = 0.1



def local_chunk(spec, dim_size, rank):
    """(start, length) of ``rank``'s chunk of a dimension of ``dim_size`` under a ChunkShardingSpec."""
    split = get_split_size(dim_size, len(spec.placements))
    start = 0
    for idx, p in enumerate(spec.placements):
        length = get_chunked_dim_size(dim_size, split, idx)
        if p.rank() == rank:
            return start, length
        start += length
    raise AssertionError(f"rank {rank} holds no chunk")


class EmbeddingBagLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.EmbeddingBag(NUM_EMBEDDINGS, EMBEDDING_DIM, mode="sum")
        self.fc = nn.Linear(EMBEDDING_DIM, OUT_FEATURES)

    def forward(self, inp, offsets=None):
        return self.fc(self.emb(inp, offsets=offsets))


def batch(step, rank, device):
    """Rank ``rank``'s batch at ``step``: (ids, offsets or None, targets), from its own seed."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    if step % 2 == 0:
        ids = torch.randint(0, NUM_EMBEDDINGS, (NUM_BAGS, 3), generator=g)
        offsets = None
    else:
        ids = torch.randint(0, NUM_EMBEDDINGS, (10,), generator=g)
        offsets = torch.tensor([0, 3, 3, 7])  # bag 1 is empty: contributes 0
    target = torch.randn(NUM_BAGS, OUT_FEATURES, generator=g)
    return ids.to(device), None if offsets is None else offsets.to(device), target.to(device)


class TestShardedTraining(ShardedTensorTestBase):
    def _train_and_compare(self, spec, optimizer_class=optim.SGD, **optimizer_kwargs):
        device = rank_device(self.rank)
        dim = spec.dim
        torch.manual_seed(0)
        model = EmbeddingBagLinear().to(device)
        dense = copy.deepcopy(model)

        shard_parameter(model.emb, "weight", spec)
        self.assertIsInstance(model.emb.weight, ShardedTensor)
        shard = model.emb.weight.local_shards()[0].tensor
        self.assertTrue(shard.requires_grad)
        start, length = local_chunk(spec, NUM_EMBEDDINGS if dim == 0 else EMBEDDING_DIM, self.rank)
        self.assertEqual(shard, dense.emb.weight.detach().narrow(dim, start, length))

        named = dict(named_params_with_sharded_tensor(model))
        self.assertEqual(sorted(named), ["emb.weight", "fc.bias", "fc.weight"])
        optimizer_kwargs = optimizer_kwargs or {"lr": LR}
        sharded_optim = ShardedOptimizer(named, optimizer_class, **optimizer_kwargs)
        dense_optim = optimizer_class(dense.parameters(), **optimizer_kwargs)

        for step in range(STEPS):
            # Distributed: this rank's batch only.
            ids, offsets, target = batch(step, self.rank, device)
            sharded_optim.zero_grad()
            loss = F.mse_loss(model(ids, offsets), target)
            loss.backward()
            for p in (model.fc.weight, model.fc.bias):
                dist.all_reduce(p.grad)

            # Dense reference: every rank's batch, one step on the sum of the losses.
            dense_optim.zero_grad()
            dense_losses = []
            for r in range(TEST_WORLD_SIZE):
                ids_r, offsets_r, target_r = batch(step, r, device)
                dense_losses.append(F.mse_loss(dense(ids_r, offsets_r), target_r))
            torch.stack(dense_losses).sum().backward()

            msg = f"spec {spec}, {optimizer_class.__name__}, step {step}"
            self.assertEqual(loss.detach(), dense_losses[self.rank].detach(), msg)
            shard = model.emb.weight.local_shards()[0].tensor
            self.assertIsNotNone(shard.grad, msg)
            self.assertEqual(shard.grad, dense.emb.weight.grad.narrow(dim, start, length), msg)
            self.assertEqual(model.fc.weight.grad, dense.fc.weight.grad, msg)
            self.assertEqual(model.fc.bias.grad, dense.fc.bias.grad, msg)

            sharded_optim.step()
            dense_optim.step()
            self.assertEqual(shard, dense.emb.weight.detach().narrow(dim, start, length), msg)

        # Final state: the local shard is the matching slice of the dense weight, the Linear equal.
        final_shard = model.emb.weight.local_shards()[0].tensor
        self.assertEqual(final_shard.detach(), dense.emb.weight.detach().narrow(dim, start, length))
        self.assertEqual(model.fc.weight, dense.fc.weight)
        self.assertEqual(model.fc.bias, dense.fc.bias)
        # Training moved the weights (the comparison above is not between two untouched copies).
        torch.manual_seed(0)
        initial = EmbeddingBagLinear().to(device)
        self.assertFalse(torch.allclose(final_shard.detach(), initial.emb.weight.detach().narrow(dim, start, length)))

    @with_comms(init_rpc=False)
    def test_sharded_embedding_bag_training_rowwise(self):
        for spec in generate_chunk_sharding_specs_for_test(0):
            self._train_and_compare(spec)
        # Adam keeps per-element state; on each local shard it must match dense Adam on the slice.
        self._train_and_compare(generate_chunk_sharding_specs_for_test(0)[1], optim.Adam, lr=0.05)

    @with_comms(init_rpc=False)
    def test_sharded_embedding_bag_training_colwise(self):
        for spec in generate_chunk_sharding_specs_for_test(1):
            self._train_and_compare(spec)
        self._train_and_compare(generate_chunk_sharding_specs_for_test(1)[2], optim.Adam, lr=0.05)


if __name__ == "__main__":
    run_tests()
