"""How a build finds its torch, without building: the in-tree build backend (build_backend/) under pip's
build isolation, and setup.py's refusals before it compiles anything. Run in a source checkout only
(the wheel's test runs copies of tests/ beside no setup.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not (ROOT / "setup.py").exists(), reason="needs the source checkout's setup.py")


def run(script: str, *, env: dict[str, str] | None = None, args=()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


# pip's build isolation, as pip (23 to 26) sets it up: the interpreter is the target environment's, its
# site-packages are taken off sys.path (site.getsitepackages() still names them), and the build tools
# come from a folder of their own. Here that folder holds links to this environment's setuptools.
ISOLATED = """
import importlib.util, os, site, sys, tempfile
tools = tempfile.mkdtemp()
for name in ("setuptools", "_distutils_hack", "pkg_resources"):
    spec = importlib.util.find_spec(name)
    if spec is not None:
        os.symlink(os.path.dirname(spec.origin), os.path.join(tools, name))
targets = {os.path.normcase(p) for p in site.getsitepackages()}
sys.path = [p for p in sys.path if os.path.normcase(p) not in targets] + [tools]
assert importlib.util.find_spec("torch") is None, "torch is still visible"
sys.path.insert(0, "build_backend")
"""


def test_isolated_build_uses_the_target_environments_torch():
    result = run(
        ISOLATED
        + """
import json, torch_shard_backend as backend
requires = backend.get_requires_for_build_wheel()
import torch
print(json.dumps({"requires": requires, "torch": torch.__version__, "file": torch.__file__}))
"""
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["torch"] == torch.__version__ and found["file"] == torch.__file__
    assert not any(r.startswith("torch") for r in found["requires"]), found["requires"]


def test_isolated_build_without_any_torch_asks_for_one():
    result = run(
        ISOLATED
        + """
site.getsitepackages = lambda: []   # a target environment with no torch
site.getusersitepackages = lambda: "/nonexistent"
import torch_shard_backend as backend
print(backend.get_requires_for_build_wheel())
"""
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "['torch>=2.11,<2.16']"
    assert "no torch in the environment being installed into" in result.stderr


def fake_torch(tmp_path: Path, version: str | None) -> dict[str, str]:
    """A `torch` package that shadows the real one: ``version``, or one whose import fails (None)."""
    package = tmp_path / "torch"
    (package / "utils").mkdir(parents=True)
    if version is None:
        (package / "__init__.py").write_text("raise ImportError('libtorch_cpu.so: cannot open shared object file')\n")
    else:
        (package / "__init__.py").write_text(
            f"__version__ = {version!r}\n"
            "class version:\n    git_version = ''\n    cuda = None\n    hip = None\n"
            "class _C:\n    _GLIBCXX_USE_CXX11_ABI = True\n"
        )
    (package / "utils" / "__init__.py").write_text("")
    (package / "utils" / "cpp_extension.py").write_text(
        "raise AssertionError('setup.py went on to build')\n" if version is None else "BuildExtension = CppExtension = None\n"
    )
    return {"PYTHONPATH": str(tmp_path)}


def _setup_version(tmp_path, version):
    """``setup.py --version`` run where ``import torch`` finds the fake torch ``version`` (None: a torch
    that cannot be imported)."""
    return subprocess.run(
        [sys.executable, "setup.py", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, **fake_torch(tmp_path, version)},
    )


@pytest.mark.parametrize("version", ["2.10.0", "2.16.0"])
def test_setup_refuses_an_unsupported_torch_before_compiling(tmp_path, version):
    result = _setup_version(tmp_path, version)
    assert result.returncode != 0
    assert f"torch_shard supports torch >=2.11,<2.16 (its C++ follows torch's C++ API release by release), and this environment has torch {version}" in result.stderr
    assert "pip install 'torch>=2.11,<2.16'" in result.stderr


def test_setup_without_torch_says_to_install_it_first(tmp_path):
    result = _setup_version(tmp_path, None)
    assert result.returncode != 0
    assert "importing torch failed (libtorch_cpu.so: cannot open shared object file)" in result.stderr
    assert "Install torch first" in result.stderr


def test_setup_version_and_requirement_follow_the_installed_torch():
    result = subprocess.run(
        [sys.executable, "setup.py", "--version"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    major, minor = torch.__version__.split(".")[:2]
    assert result.stdout.strip().splitlines()[-1].startswith(f"0.1.0+pt{major}{minor}")
