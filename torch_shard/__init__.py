"""torch_shard: sharded tensors for PyTorch with a C++ core."""
import torch  # noqa: F401  (loads libtorch before our extension)

from . import _C  # noqa: F401  (registers torch.ops.torch_shard.*)
