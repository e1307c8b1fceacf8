"""Port of upstream PyTorch test/distributed/_shard/sharded_tensor/ops/test_init.py.

Same conventions as tests/test_sharded_tensor.py: imports change from ``torch.distributed._shard.X`` to
``torch_shard.X``, the harness is ``torch_shard.testing``, "rank:N/cuda:N" placements and
``cuda:{rank}`` devices become ``placement(N)`` / ``rank_device(N)``, and the GPU-count/NCCL decorators
are gone, so the bodies run with NCCL/CUDA on a 4-GPU machine and with gloo/CPU elsewhere. Nothing is
CUDA-only here.
"""

import torch

from torch_shard import sharded_tensor
from torch_shard.sharding_spec import ChunkShardingSpec
from torch_shard.testing import (
    ShardedTensorTestBase,
    placement,
    rank_device,
    run_tests,
    with_comms,
)


class TestShardedTensorNNInit(ShardedTensorTestBase):
    """Testing torch.nn.init functions for ShardedTensor"""

    @with_comms
    def test_init_sharded_tensor_with_uniform(self):
        """Test torch.nn.init.uniform_(ShardedTensor, a, b)"""

        spec = ChunkShardingSpec(
            dim=0,
            placements=[
                placement(0),
                placement(1),
                placement(2),
                placement(3),
            ],
        )
        h, w = 8, 2
        expected_h = 2  # noqa: F841  (upstream)
        expected_device = torch.device(rank_device(self.rank))  # noqa: F841  (upstream)
        a, b = 10, 20

        seed = 1234
        dtype = torch.double

        st = sharded_tensor.empty(spec, h, w, dtype=dtype)
        self.assertEqual(1, len(st.local_shards()))

        # Clone local tensor to ensure torch.nn.init starts from the same input
        local_tensor_clone = torch.clone(st.local_shards()[0].tensor)
        torch.manual_seed(seed)
        torch.nn.init.uniform_(st, a=a, b=b)

        torch.manual_seed(seed)
        torch.nn.init.uniform_(local_tensor_clone, a=a, b=b)
        self.assertEqual(local_tensor_clone, st.local_shards()[0].tensor)

    @with_comms
    def test_init_sharded_tensor_with_normal(self):
        """Test torch.nn.init.normal_(ShardedTensor, mean, std)"""

        spec = ChunkShardingSpec(
            dim=0,
            placements=[
                placement(0),
                placement(1),
                placement(2),
                placement(3),
            ],
        )
        h, w = 8, 2
        expected_h = 2  # noqa: F841  (upstream)
        expected_device = torch.device(rank_device(self.rank))  # noqa: F841  (upstream)
        mean, std = 10, 5

        seed = 1234
        dtype = torch.double

        st = sharded_tensor.empty(spec, h, w, dtype=dtype)
        self.assertEqual(1, len(st.local_shards()))

        # Clone local tensor to ensure torch.nn.init starts from the same input
        local_tensor_clone = torch.clone(st.local_shards()[0].tensor)
        torch.manual_seed(seed)
        torch.nn.init.normal_(st, mean=mean, std=std)

        torch.manual_seed(seed)
        torch.nn.init.normal_(local_tensor_clone, mean=mean, std=std)
        self.assertEqual(local_tensor_clone, st.local_shards()[0].tensor)

    @with_comms
    def test_init_sharded_tensor_with_kaiming_uniform(self):
        """Test torch.nn.init.kaiming_uniform_(ShardedTensor, a, mode, nonlinearit)"""

        spec = ChunkShardingSpec(
            dim=0,
            placements=[
                placement(0),
                placement(1),
                placement(2),
                placement(3),
            ],
        )
        h, w = 8, 2
        expected_h = 2  # noqa: F841  (upstream)
        expected_device = torch.device(rank_device(self.rank))  # noqa: F841  (upstream)
        a, mode, nonlinearity = 0, "fan_in", "leaky_relu"

        seed = 1234
        dtype = torch.double

        st = sharded_tensor.empty(spec, h, w, dtype=dtype)
        self.assertEqual(1, len(st.local_shards()))

        # Clone local tensor to ensure torch.nn.init starts from the same input
        local_tensor_clone = torch.clone(st.local_shards()[0].tensor)
        torch.manual_seed(seed)
        torch.nn.init.kaiming_uniform_(st, a=a, mode=mode, nonlinearity=nonlinearity)

        torch.manual_seed(seed)
        # fan_in is w = 2 for the global 8x2 tensor and for each 2x2 row shard alike, so torch_shard's
        # global-fan bound (see docs/reference/differences.md) and upstream's local-fan bound agree here.
        torch.nn.init.kaiming_uniform_(
            local_tensor_clone, a=a, mode=mode, nonlinearity=nonlinearity
        )
        self.assertEqual(local_tensor_clone, st.local_shards()[0].tensor)


if __name__ == "__main__":
    run_tests()
