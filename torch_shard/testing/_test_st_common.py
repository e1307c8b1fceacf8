"""Helpers the ported ShardedTensor tests share (upstream's _test_st_common)."""

from __future__ import annotations

import copy
import random

import torch

from .. import sharded_tensor
from ..sharding_spec import ChunkShardingSpec
from . import TEST_WORLD_SIZE, placement


def _initial_placements() -> list[str]:
    try:
        return [placement(rank) for rank in range(TEST_WORLD_SIZE)]
    except (RuntimeError, ValueError):
        # An unusable TORCH_SHARD_TEST_DEVICE: importing must still work; each test says why it fails.
        return []


# As upstream, a module-level list that _chunk_sharding_specs_list_for_test shuffles in place, so
# specs depend on earlier calls in the same process. Each test runs in fresh rank processes, which
# makes that deterministic per test.
PLACEMENTS = _initial_placements()


def _placements_of_this_run() -> list[str]:
    """PLACEMENTS, rebuilt in rank order if they were made for another device. A rank may have this
    module from the fork server, imported before the rank took the test's TORCH_SHARD_TEST_DEVICE."""
    current = [placement(rank) for rank in range(TEST_WORLD_SIZE)]
    if sorted(PLACEMENTS) != sorted(current):
        PLACEMENTS[:] = current
    return PLACEMENTS


DEFAULT_GPU_NUM = TEST_WORLD_SIZE


def _chunk_sharding_specs_list_for_test(sharding_dims, seed=0):
    placements = _placements_of_this_run()
    spec_list = []
    for i in range(len(sharding_dims)):
        random.Random(seed + i).shuffle(placements)
        spec_list.append(ChunkShardingSpec(dim=sharding_dims[i], placements=copy.deepcopy(placements)))
    return spec_list


def _rand_10x20(spec, group, init_rrefs: bool):
    """A 10 x 20 ShardedTensor from U[0, 1) sharded by ``spec``; None without a spec."""
    if spec is None:
        return None
    return sharded_tensor.rand(spec, 10, 20, process_group=group, init_rrefs=init_rrefs)


class MyShardedModel2(torch.nn.Module):
    def __init__(self, spec=None, group=None, init_rrefs=True) -> None:
        super().__init__()
        self.sharded_tensor2 = _rand_10x20(spec, group, init_rrefs)
        self.random_tensor2 = torch.nn.Parameter(torch.rand(2, 2))


class MyShardedModel1(torch.nn.Module):
    def __init__(self, spec=None, group=None, init_rrefs=True) -> None:
        super().__init__()
        self.sharded_tensor1 = _rand_10x20(spec, group, init_rrefs)
        self.random_tensor1 = torch.nn.Parameter(torch.rand(2, 2))
        self.submodule = MyShardedModel2(spec, group, init_rrefs)
