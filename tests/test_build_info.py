"""The build record (csrc/build_info.cpp, torch_shard/_support/_build_info.py): the library knows the
torch it was built for, and ``import torch_shard`` refuses a torch whose C++ ABI can differ. Nothing is
built here: the other torches are faked records, in a file or in place of the reader."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_shard
import torch_shard._C
from torch_shard._support import _build_info as bi

RUNNING = bi.torch_facts()
_MAJOR, _MINOR = (int(n) for n in torch.__version__.split(".")[:2])
# A supported minor release that is not the running one (the torch legs run this file on 2.11 and 2.15).
OTHER = f"{_MAJOR}.{_MINOR + 1 if _MINOR < bi.SUPPORTED[1][1] else _MINOR - 1}.0+cpu"


def record(torch_version: str, cuda: str = "", *, headers: str | None = None, **extra) -> dict[str, str]:
    """A record as the build writes it, for a torch that is not installed."""
    return {
        "headers": headers or torch_version.split("+")[0],
        "cxx11_abi": "1",
        "torch": torch_version,
        "git": "0" * 40,
        "cuda": cuda,
        "hip": "",
        "cuda_code": "0",
        **extra,
    }


def facts(torch_version: str, cuda: str = "", **extra) -> dict[str, str]:
    """A running torch's facts, for a torch that is not installed."""
    return {"torch": torch_version, "git": "0" * 40, "cuda": cuda, "hip": "", "cxx11_abi": "1", **extra}


def test_the_built_library_records_the_torch_it_runs_with():
    recorded = bi.read_record(torch_shard._C.__file__)
    assert recorded is not None, "the library carries no build record"
    assert recorded["headers"] == torch.__version__.split("+")[0]  # from torch's headers, at compile time
    assert recorded["torch"] == torch.__version__
    assert recorded["git"] == (torch.version.git_version or "")
    assert recorded["cuda"] == (torch.version.cuda or "")
    assert recorded["cxx11_abi"] == ("1" if torch.compiled_with_cxx11_abi() else "0")
    assert recorded["cuda_code"] == "0"
    assert bi.incompatibility(recorded, RUNNING) is None
    assert torch_shard.__version__ == bi.version(recorded)
    assert torch_shard.__version__.startswith(f"{bi.BASE_VERSION}+pt")


@pytest.mark.parametrize(
    "built, running, reason",
    [
        (record("2.13.0+cpu"), facts("2.13.0+cpu"), None),
        # Patch releases share headers and exported symbols (docs/development.md): both ways.
        (record("2.13.0+cpu"), facts("2.13.1+cpu"), None),
        (record("2.14.1", "13.0"), facts("2.14.0", "13.0"), None),
        # The CPU and CUDA builds of a release share the headers a CppExtension compiles against.
        (record("2.13.0+cpu"), facts("2.13.0+cu130", "13.0"), None),
        (record("2.13.0+cu130", "13.0"), facts("2.13.0+cpu"), None),
        (record("2.13.0+cpu"), facts("2.14.1+cu130", "13.0"), "minor releases"),
        (record("2.15.0"), facts("2.11.0"), "minor releases"),
        (record("2.13.0"), facts("3.13.0"), "minor releases"),
        (record("2.13.0"), facts("2.13.0", cxx11_abi="0"), "_GLIBCXX_USE_CXX11_ABI=1, torch with 0"),
        # Pre-releases and source builds: the exact build only.
        (record("2.14.0a0+git5c48869"), facts("2.14.0a0+git5c48869"), None),
        (record("2.14.0a0+git5c48869"), facts("2.14.0a0+git5c48869", git="1" * 40), "pre-release or source"),
        (record("2.14.0a0+git5c48869"), facts("2.14.0"), "pre-release or source"),
        (record("2.14.0"), facts("2.14.0.dev20260101+cpu"), "pre-release or source"),
        # A library with CUDA code of its own needs the CUDA it was compiled for.
        (record("2.13.0", "13.0", cuda_code="1"), facts("2.13.0", "13.0"), None),
        (record("2.13.0", "13.0", cuda_code="1"), facts("2.13.0", "12.8"), "CUDA code is for cu130, torch is cu128"),
        (None, facts("2.13.0"), "no build record"),
    ],
)
def test_which_differences_refuse(built, running, reason):
    found = bi.incompatibility(built, running)
    if reason is None:
        assert found is None
    else:
        assert found is not None and reason in found


def test_the_headers_version_decides_not_only_what_python_saw():
    # The headers are what the code was compiled from; a record whose headers say 2.12 is a 2.12 build.
    assert "minor releases" in bi.incompatibility(record("2.13.0", headers="2.12.0"), facts("2.13.0"))


@pytest.mark.parametrize(
    "running, version, requirement",
    [
        (facts("2.13.0+cpu"), "0.1.0+pt213cpu", "torch==2.13.*"),
        (facts("2.14.1+cu130", "13.0"), "0.1.0+pt214cu130", "torch==2.14.*"),
        (facts("2.15.0", "13.2"), "0.1.0+pt215cu132", "torch==2.15.*"),
        (facts("2.11.0+rocm6.4", hip="6.4.43482-0f2d60242"), "0.1.0+pt211rocm64", "torch==2.11.*"),
        (facts("2.14.0a0+git5c48869"), "0.1.0+pt214cpu", "torch==2.14.0a0+git5c48869"),
    ],
)
def test_wheel_version_and_requirement(running, version, requirement):
    assert bi.version(running) == version
    assert bi.requirement(running) == requirement


