"""Built-in ShardedTensor op implementations; importing this package registers them (torch_shard's
``__init__`` does, after the ShardedTensor and the specs exist)."""

from . import _common, binary_cmp, init, tensor_ops  # noqa: F401
