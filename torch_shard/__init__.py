"""torch_shard: sharded tensors for PyTorch with a C++ core.

A drop-in for ``torch.distributed._shard``: the module tree and names are the same, so code changes
only its imports (``torch.distributed._shard.X`` -> ``torch_shard.X``). The C++ ops are available as
``torch.ops.torch_shard.*`` once this package is imported.
"""

import torch  # noqa: F401  (loads libtorch before the extension)

from ._support import _build_info, _cxx_runtime

# Before the library loads: ImportError, naming both torches and the fix, if it was built for a torch
# whose C++ ABI differs from the running one's (another minor release, another C++11 ABI flag), or
# with a private copy of the C++ runtime (NOTE [ One C++ runtime ]).
_library = _build_info.library_path()
_build_record = _build_info.check(_library)
_cxx_runtime.check(_library)

from . import _C  # noqa: E402,F401  (registers torch.ops.torch_shard.*)
from ._support import (  # noqa: E402
    _exit,  # noqa: F401  (collects cycles holding destroyed groups at exit: NOTE [ Exit after gloo ])
    _op_registrations,  # noqa: F401  (their fake kernels and autograd)
)

# isort: split
# The API, on top of the library and its Python half.
from . import sharded_tensor, sharding_spec  # noqa: E402
from ._support._visualize import visualize_sharding  # noqa: E402
from .api import _shard_tensor, load_with_process_group, shard_module, shard_parameter  # noqa: E402
from .metadata import ShardMetadata  # noqa: E402

# The op implementations register themselves into the op tables on import: the built-in ones for every
# ShardedTensor, and ChunkShardingSpec's embedding / embedding_bag into that spec's table. They sit
# above the ShardedTensor and the specs, so they are imported here, once both exist.
from .sharded_tensor import _ops  # noqa: E402,F401
from .sharding_spec import chunk_sharding_spec_ops  # noqa: E402,F401

# The version pip records: 0.1.0 and the torch the library was built for (0.1.0+pt213cpu).
__version__ = _build_info.version(_build_record)

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
