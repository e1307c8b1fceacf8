"""What the ATen embedding kernels get from the sharded embedding ops, and max-mode ties.

* Empty shards. PyTorch's CUDA embedding backward kernels cannot take an empty weight (an N x 0 or
  0 x D weight is an illegal memory access that poisons the CUDA context), and an empty shard is a
  normal state: 6 columns over 4 ranks leave one rank a 13 x 0 chunk, 9 rows over 4 ranks a 0 x 5
  one. torch.profiler records the weight shape every ATen embedding kernel receives (forward,
  backward, renorm; also inside torch_shard's C++ ops) on every rank, so the rule "no empty weight
  ever reaches one" (NOTE [ Empty shards reach no embedding kernel ] in csrc/ops/lookup_common.h) is
  checked on the CPU; the results and gradients still equal the dense op's.
* Max ties. When two ids of a bag hold the same maximum (a zero-initialised table ties everywhere),
  the dense op gives the gradient to the first of them in the bag (CPU and CUDA alike); the sharded
  op must give it to the same row, whichever rank owns it, and not split it between the owners.
"""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
from _shared import shard_slice

from torch_shard import shard_parameter
from torch_shard.sharding_spec import ChunkShardingSpec
from torch_shard.testing import (
    ShardedTensorTestBase,
    cpu_loops,
    placement,
    rank_device,
    run_tests,
    with_comms,
)

aten = torch.ops.aten


# The argument of each ATen embedding kernel that says its weight's rows: a tensor (its shape's first
# size) or an int (num_weights); the columns come from the same tensor or from the gradient's last size.
_WEIGHT_ARGUMENT = {
    "aten::embedding": ("tensor", 0),
    "aten::embedding_renorm_": ("tensor", 0),
    "aten::embedding_bag": ("tensor", 0),
    "aten::_embedding_bag": ("tensor", 0),
    "aten::_embedding_bag_forward_only": ("tensor", 0),
    "aten::_embedding_bag_per_sample_weights_backward": ("tensor", 1),  # (grad, weight, ...)
    "aten::embedding_backward": ("rows", 2),  # (grad_output, indices, num_weights, ...)
    "aten::embedding_dense_backward": ("rows", 2),
    "aten::_embedding_bag_backward": (
        "rows",
        6,
    ),  # (grad, indices, offsets, offset2bag, bag_size, max_indices, num_weights)
    "aten::_embedding_bag_dense_backward": (
        "rows",
        5,
    ),  # (grad, indices, offset2bag, bag_size, max_indices, num_weights)
}


class _RecordEmbeddingKernels:
    """Records (op name, weight shape) of every ATen embedding kernel call, with torch.profiler: it sees
    the kernels a C++ op calls inside itself (torch_shard._rowwise_lookup and its backward), which a
    TorchDispatchMode, seeing only the outermost op, would not. Enter it as often as needed."""

    def __init__(self):
        self.calls = []
        self._profiler = None

    def __enter__(self):
        self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
        self._profiler.__enter__()
        return self

    def __exit__(self, *exc):
        self._profiler.__exit__(*exc)
        for event in self._profiler.events():
            kind = _WEIGHT_ARGUMENT.get(event.name)
            if kind is None:
                continue
            how, index = kind
            shapes = event.input_shapes
            if how == "tensor":
                shape = tuple(shapes[index][:2])
            else:
                shape = (int(event.concrete_inputs[index]), shapes[0][-1])
            self.calls.append((event.name, shape))
        return False


