"""ChunkShardingSpec implementations of torch.nn.functional.embedding and embedding_bag.

Importing this package registers them in the ChunkShardingSpec op table (torch_shard.sharded_tensor
imports it).
"""

from . import embedding, embedding_bag  # noqa: F401
