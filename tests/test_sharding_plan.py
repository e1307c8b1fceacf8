"""Port of upstream PyTorch test/distributed/_shard/sharding_plan/test_sharding_plan.py.

Same class and method names and every upstream assertion; imports change from
``torch.distributed._shard.X`` to ``torch_shard.X`` and the torch-internal harness is replaced by
``torch_shard.testing``. "rank:N/cuda:N" placements and ``.cuda(rank)`` become ``placement(N)`` and
``.to(rank_device(rank))``; the GPU-count/NCCL decorators are gone. ``generate_chunk_sharding_specs_for_test``
comes from ``torch_shard.testing._test_ops_common``; ``SimpleMegatronLM`` (from upstream's
``_shard/test_common``) is defined here. Assertions added beyond
upstream's are marked "Added".
"""

import torch
import torch.distributed as dist
import torch.nn as nn

from torch_shard import shard_module
from torch_shard.sharded_tensor import ShardedTensor
from torch_shard.sharding_plan import ShardingPlan, ShardingPlanner
from torch_shard.sharding_spec import ChunkShardingSpec
from torch_shard.testing import (
    TEST_WORLD_SIZE,
    ShardedTensorTestBase,
    placement,
    rank_device,
    run_tests,
    with_comms,
)
from torch_shard.testing._test_ops_common import generate_chunk_sharding_specs_for_test

TEST_GPU_NUM = TEST_WORLD_SIZE



# Upstream's _shard/test_common.SimpleMegatronLM; ``rank`` moves the layers to rank_device(rank).
class SimpleMegatronLM(nn.Module):
    def __init__(self, linear_size, rank=None, dtype=torch.float32):
        super().__init__()
        self.fc1 = nn.Linear(*linear_size[0], dtype=dtype)
        self.gelu = nn.GELU()
        self.fc2 = nn.Linear(*linear_size[1], dtype=dtype)
        if rank is not None:
            self.fc1 = self.fc1.to(rank_device(rank))
            self.fc2 = self.fc2.to(rank_device(rank))

    def forward(self, inp):
        return self.fc2(self.gelu(self.fc1(inp)))

    def get_weights(self):
        if isinstance(self.fc1.weight, ShardedTensor):
            weight1 = self.fc1.weight.local_tensor()
        else:
            weight1 = self.fc1.weight

        if isinstance(self.fc2.weight, ShardedTensor):
            weight2 = self.fc2.weight.local_tensor()
        else:
            weight2 = self.fc2.weight

        return (weight1, weight2)

    def get_biases(self):
        return (self.fc1.bias, self.fc2.bias)

    def get_weight_grads(self):
        return (self.fc1.weight.grad, self.fc2.weight.grad)

    def get_bias_grads(self):
        return (self.fc1.bias.grad, self.fc2.bias.grad)


# Example ShardingPlanner that chunks every parameter in the module
# to all available devices defined.
class ChunkAllShardingPlanner(ShardingPlanner):
    dim = 0
    devices = []

    def __init__(self, chunk_dim=0, device_count=0):
        self.dim = chunk_dim
        self.devices = [placement(i) for i in range(device_count)]

    def build_plan(self, module: nn.Module) -> ShardingPlan:
        named_params = module.named_parameters()
        plan = {}
        for name, _ in named_params:
            plan[name] = ChunkShardingSpec(self.dim, placements=self.devices)

        return ShardingPlan(plan=plan)