class TestEmbeddingKernels(ShardedTensorTestBase):
    def _compare(self, dense, spec, make_input, call, record=None):
        """Forward and backward of every rank's input against ``dense``; with ``record``, the sharded
        forward and backward run under it."""
        sharded = copy.deepcopy(dense)
        shard_parameter(sharded, "weight", spec)
        weight = sharded.weight
        inputs, grad = make_input(self.rank, torch.Generator().manual_seed(self.rank))
        if record is not None:
            with record:
                out = call(sharded, inputs)
                (out * grad).sum().backward()
        else:
            out = call(sharded, inputs)
            (out * grad).sum().backward()
        self.assertEqual(out, call(dense, inputs), f"{spec} forward")
        dense.zero_grad()
        total = 0
        for r in range(self.world_size):
            inputs_r, grad_r = make_input(r, torch.Generator().manual_seed(r))
            total = total + (call(dense, inputs_r) * grad_r).sum()
        total.backward()
        shard = weight.local_shards()[0].tensor
        self.assertIsNotNone(shard.grad, f"{spec} backward")
        self.assertEqual(shard.grad, shard_slice(weight, dense.weight.grad), f"{spec} backward")

    def _cases(self, rows, cols, dim, record, init=None, modes=("sum", "mean", "max")):
        """Embedding and embedding_bag (sum with per-sample weights and a padding id, mean, max) on a
        ``rows`` x ``cols`` table sharded on ``dim`` over every rank."""
        device = rank_device(self.rank)
        spec = ChunkShardingSpec(dim=dim, placements=[placement(r) for r in range(self.world_size)])

        def embedding_input(rank, g):
            ids = torch.randint(0, rows, (3, 4), generator=g)
            return ids.to(device), torch.randn(3, 4, cols, generator=g).to(device)

        def bag_input(rank, g):
            ids = torch.randint(0, rows, (11,), generator=g)
            offsets = torch.tensor([0, 3, 3, 7])  # with an empty bag
            psw = torch.rand(11, generator=g)
            return (ids.to(device), offsets.to(device), psw.to(device)), torch.randn(4, cols, generator=g).to(device)

        def reset(module):
            if init is not None:
                with torch.no_grad():
                    module.weight.copy_(init(rows, cols).to(device))
            return module

        if "embedding" in modes:
            torch.manual_seed(0)
            dense = reset(nn.Embedding(rows, cols, padding_idx=1).to(device))
            self._compare(dense, spec, embedding_input, lambda m, ids: m(ids), record)
        for mode in modes:
            if mode == "embedding":
                continue
            torch.manual_seed(1)
            dense = reset(nn.EmbeddingBag(rows, cols, mode=mode, padding_idx=2 if mode == "sum" else None).to(device))

            def call(m, inputs, mode=mode):
                ids, offsets, psw = inputs
                return m(ids, offsets, per_sample_weights=psw if mode == "sum" else None)

            self._compare(dense, spec, bag_input, call, record)

    def _check_no_empty_weight(self, rows, cols, dim):
        record = _RecordEmbeddingKernels()
        self._cases(rows, cols, dim, record, modes=("embedding", "sum", "mean", "max"))
        # Every lookup here is one C++ call each way (torch_shard._rowwise_lookup / _colwise_lookup):
        # the recorder must see the kernels they call inside, forward and backward, on some rank.
        seen = [None] * self.world_size
        dist.all_gather_object(seen, sorted({op for op, _ in record.calls}))
        seen = set().union(*seen)
        for kernel in (
            "aten::embedding",
            "aten::_embedding_bag",
            "aten::embedding_dense_backward",
            "aten::_embedding_bag_backward",
        ):
            self.assertIn(kernel, seen)
        # max_norm renormalises in place first (torch_shard._embedding_renorm_ on the looked-up rows),
        # never on an empty shard either.
        device = rank_device(self.rank)
        spec = ChunkShardingSpec(dim=dim, placements=[placement(r) for r in range(self.world_size)])
        for module in (nn.Embedding(rows, cols, max_norm=0.5), nn.EmbeddingBag(rows, cols, max_norm=0.5)):
            sharded = copy.deepcopy(module.to(device))
            shard_parameter(sharded, "weight", spec)
            ids = torch.randint(0, rows, (2, 3), generator=torch.Generator().manual_seed(self.rank)).to(device)
            with record:
                sharded(ids).sum().backward()
        empty = [(op, shape) for op, shape in record.calls if 0 in shape]
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, (sorted({op for op, _ in record.calls}), empty))
        self.assertEqual([bad for _, bad in gathered], [[]] * self.world_size, "empty weights reached ATen kernels")
        # The mode sees the kernels at all (forward and backward) on the ranks with a non-empty shard.
        everywhere = set().union(*(set(ops) for ops, _ in gathered))
        self.assertTrue(any("backward" in op for op in everywhere), everywhere)
        self.assertTrue(any("backward" not in op for op in everywhere), everywhere)

    @with_comms(init_rpc=False)
    def test_empty_column_shard_reaches_no_kernel(self):
        # 6 columns over 4 ranks: chunks of 2, 2, 2 and 0 (rank 3 holds a 13 x 0 chunk).
        self._check_no_empty_weight(13, 6, dim=1)

    @with_comms(init_rpc=False)
    def test_empty_row_shard_reaches_no_kernel(self):
        # 9 rows over 4 ranks: chunks of 3, 3, 3 and 0 (rank 3 holds a 0 x 5 chunk).
        self._check_no_empty_weight(9, 5, dim=0)

    @with_comms(init_rpc=False)
    def test_max_ties_give_the_gradient_to_the_dense_ops_row(self):
        # A zero table ties everywhere; a table of 0s and 1s ties often, between owners too.
        def zeros(rows, cols):
            return torch.zeros(rows, cols)

        def zeros_and_ones(rows, cols):
            return torch.randint(0, 2, (rows, cols), generator=torch.Generator().manual_seed(5)).float()

        for init in (zeros, zeros_and_ones):
            for dim in (0, 1):
                self._cases(13, 7, dim, None, init=init, modes=("max",))

    @with_comms(init_rpc=False)
    def test_row_wise_ids_go_only_to_their_owners(self):
        # NOTE [ Ids only to their owners ]: with the same bags, what a rank sends grows by one int32
        # per id that ANOTHER rank owns, and not at all for its own ids (every id used to reach every
        # rank, whoever owned it). Exact byte counts, so any extra traffic fails.
        import torch.nn.functional as F

        from torch_shard import sharded_tensor

        spec = ChunkShardingSpec(dim=0, placements=[placement(r) for r in range(self.world_size)])
        weight = sharded_tensor.rand(spec, 10 * self.world_size, 3)  # rank r owns rows [10r, 10r + 10)
        device = rank_device(self.rank)
        offsets = torch.tensor([0, 2, 2, 5], device=device)
        mixed = torch.tensor([0, 11, 25, 3, 39, 17, 8, 30], device=device)
        own = torch.arange(8, device=device) + 10 * self.rank
        foreign = int(((mixed < 10 * self.rank) | (mixed >= 10 * self.rank + 10)).sum())

        def sent(ids, mode):
            torch.ops.torch_shard._comm_stats(True)
            F.embedding_bag(ids, weight, offsets, mode=mode)
            return torch.ops.torch_shard._comm_stats(True)[0]

        # NOTE [ Idle owners ] in csrc/ops/rowwise_lookup.cpp: an owner that holds none of a requester's
        # ids gets no lengths from it and sends it no results, so ids that are all a rank's own move
        # nothing beyond what four empty bags move (the agreement, whose bytes count too when its round
        # goes through a hub)...
        others = self.world_size - 1
        no_ids = torch.zeros(0, dtype=torch.int64, device=device)
        offsets_of_empty = torch.zeros(4, dtype=torch.int64, device=device)
        for mode in ("sum", "max"):
            torch.ops.torch_shard._comm_stats(True)
            F.embedding_bag(no_ids, weight, offsets_of_empty, mode=mode)
            base = torch.ops.torch_shard._comm_stats(True)[0]
            self.assertEqual(sent(own, mode) - base, 0, mode)
            # ... and every rank's `mixed` bags use rows of every rank. Sum: its foreign ids (int32), 4
            # lengths (int32) to each other owner, and 4 partial bags of 3 floats back to each other
            # requester. Max (NOTE [ Max pools on the requester ]): its foreign ids alone, and back to
            # each other requester the row (3 floats) of each of that requester's ids this rank owns.
            if mode == "sum":
                expected = 4 * foreign + others * 4 * 4 + others * 4 * 3 * 4
            else:
                expected = 4 * foreign + others * (len(mixed) - foreign) * 3 * 4
            self.assertEqual(sent(mixed, mode) - base, expected, mode)

    @with_comms(init_rpc=False)
    def test_composition_path_matches_dense(self):
        # NOTE [ Requester-side routing in one op ]: on the CPU the lookups check and bucket their ids
        # with loops; every other device takes the ATen composition, run here on the CPU too (uneven rows
        # and columns with an empty shard, ties, every mode).
        with cpu_loops(False):
            self._check_no_empty_weight(9, 5, dim=0)
            self._check_no_empty_weight(13, 6, dim=1)
            self._cases(13, 7, 0, None, init=lambda rows, cols: torch.zeros(rows, cols), modes=("max",))


if __name__ == "__main__":
    run_tests()
