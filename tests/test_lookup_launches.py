"""How many ATen ops a sharded lookup launches on the GPU path, beside upstream ``_shard``'s.

On a GPU every ATen op that does work is a kernel launch, and at the sizes recommendation models look
up a launch costs more than its work. The lookups take fused loops for CPU tensors and an ATen
composition on every other device; ``cpu_loops(False)`` runs that composition on the CPU, so the ops
one call dispatches there (torch.profiler, ``torch_shard.testing._aten_work``) are the kernels it
launches on a GPU. Four ranks, a row- and a column-sharded table, every mode, forward and backward:

* every backward launches no more than upstream's backward of the same lookup;
* every column-wise forward and the row-wise F.embedding forward launch no more than upstream's;
* the row-wise embedding_bag forwards stay within their budgets below. They launch more than
  upstream's (which gathers every rank's input on every rank and looks it all up densely), because
  they send each id only to its owner and pool there: fewer bytes, more ops.
"""

import torch
import torch.distributed._shard.sharded_tensor as upstream_st
import torch.distributed._shard.sharding_spec as upstream_spec
import torch.nn.functional as F

import torch_shard.sharded_tensor as ts_st
import torch_shard.sharding_spec as ts_spec
from torch_shard.testing import ShardedTensorTestBase, cpu_loops, placement, rank_device, run_tests, with_comms
from torch_shard.testing._aten_work import aten_work_ops

MODES = ("embedding", "sum", "mean", "max")

# Row-wise embedding_bag forwards: the ops they may launch beyond upstream's in the same case.
ROWWISE_BAG_BUDGET = {"sum": 5, "mean": 5, "max": 30}


def _lookup(mode, ids, weight):
    if mode == "embedding":
        return F.embedding(ids, weight)
    return F.embedding_bag(ids, weight, mode=mode)


def _launches(mode, ids, weight):
    """(forward, backward) ATen ops that do work, in one call each, after a warm-up call."""
    _lookup(mode, ids, weight).sum().backward()
    forward = sum(aten_work_ops(lambda: _lookup(mode, ids, weight)).values())
    out = _lookup(mode, ids, weight)
    backward = sum(aten_work_ops(lambda: out.sum().backward()).values())
    return forward, backward


class TestLookupLaunches(ShardedTensorTestBase):
    @with_comms(init_rpc=False)
    def test_launches_beside_upstream(self):
        rows, dim = 400, 8
        placements = [placement(r) for r in range(self.world_size)]
        torch.manual_seed(self.rank)
        ids = torch.randint(0, rows, (32, 5)).to(rank_device(self.rank))
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
                for mode in MODES:
                    for library, weight in weights.items():
                        counts[shard_dim, mode, library] = _launches(mode, ids, weight)
        failures = []
        for (shard_dim, mode, library), (forward, backward) in counts.items():
            if library != "torch_shard":
                continue
            up_forward, up_backward = counts[shard_dim, mode, "upstream"]
            case = f"{'row' if shard_dim == 0 else 'column'}-wise {mode}: torch_shard {forward}/{backward}, upstream {up_forward}/{up_backward}"
            budget = 0 if shard_dim == 1 or mode == "embedding" else ROWWISE_BAG_BUDGET[mode]
            if backward > up_backward or forward > up_forward + budget:
                failures.append(case)
        self.assertEqual(failures, [], "launches (forward/backward) over their bounds")

if __name__ == "__main__":
    run_tests()
