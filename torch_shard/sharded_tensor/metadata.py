"""Global metadata of a ShardedTensor, under upstream's module name
(``torch.distributed._shard.sharded_tensor.metadata``).

The classes live in ``torch_shard/_support/_tensor_metadata.py``, below the specs and the ShardedTensor
that both use them; their ``__module__`` is this module's, so pickles name it.
"""

from .._support._tensor_metadata import MEM_FORMAT_ENCODING, ShardedTensorMetadata, TensorProperties

__all__ = ["MEM_FORMAT_ENCODING", "ShardedTensorMetadata", "TensorProperties"]