class TestShardingPlan(ShardedTensorTestBase):
    @with_comms(init_rpc=False)
    def test_sharding_plan_errors(self):
        rowwise_sharding_spec = generate_chunk_sharding_specs_for_test(1)[0]
        sharding_plan_wrong_plan = ShardingPlan(
            plan={
                "fc1.weight": torch.randn(3, 4),
            },
            output_plan={"": rowwise_sharding_spec},
        )

        megatron_lm = SimpleMegatronLM([[17, 12], [12, 29]]).to(rank_device(self.rank))

        with self.assertRaisesRegex(
            TypeError, "Only `ShardingSpec` and `Sharder` are supported to shard"
        ):
            # shard the module with the provided sharding plan
            shard_module(megatron_lm, sharding_plan_wrong_plan)

        sharding_plan_wrong_output_plan = ShardingPlan(
            plan={
                "fc1.weight": rowwise_sharding_spec,
            },
            output_plan={"": torch.randn(3, 4)},
        )

        with self.assertRaisesRegex(
            TypeError, "Only `ShardingSpec` is supported as output_plan"
        ):
            # shard the module with the provided sharding plan
            shard_module(megatron_lm, sharding_plan_wrong_output_plan)

        sharding_plan_wrong_module_path = ShardingPlan(
            plan={
                "fc3.weight": rowwise_sharding_spec,
            },
        )
        with self.assertRaisesRegex(AttributeError, "has no attribute"):
            # shard the module with the provided sharding plan
            shard_module(megatron_lm, sharding_plan_wrong_module_path)

        sharding_plan_wrong_param_path = ShardingPlan(
            plan={
                "fc1.biass": rowwise_sharding_spec,
            },
        )
        with self.assertRaisesRegex(AttributeError, "has no attribute"):
            # shard the module with the provided sharding plan
            shard_module(megatron_lm, sharding_plan_wrong_param_path)

    @with_comms(init_rpc=False)
    def test_custom_sharding_planner(self):
        megatron_lm = SimpleMegatronLM([[17, 12], [12, 29]], rank=self.rank).to(
            rank_device(self.rank)
        )
        planner = ChunkAllShardingPlanner(device_count=TEST_GPU_NUM)
        sharding_plan = planner.build_plan(megatron_lm)

        shard_module(megatron_lm, sharding_plan)

        # check to make sure the module already been sharded
        self.assertTrue(isinstance(megatron_lm.fc1.weight, ShardedTensor))
        self.assertTrue(isinstance(megatron_lm.fc2.weight, ShardedTensor))
        self.assertTrue(isinstance(megatron_lm.fc1.bias, ShardedTensor))
        self.assertTrue(isinstance(megatron_lm.fc2.bias, ShardedTensor))

        # Added: every parameter is chunked on dim 0 over the 4 ranks (biases are 1-D).
        self.assertEqual(megatron_lm.fc1.weight.size(), (12, 17))
        self.assertEqual(megatron_lm.fc1.bias.size(), (12,))
        self.assertEqual(megatron_lm.fc2.weight.size(), (29, 12))
        self.assertEqual(megatron_lm.fc2.bias.size(), (29,))
        self.assertEqual(megatron_lm.fc1.weight.local_tensor().size(), (3, 17))
        self.assertEqual(megatron_lm.fc1.bias.local_tensor().size(), (3,))
        # 29 rows: split 8 -> 8, 8, 8, 5
        self.assertEqual(megatron_lm.fc2.weight.local_tensor().size(), (8 if self.rank < 3 else 5, 12))
        self.assertEqual(megatron_lm.fc2.bias.local_tensor().size(), (8 if self.rank < 3 else 5,))

    @with_comms(init_rpc=False)
    def test_shard_module_sub_process_group(self):
        megatron_lm = SimpleMegatronLM([[17, 12], [12, 29]], rank=self.rank)
        colwise_sharding_spec = ChunkShardingSpec(
            dim=0,
            placements=[
                placement(2),
                placement(3),
            ],
        )
        rowwise_sharding_spec = ChunkShardingSpec(
            dim=1,
            placements=[
                placement(2),
                placement(3),
            ],
        )
        sharding_plan = ShardingPlan(
            plan={
                "fc1.weight": colwise_sharding_spec,
                "fc2.weight": rowwise_sharding_spec,
            }
        )

        pg = dist.new_group([2, 3])

        if self.rank >= 2:
            shard_module(megatron_lm, sharding_plan, process_group=pg)

            # Added: the shards came from group rank 0 (global rank 2) and each of ranks 2, 3 holds
            # its chunk: fc1.weight [12, 17] by rows, fc2.weight [29, 12] by columns.
            self.assertTrue(isinstance(megatron_lm.fc1.weight, ShardedTensor))
            self.assertTrue(isinstance(megatron_lm.fc2.weight, ShardedTensor))
            self.assertEqual(megatron_lm.fc1.weight.local_tensor().size(), (6, 17))
            self.assertEqual(megatron_lm.fc2.weight.local_tensor().size(), (29, 6))


if __name__ == "__main__":
    run_tests()
