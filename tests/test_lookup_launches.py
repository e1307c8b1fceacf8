"""How many ATen ops a sharded lookup launches on the GPU path, beside upstream ``_shard``'s.

On a GPU every ATen op that does work is a kernel launch, and at the sizes recommendation models look
up a launch costs more than its work. The lookups take fused loops for CPU tensors and an ATen
composition on every other device; ``cpu_loops(False)`` runs that composition on the CPU, so the ops
one call dispatches there (torch.profiler, ``torch_shard.testing._aten_work``) are the kernels it
launches on a GPU. Four ranks, a row- and a column-sharded table, every mode, a 2-D input and a 1-D
one with offsets, forward and backward:

* every forward and every backward launches no more than upstream's of the same lookup;
* max launches no more beyond sum's than the dense op does (ATen's CPU max kernel dispatches a few more
  ops than its sum kernel, more with int32 ids, which the lookups hand it where the table allows; on
  CUDA each is one kernel): row-wise max pools on the requester (NOTE [ Max pools on the requester ]),
  with no pass per owner.
"""
import itertools

import torch
import torch.distributed._shard.sharded_tensor as upstream_st
import torch.distributed._shard.sharding_spec as upstream_spec
import torch.nn.functional as F

import torch_shard.sharded_tensor as ts_st
import torch_shard.sharding_spec as ts_spec
from torch_shard.testing import ShardedTensorTestBase, cpu_loops, placement, rank_device, run_tests, with_comms
from torch_shard.testing._aten_work import aten_work_ops

MODES = ("embedding", "sum", "mean", "max")


def _lookup(mode, ids, offsets, weight):
    if mode == "embedding":
        return F.embedding(ids, weight)
    return F.embedding_bag(ids, weight, offsets, mode=mode)


def _launches(mode, ids, offsets, weight):
    """(forward, backward) ATen ops that do work, in one call each, after a warm-up call."""
    _lookup(mode, ids, offsets, weight).sum().backward()
    forward = sum(aten_work_ops(lambda: _lookup(mode, ids, offsets, weight)).values())
    out = _lookup(mode, ids, offsets, weight)
    backward = sum(aten_work_ops(lambda: out.sum().backward()).values())
    return forward, backward


class TestLookupLaunches(ShardedTensorTestBase):
    @with_comms(init_rpc=False)
    def test_launches_beside_upstream(self):
        rows, dim = 400, 8
        placements = [placement(r) for r in range(self.world_size)]
        torch.manual_seed(self.rank)
        ids = torch.randint(0, rows, (32, 5)).to(rank_device(self.rank))
        inputs = {"2-D": (ids, None), "1-D": (ids.reshape(-1), torch.arange(0, ids.numel(), 5, device=ids.device))}
        counts = {}
        with cpu_loops(False):
            for shard_dim in (0, 1):
                weights = {
                    "upstream": upstream_st.rand(
                        upstream_spec.ChunkShardingSpec(dim=shard_dim, placements=placements), rows, dim, requires_grad=True
                    ),
                    "torch_shard": ts_st.rand(
                        ts_spec.ChunkShardingSpec(dim=shard_dim, placements=placements), rows, dim, requires_grad=True
                    ),
                }
                dense = torch.rand(rows, dim, device=ids.device, requires_grad=True)
                for (shape, (ids, offsets)), mode in itertools.product(inputs.items(), MODES):
                    for library, weight in weights.items():
                        counts[shard_dim, shape, mode, library] = _launches(mode, ids, offsets, weight)
                    for dtype in (torch.int64, torch.int32):
                        as_dtype = None if offsets is None else offsets.to(dtype)
                        counts[shard_dim, shape, mode, dtype] = _launches(mode, ids.to(dtype), as_dtype, dense)
        failures = []
        for (shard_dim, shape, mode, library), (forward, backward) in counts.items():
            if library != "torch_shard":
                continue
            up_forward, up_backward = counts[shard_dim, shape, mode, "upstream"]
            case = (
                f"{'row' if shard_dim == 0 else 'column'}-wise {mode}, {shape} input: torch_shard "
                f"{forward}/{backward}, upstream {up_forward}/{up_backward}"
            )
            if backward > up_backward or forward > up_forward:
                failures.append(case)
            dense_extra = max(
                counts[shard_dim, shape, "max", dtype][0] - counts[shard_dim, shape, "sum", dtype][0]
                for dtype in (torch.int64, torch.int32)
            )
            if mode == "max" and forward - counts[shard_dim, shape, "sum", "torch_shard"][0] > dense_extra:
                failures.append(f"{case}: max forward over sum's by more than the dense op's")
        self.assertEqual(failures, [], "launches (forward/backward) over their bounds")


if __name__ == "__main__":
    run_tests()
