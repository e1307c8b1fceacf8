"""Sharded lookups in a group of one rank (NOTE [ One rank holds the whole table ] in
torch_shard/sharding_spec/chunk_sharding_spec_ops/_lookup.py): the dense op on the shard.

One process, a 1-rank gloo group: F.embedding and F.embedding_bag (sum, mean, max) on a row- and a
column-sharded weight give the dense op's values and gradients for every option the sharded ops take
(padding_idx, per_sample_weights, include_last_offset, 2-D input, max_norm), and dispatch exactly the
ATen ops the dense op does, forward and backward, on the GPU path (cpu_loops(False)) and the CPU's.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from torch_shard import _shard_tensor
from torch_shard.sharding_spec import ChunkShardingSpec
from torch_shard.testing import cpu_loops
from torch_shard.testing._aten_work import aten_work_ops


@pytest.fixture(scope="module")
def one_rank_group():
    # (gloo's file store removes its file when the group goes)
    with tempfile.TemporaryDirectory(prefix="torch_shard_one_rank_") as folder:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(folder, 'store')}", rank=0, world_size=1)
        yield
        dist.destroy_process_group()


def _cases():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (24,), generator=gen)
    offsets = torch.tensor([0, 3, 3, 10, 17])
    weights = torch.rand(24, generator=gen)
    return [
        ("embedding", lambda w: F.embedding(ids.view(4, 6), w)),
        ("embedding, padding_idx", lambda w: F.embedding(ids, w, padding_idx=7)),
        ("embedding, max_norm", lambda w: F.embedding(ids, w, max_norm=1.5)),
        ("sum", lambda w: F.embedding_bag(ids, w, offsets, mode="sum")),
        ("sum, per_sample_weights", lambda w: F.embedding_bag(ids, w, offsets, mode="sum", per_sample_weights=weights)),
        ("mean, include_last_offset", lambda w: F.embedding_bag(ids, w, offsets, mode="mean", include_last_offset=True)),
        ("mean, 2-D input", lambda w: F.embedding_bag(ids.view(4, 6), w, mode="mean")),
        ("max, padding_idx", lambda w: F.embedding_bag(ids, w, offsets, mode="max", padding_idx=ids[0].item())),
    ]


@pytest.mark.parametrize("dim", [0, 1])
def test_one_rank_lookups_are_the_dense_op(one_rank_group, dim):
    full = torch.rand(50, 8, generator=torch.Generator().manual_seed(1))
    for name, call in _cases():
        for fused in (True, False):
            with cpu_loops(fused):
                dense = full.clone().requires_grad_(True)
                sharded = _shard_tensor(full.clone(), ChunkShardingSpec(dim=dim, placements=["rank:0/cpu"]))
                local = sharded.local_shards()[0].tensor.requires_grad_(True)
                expected, got = call(dense), call(sharded)
                torch.testing.assert_close(got, expected, msg=name)
                expected.sum().backward()
                got.sum().backward()
                torch.testing.assert_close(local.grad, dense.grad, msg=name)
                # max_norm renormalised the rows in place, as the dense op does.
                torch.testing.assert_close(local.detach(), dense.detach(), msg=name)
                # The dense op's ATen ops, forward and backward, and at most 4 more (the host checks'
                # own: a 2-D input's offsets, ids as int64).
                dense.grad, local.grad = None, None
                dense_ops = aten_work_ops(lambda call=call, dense=dense: call(dense).sum().backward())
                sharded_ops = aten_work_ops(lambda call=call, sharded=sharded: call(sharded).sum().backward())
                assert not dense_ops - sharded_ops, f"{name}, fused {fused}: {dense_ops - sharded_ops} missing"
                extra = sharded_ops - dense_ops
                assert sum(extra.values()) <= 4, f"{name}, fused {fused}: {extra}"
