"""Built-in ShardedTensor op implementations; importing this package registers them."""

from . import _common, binary_cmp, init, tensor_ops  # noqa: F401
