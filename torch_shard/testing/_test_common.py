"""A two-layer MLP the sharding-plan tests shard (upstream's test_common.SimpleMegatronLM), on our devices."""

from __future__ import annotations

import torch
import torch.nn as nn

from ..sharded_tensor import ShardedTensor
from . import rank_device


class SimpleMegatronLM(nn.Module):
    """``fc1 -> GELU -> fc2`` with ``linear_size = [[in1, out1], [in2, out2]]``.

    With ``rank`` given, the layers move to that rank's test device (``cuda:<rank>`` with 4 GPUs, the
    CPU otherwise).
    """

    def __init__(self, linear_size, rank=None, dtype=torch.float32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(*linear_size[0], dtype=dtype)
        self.gelu = nn.GELU()
        self.fc2 = nn.Linear(*linear_size[1], dtype=dtype)
        if rank is not None:
            self.fc1.to(rank_device(rank))
            self.fc2.to(rank_device(rank))

    def forward(self, inp):
        return self.fc2(self.gelu(self.fc1(inp)))

    def get_weights(self):
        """(fc1 weight, fc2 weight): the local shard's tensor for a sharded weight."""
        return tuple(
            w.local_tensor() if isinstance(w, ShardedTensor) else w for w in (self.fc1.weight, self.fc2.weight)
        )

    def get_biases(self):
        return (self.fc1.bias, self.fc2.bias)

    def get_weight_grads(self):
        return (self.fc1.weight.grad, self.fc2.weight.grad)

    def get_bias_grads(self):
        return (self.fc1.bias.grad, self.fc2.bias.grad)
