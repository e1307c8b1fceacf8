"""The package's shape (issue 33): no import circle, and the classes pickles name where they were.

The import graph is read from the source (every ``import`` / ``from ... import`` of a torch_shard
module, at module level, inside functions or under ``TYPE_CHECKING``: all of them tie modules
together for a reader), so a circle fails here before it is felt as an import-order bug. The
extension modules (``_C``, ``_testing_C``) are not Python files and are left out.
"""

import ast
import os
import pickle
from pathlib import Path

import torch_shard

PACKAGE = Path(torch_shard.__file__).parent


def _modules() -> dict[str, Path]:
    # os.walk follows links: the out-of-tree builds (scripts/build_out_of_tree.sh) make the package
    # from symbolic links to the source tree's subpackages, which Path.rglob does not enter.
    out = {}
    for folder, _, files in os.walk(PACKAGE, followlinks=True):
        for file in files:
            if not file.endswith(".py"):
                continue
            path = Path(folder, file)
            parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The torch_shard modules ``name`` imports (a ``from pkg import sub`` names ``pkg.sub``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [[alias.name] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # Each imported name that is a module is the target; otherwise the module it comes from.
            candidates = [[f"{base}.{alias.name}", base] for alias in node.names]
        else:
            continue
        for options in candidates:
            for target in options:
                if target.rpartition(".")[2] in ("_C", "_testing_C"):
                    break
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target:
                    if target != name:
                        found.add(target)
                    break
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_the_package_has_no_import_circle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert "torch_shard.sharded_tensor.api" in graph["torch_shard.sharded_tensor"]  # the reader reads
    circles = _circles(graph)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_metadata_classes_pickle_under_upstreams_module_names():
    # They live in leaf modules below the specs and the ShardedTensor, but pickles (old ones too) name
    # the modules users import them from.
    from torch_shard.sharded_tensor.metadata import MEM_FORMAT_ENCODING, ShardedTensorMetadata, TensorProperties
    from torch_shard.sharded_tensor.utils import _parse_and_validate_remote_device, _PlacementResolver  # noqa: F401

    for cls in (MEM_FORMAT_ENCODING, ShardedTensorMetadata, TensorProperties):
        assert cls.__module__ == "torch_shard.sharded_tensor.metadata", cls
    data = pickle.dumps(ShardedTensorMetadata(tensor_properties=TensorProperties(requires_grad=True)))
    assert b"torch_shard.sharded_tensor.metadata" in data and b"_tensor_metadata" not in data
    assert pickle.loads(data).tensor_properties.requires_grad
