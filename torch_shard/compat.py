"""Run code written for ``torch.distributed._shard`` on torch_shard without editing its imports.

``import torch_shard.compat`` (or :func:`install`) makes the upstream module names resolve to
torch_shard's modules for the rest of the process::

    import torch_shard.compat  # first, before anything imports torch.distributed._shard
    from torch.distributed._shard import sharded_tensor           # torch_shard.sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    assert sharded_tensor.ShardedTensor is torch_shard.sharded_tensor.ShardedTensor

Names that resolve:

* ``torch.distributed._shard`` and every submodule torch_shard has under the same relative path
  (``api``, ``metadata``, ``sharder``, ``sharded_tensor`` with ``api`` / ``metadata`` / ``shard`` /
  ``utils`` / ``logger``, ``sharding_spec`` with ``api`` / ``_internals`` / ``chunk_sharding_spec``,
  ``sharding_plan``, ``sharded_optim``, ``common_op_utils``, ``op_registry_utils``, ...) ->
  ``torch_shard.<same path>``.
* ``torch.distributed._shard._utils`` and ``torch.distributed._shard.checkpoint``: torch_shard has no
  counterpart for these (a ``torch_shard`` module of the same name, if any, means something else),
  and torch's own code needs them (``torch.distributed.checkpoint``
  imports ``narrow_tensor_by_index`` from ``_utils``; ``checkpoint`` is a deprecation alias of
  ``torch.distributed.checkpoint``). They are loaded from torch's installed files, with their imports
  resolving through the alias (so ``_utils`` sees torch_shard's ``ShardMetadata``).
  Submodules of ``checkpoint`` (``checkpoint.metadata``, ``checkpoint.planner``, ...) load from
  ``torch.distributed.checkpoint``'s files, as they do without the alias.
* Any other ``torch.distributed._shard.*`` name (e.g. ``sharded_tensor.reshard``,
  ``sharded_tensor._ops.misc_ops``, upstream implementation modules with no torch_shard counterpart)
  raises ``ModuleNotFoundError`` saying so, instead of silently loading upstream's implementation
  next to torch_shard's.
* ``torch.testing._internal.distributed._shard.sharded_tensor`` (``ShardedTensorTestBase``,
  ``with_comms``, ``TEST_GPU_NUM``) and its ``_test_st_common`` / ``_test_ops_common`` ->
  :mod:`torch_shard.testing` and its modules of the same names, and
  ``torch.testing._internal.distributed._shard.test_common`` -> ``torch_shard.testing._test_common``.
  The test base runs 4 ranks with gloo and ``rank:r/cpu`` placements unless 4 GPUs and NCCL exist.

The alias must come first. When upstream's own ``torch.distributed._shard`` is already imported,
modules that imported it hold upstream's ``ShardedTensor`` / ``ShardMetadata`` classes, and aliasing
then would put two ShardedTensor classes in play (``isinstance`` checks in those modules would reject
torch_shard's tensors and vice versa). :func:`install` refuses that with a RuntimeError naming the
modules that hold upstream's classes. Upstream's package is imported by ``torch.distributed.checkpoint``,
``torch.distributed.fsdp`` and ``torch._dynamo`` (through FSDP) at import time, so import
``torch_shard.compat`` before those (e.g. at the top of the entry script, or in a ``conftest.py``).

What the alias means for ``torch.distributed.checkpoint`` (DCP): DCP imports ``ShardedTensor``,
``ShardMetadata``, ``ChunkShardingSpec`` and ``Shard`` from ``torch.distributed._shard`` itself. With
the alias installed first, those names are torch_shard's classes, so DCP's own ShardedTensor paths
(state-dict flattening, planners, ``_sharded_tensor_utils``) and the checkpointable protocol that
torch_shard's ShardedTensor implements both handle torch_shard's tensors; ``save`` / ``load`` work as
without the alias. Without the alias DCP keeps upstream's classes and still saves and loads
torch_shard's tensors through the checkpointable protocol.

Interop with upstream's own classes (converting an upstream ShardedTensor to torch_shard's and back)
needs both classes, so it applies only in processes without the alias: once the alias is installed,
upstream's ``ShardedTensor`` IS torch_shard's, there is nothing to convert, and no upstream
ShardedTensor can be created in the process.

Pickles: class references such as ``torch.distributed._shard.sharded_tensor.api.ShardedTensor`` or
``torch.distributed._shard.metadata.ShardMetadata`` resolve to torch_shard's classes (pickle imports
the module name, which the alias answers).

On CPU-only machines ``cuda:N`` placements stay CUDA placements: a placement is an explicit request,
and mapping it to the CPU would hide real mistakes. Upstream test files written for 4 GPUs are run
through ``tests/upstream/run_upstream.py``, which rewrites their CUDA placements and ``.cuda()``
calls to the CPU as documented edits.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
import types

import torch

__all__ = ["install", "installed", "UPSTREAM_PACKAGE", "UPSTREAM_TESTING_PACKAGE"]

UPSTREAM_PACKAGE = "torch.distributed._shard"
UPSTREAM_TESTING_PACKAGE = "torch.testing._internal.distributed._shard"
_TARGET_PACKAGE = "torch_shard"

# Upstream testing names -> torch_shard modules.
_TESTING_ALIASES = {
    f"{UPSTREAM_TESTING_PACKAGE}.sharded_tensor": "torch_shard.testing",
    f"{UPSTREAM_TESTING_PACKAGE}.sharded_tensor._test_st_common": "torch_shard.testing._test_st_common",
    f"{UPSTREAM_TESTING_PACKAGE}.sharded_tensor._test_ops_common": "torch_shard.testing._test_ops_common",
    f"{UPSTREAM_TESTING_PACKAGE}.test_common": "torch_shard.testing._test_common",
}

# Upstream modules torch_shard has no counterpart for, which torch's own code imports. They hold no
# ShardedTensor machinery (a tensor-narrowing helper; a deprecation alias of torch.distributed.checkpoint)
# and are loaded from torch's installed files with their imports resolving through the alias, even
# where torch_shard has a module of the same name with another meaning.
_FROM_TORCH = ("_utils", "checkpoint")

# Modules registered in sys.modules by install() itself (the finder answers the rest on import).
# Registering them directly, instead of through the finder, keeps them resolving even when another
# import hook sits before ours on sys.meta_path (pytest's assertion rewriter claims every file named
# test_*.py, upstream's test_common.py included).
_EAGER = (
    "",
    ".api",
    ".metadata",
    ".sharder",
    ".sharded_tensor",
    ".sharded_tensor.api",
    ".sharded_tensor.metadata",
    ".sharded_tensor.shard",
    ".sharded_tensor.utils",
    ".sharding_spec",
    ".sharding_spec.api",
    ".sharding_spec._internals",
    ".sharding_spec.chunk_sharding_spec",
    ".sharding_plan",
    ".sharded_optim",
)

_lock = threading.Lock()
_finder: _AliasFinder | None = None


def _target_for(fullname: str) -> str | None:
    """The torch_shard module ``fullname`` aliases, ``None`` when it is not an aliased name."""
    if fullname in _TESTING_ALIASES:
        return _TESTING_ALIASES[fullname]
    if fullname.startswith(f"{UPSTREAM_TESTING_PACKAGE}.sharded_tensor."):
        rest = fullname[len(f"{UPSTREAM_TESTING_PACKAGE}.sharded_tensor.") :]
        return f"torch_shard.testing.{rest}"
    if fullname == UPSTREAM_PACKAGE:
        return _TARGET_PACKAGE
    if fullname.startswith(f"{UPSTREAM_PACKAGE}.checkpoint."):
        # Upstream's `checkpoint` module replaces itself with torch.distributed.checkpoint; its
        # submodules load from that package's files, exactly as without the alias.
        return None
    if fullname.startswith(UPSTREAM_PACKAGE + "."):
        return _TARGET_PACKAGE + fullname[len(UPSTREAM_PACKAGE) :]
    return None


def _upstream_file(fullname: str) -> str | None:
    """Path of torch's installed source for an upstream ``_shard`` module in ``_FROM_TORCH``."""
    rest = fullname[len(UPSTREAM_PACKAGE) + 1 :]
    if rest not in _FROM_TORCH:
        return None
    base = os.path.join(os.path.dirname(torch.distributed.__file__), "_shard", *rest.split("."))
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


