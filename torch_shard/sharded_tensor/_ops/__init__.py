"""Built-in ShardedTensor op implementations; importing this package registers them."""

# ChunkShardingSpec's embedding / embedding_bag register into that spec's op table.
from ...sharding_spec import chunk_sharding_spec_ops  # noqa: F401
from . import _common, binary_cmp, init, tensor_ops  # noqa: F401