def test_supported_range():
    assert bi.unsupported(facts("2.11.0")) is None and bi.unsupported(facts("2.15.3")) is None
    for outside in ("2.10.0", "2.16.0", "3.0.0"):
        assert bi.SUPPORTED_SPEC in bi.unsupported(facts(outside))


def test_supported_pythons_are_what_pyproject_admits():
    # pyproject.toml's requires-python, setup.py's refusal and make test's legs say the same range.
    assert bi.python_unsupported((3, 10)) is None and bi.python_unsupported((3, 13)) is None
    for outside in ((3, 9), (3, 14), (4, 0)):
        assert "Python 3.10 to 3.13" in bi.python_unsupported(outside)
    (lo_major, lo_minor), (hi_major, hi_minor) = bi.SUPPORTED_PYTHON
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the source tree, also for a wheel
    with open(os.path.join(root, "pyproject.toml")) as f:
        pyproject = f.read()
    assert f'requires-python = ">={lo_major}.{lo_minor},<{hi_major}.{hi_minor + 1}"' in pyproject
    for minor in range(lo_minor, hi_minor + 1):
        assert f'"Programming Language :: Python :: 3.{minor}"' in pyproject
    if not os.path.exists(os.path.join(root, "Makefile")):
        return  # the wheel's test run has the tests and pyproject.toml, not the Makefile's legs
    with open(os.path.join(root, "Makefile")) as f:
        makefile = f.read().splitlines()
    main = [line.split()[-1] for line in makefile if line.startswith("MAIN_PYTHON_VERSION :=")]
    legs = [line for line in makefile if line.startswith("TORCH_LEGS :=")][0]
    tested = set(main) | {leg.split("@")[1] for leg in legs.split()[2:]}
    assert tested == {f"3.{minor}" for minor in range(lo_minor, hi_minor + 1)}, (main, legs)


def fake_library(tmp_path, recorded: dict[str, str] | None):
    """A file laid out as a library is: bytes, then the record's NUL-terminated text, then bytes."""
    path = tmp_path / "_C.fake.so"
    text = b"" if recorded is None else bi.MARKER + "".join(f"{k}={v}\n" for k, v in recorded.items()).encode()
    path.write_bytes(b"\x7fELF" + bytes(5000) + text + b"\0" + bytes(5000))
    return str(path)


def test_check_reads_the_record_from_the_file(tmp_path):
    same = {**record(torch.__version__, torch.version.cuda or ""), "git": RUNNING["git"]}
    assert bi.check(fake_library(tmp_path, same)) == same
    older = record(OTHER)
    with pytest.raises(ImportError) as raised:
        bi.check(fake_library(tmp_path, older))
    message = str(raised.value)
    assert f"built for torch {OTHER} (CPU, C++11 ABI)" in message
    assert f"this Python has torch {bi.describe(RUNNING)}" in message
    assert "minor releases" in message
    assert message.endswith("To fix it, run:\n    " + bi.fix_command(older, RUNNING))
    with pytest.raises(ImportError, match="no build record"):
        bi.check(fake_library(tmp_path, None))


def test_fix_command():
    python = sys.executable
    source = bi._source_tree()
    older = record(OTHER)
    if source is not None:  # a checkout (editable install, build in the tree): rebuild it
        assert bi.fix_command(older, RUNNING) == f"{python} -m pip install -e {source}"
    # A torch the source cannot be built against: back to the torch the library was built for.
    other_minor = OTHER.rsplit(".", 1)[0]
    assert bi.fix_command(older, facts("2.16.0")) == f"{python} -m pip install 'torch=={other_minor}.*'"


def test_import_refuses_before_loading_the_library():
    # In a fresh interpreter, the reader answers the record of a library built for another minor release
    # before torch_shard/__init__.py runs; the import must fail with the message, and the library must
    # not have been loaded.
    script = textwrap.dedent(
        f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("torch_shard._support._build_info", {bi.__file__!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.read_record = lambda path: {record(OTHER)!r}
        sys.modules["torch_shard._support._build_info"] = module
        try:
            import torch_shard
        except ImportError as e:
            assert "torch_shard._C" not in sys.modules, "the library was loaded"
            print(e)
        else:
            raise SystemExit("import torch_shard succeeded")
        """
    )
    package_parent = os.path.dirname(os.path.dirname(torch_shard.__file__))
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=package_parent,
        env={**os.environ, "PYTHONPATH": package_parent},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"built for torch {OTHER}" in result.stdout
    assert f"this Python has torch {torch.__version__}" in result.stdout
    assert "To fix it, run:" in result.stdout


def test_setup_and_the_build_backend_can_load_the_module_without_site_packages():
    # setup.py and build_backend/ load _build_info.py by path before torch_shard (or torch) is
    # importable: at import time it may use the standard library only. -S: no site-packages at all.
    script = (
        "import importlib.util; "
        f"spec = importlib.util.spec_from_file_location('_build_info', {bi.__file__!r}); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        "print(m.requirement({'torch': '2.13.0+cpu'}))"
    )
    result = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "torch==2.13.*"