class _AliasLoader(importlib.abc.Loader):
    """Answers an upstream name with the already-imported torch_shard module."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module) -> None:
        # The torch_shard module is fully initialised by its own import.
        return None


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder for ``torch.distributed._shard.*`` and the upstream test-base names."""

    def find_spec(self, fullname, path, target=None):
        alias_of = _target_for(fullname)
        if alias_of is None:
            return None
        # Upstream's own files first for the names listed in _FROM_TORCH: `checkpoint` means
        # torch.distributed.checkpoint there, whatever torch_shard keeps under that name.
        source = _upstream_file(fullname) if fullname.startswith(UPSTREAM_PACKAGE + ".") else None
        if source is not None:
            is_pkg = os.path.basename(source) == "__init__.py"
            return importlib.util.spec_from_file_location(
                fullname,
                source,
                submodule_search_locations=[os.path.dirname(source)] if is_pkg else None,
            )
        target_spec = importlib.util.find_spec(alias_of)
        if target_spec is not None:
            is_pkg = target_spec.submodule_search_locations is not None
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(alias_of), is_package=is_pkg)
        raise ModuleNotFoundError(
            f"No module named '{fullname}': torch_shard.compat maps torch.distributed._shard to "
            f"torch_shard, which has no module '{alias_of}' (upstream's implementation module is not "
            f"loaded next to torch_shard's)",
            name=fullname,
        )


