"""What torch_shard's upstream-shaped API is built on; none of it mirrors ``torch.distributed._shard``.

The package's top level keeps upstream's layout (``api``, ``metadata``, ``sharded_tensor``, ...) and
torch_shard's own public modules (``compat``, ``interop``, ``testing``); the private modules they use
live here, one concept each:

* ``_build_info``: which torch the C++ library was built for, and whether the running one can run it;
* ``_cxx_runtime``: the library links the process's one shared C++ runtime (NOTE [ One C++ runtime ]);
* ``_torch_private``: every private torch name torch_shard uses;
* ``_op_registrations``: the Python half of the C++ ops' registrations (fake kernels, autograd);
* ``_native``: typed wrappers over the C++ layout ops;
* ``_agreement``: the error codes the ranks agree on, read from the C++ table;
* ``_placement``: placements to ranks and devices (re-exported by ``sharded_tensor.utils``);
* ``_tensor_metadata``: a ShardedTensor's global metadata (re-exported by ``sharded_tensor.metadata``);
* ``_compile``: torch.compile's graph breaks at ShardedTensor and ``interop.redistribute``;
* ``_exit``: the collection at interpreter exit (NOTE [ Exit after gloo ]);
* ``_visualize``: ``torch_shard.visualize_sharding``, the one module here above the ShardedTensor.

This file imports nothing: ``torch_shard/__init__.py`` imports ``_build_info`` and ``_cxx_runtime`` from
here to check the C++ library before it loads it. setup.py and the build backend load those two by path
(they use the standard library only), before torch_shard (or torch) is importable.
"""
