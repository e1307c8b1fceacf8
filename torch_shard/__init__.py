"""torch_shard: sharded tensors for PyTorch with a C++ core.

A drop-in for ``torch.distributed._shard``: the module tree and names are the same, so code changes
only its imports (``torch.distributed._shard.X`` -> ``torch_shard.X``). The C++ ops are available as
``torch.ops.torch_shard.*`` once this package is imported.
"""

import torch  # noqa: F401  (loads libtorch before the extension)

from . import (
    _C,  # noqa: F401  (registers torch.ops.torch_shard.*)
    _exit,  # noqa: F401  (collects cycles holding destroyed groups at exit: NOTE [ Exit after gloo ])
    _op_registrations,  # noqa: F401  (their fake kernels and autograd)
    sharded_tensor,
    sharding_spec,
)
from ._visualize import visualize_sharding
from .api import _shard_tensor, load_with_process_group, shard_module, shard_parameter
from .metadata import ShardMetadata

# The op implementations register themselves into the op tables on import: the built-in ones for every
# ShardedTensor, and ChunkShardingSpec's embedding / embedding_bag into that spec's table. They sit
# above the ShardedTensor and the specs, so they are imported here, once both exist.
from .sharded_tensor import _ops  # noqa: F401  (isort: keep after the packages it registers into)
from .sharding_spec import chunk_sharding_spec_ops  # noqa: F401

__version__ = "0.1.0"

__all__ = [
    "ShardMetadata",
    "_shard_tensor",
    "load_with_process_group",
    "shard_module",
    "shard_parameter",
    "sharded_tensor",
    "sharding_spec",
    "visualize_sharding",
]