def _upstream_modules_loaded() -> list[str]:
    """Names of upstream ``torch.distributed._shard`` modules imported before the alias."""
    loaded = []
    for name, module in list(sys.modules.items()):
        if module is None:
            continue
        if name == UPSTREAM_PACKAGE or name.startswith(UPSTREAM_PACKAGE + "."):
            module_name = getattr(module, "__name__", "")
            if not (module_name == _TARGET_PACKAGE or module_name.startswith(_TARGET_PACKAGE + ".")):
                loaded.append(name)
    return sorted(loaded)


def _holders_of_upstream_classes(upstream: list[str]) -> list[str]:
    """Modules outside upstream's package whose globals hold a class defined in it."""
    classes = set()
    for name in upstream:
        module = sys.modules.get(name)
        for value in vars(module).values() if module is not None else ():
            if isinstance(value, type) and getattr(value, "__module__", "").startswith(UPSTREAM_PACKAGE):
                classes.add(id(value))
    holders = []
    for name, module in list(sys.modules.items()):
        if module is None or name == UPSTREAM_PACKAGE or name.startswith(UPSTREAM_PACKAGE + "."):
            continue
        try:
            values = list(vars(module).values())
        except TypeError:
            continue
        if any(id(value) in classes for value in values if isinstance(value, type)):
            holders.append(name)
    return sorted(holders)


def _register(name: str, module: types.ModuleType) -> None:
    """Make ``name`` (and the attribute on its parent package) refer to ``module``."""
    sys.modules[name] = module
    parent_name, _, child = name.rpartition(".")
    parent = sys.modules.get(parent_name) or importlib.import_module(parent_name)
    setattr(parent, child, module)


def installed() -> bool:
    """Whether the alias is in effect in this process."""
    return _finder is not None


def install() -> None:
    """Make ``torch.distributed._shard`` (and the upstream test-base names) resolve to torch_shard.

    Idempotent: later calls do nothing.

    Raises:
        RuntimeError: upstream's ``torch.distributed._shard`` was imported before the alias, so its
            classes are already in use (two ShardedTensor classes would be in play). The message names
            the imported upstream modules and the modules holding upstream's classes.
    """
    global _finder
    with _lock:
        if _finder is not None:
            return
        upstream = _upstream_modules_loaded()
        if upstream:
            holders = _holders_of_upstream_classes(upstream)
            held_by = f"; upstream's classes are held by: {', '.join(holders)}" if holders else ""
            raise RuntimeError(
                "torch_shard.compat: torch.distributed._shard was imported before the alias was "
                f"installed ({len(upstream)} upstream modules loaded, e.g. {upstream[0]}){held_by}. "
                "Aliasing now would put two ShardedTensor classes in play. Import torch_shard.compat "
                "before anything that imports torch.distributed._shard (torch.distributed.checkpoint, "
                "torch.distributed.fsdp, torch._dynamo, torch.testing._internal.common_distributed)."
            )
        finder = _AliasFinder()
        sys.meta_path.insert(0, finder)
        try:
            names = [UPSTREAM_PACKAGE + suffix for suffix in _EAGER] + list(_TESTING_ALIASES)
            for name in names:
                _register(name, importlib.import_module(_target_for(name)))
        except BaseException:
            sys.meta_path.remove(finder)
            for name in [n for n in sys.modules if n == UPSTREAM_PACKAGE or n.startswith(UPSTREAM_PACKAGE + ".")]:
                del sys.modules[name]
            for name in _TESTING_ALIASES:
                sys.modules.pop(name, None)
            if isinstance(getattr(torch.distributed, "_shard", None), types.ModuleType):
                delattr(torch.distributed, "_shard")
            raise
        _finder = finder


install()
