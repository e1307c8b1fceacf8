"""Which torch torch_shard's C++ library was built for, and whether the running torch can run it.

torch_shard's library is C++ against torch's own C++ API (a ``TensorImpl`` subclass, c10d calls), so
it runs only with a torch whose C++ ABI is the one it was compiled against. The build stores a record
of that torch inside the library (``csrc/build_info.cpp``: the version from torch's headers, the
``_GLIBCXX_USE_CXX11_ABI`` it was compiled with, and what setup.py read from Python: ``torch.__version__``,
its git commit, its CUDA or ROCm version). ``import torch_shard`` reads the record from the file,
without loading the library, and raises ImportError naming both torches and the command that fixes it
when they differ in a way that can break the ABI (:func:`incompatibility`):

- another major or minor release (torch changes its C++ ABI between minor releases);
- a pre-release or source build of torch (``2.14.0a0+git...``, ``.dev`` nightlies) that is not the
  exact build (version and commit) the library was compiled against;
- another ``_GLIBCXX_USE_CXX11_ABI``;
- for a library with CUDA code of its own (none yet: the build is a ``CppExtension``), another CUDA
  major.minor.

Patch releases of the same minor run a build (2.13.0 -> 2.13.1 and back), and so does the CPU build
of a release run a library built against its CUDA build or the other way round: their headers and
exported symbols were compared (docs/development.md, "Which torch a build runs with").

This module imports nothing from torch_shard and nothing but the standard library at import time:
setup.py and the build backend load it by path, before any torch_shard (or torch) is importable.
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import os
import re
import shlex
import sys

BASE_VERSION = "0.1.0"
# The oldest and newest torch minor releases the C++ is written and tested for (the static_assert in
# csrc/sharded_tensor_impl.cpp says the same); the build refuses others before compiling.
SUPPORTED = ((2, 11), (2, 15))
SUPPORTED_SPEC = f">={SUPPORTED[0][0]}.{SUPPORTED[0][1]},<{SUPPORTED[1][0]}.{SUPPORTED[1][1] + 1}"
# The oldest and newest Python the extension is built and tested with (make test's legs); pyproject.toml's
# requires-python says the same, and setup.py refuses others.
SUPPORTED_PYTHON = ((3, 10), (3, 13))

# The record's first line, as csrc/build_info.cpp writes it; the record ends at the first NUL.
MARKER = b"torch_shard build record v1\n"
# Keys of the record that setup.py writes (csrc/build_info.cpp adds `headers` and `cxx11_abi`).
PYTHON_KEYS = ("torch", "git", "cuda", "hip", "cuda_code")
_SAFE = re.compile(r"[A-Za-z0-9.+_-]*")


def torch_facts(torch=None) -> dict[str, str]:
    """The running torch, in the record's keys: version, git commit, CUDA / ROCm version, C++11 ABI."""
    if torch is None:
        import torch
    return {
        "torch": torch.__version__,
        "git": torch.version.git_version or "",
        "cuda": torch.version.cuda or "",
        "hip": torch.version.hip or "",
        "cxx11_abi": "1" if torch._C._GLIBCXX_USE_CXX11_ABI else "0",
    }


def _numbers(version: str) -> tuple[int, int, int] | None:
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def is_release(version: str) -> bool:
    """Whether ``version`` is a torch release (``2.13.0``, ``2.13.0+cpu``), not a pre-release, nightly or
    source build (``2.14.0a0+git5c48869``, ``2.15.0.dev20260101+cpu``)."""
    public, _, local = version.partition("+")
    return re.fullmatch(r"\d+\.\d+\.\d+", public) is not None and not local.startswith("git")


def variant(facts: dict[str, str]) -> str:
    """``cpu``, ``cu130`` (CUDA 13.0) or ``rocm64`` (ROCm 6.4): the torch build's flavour."""
    if facts.get("cuda"):
        return "cu" + "".join(facts["cuda"].split(".")[:2])
    if facts.get("hip"):
        return "rocm" + "".join(re.split(r"[.-]", facts["hip"])[:2])
    return "cpu"


def local_version(facts: dict[str, str]) -> str:
    """The wheel version's local label: ``pt213cpu`` for torch 2.13 (any patch release), CPU build."""
    major, minor, _ = _numbers(facts["torch"])
    return f"pt{major}{minor}{variant(facts)}"


def version(facts: dict[str, str]) -> str:
    """torch_shard's version for a build against ``facts``: ``0.1.0+pt213cpu``."""
    return f"{BASE_VERSION}+{local_version(facts)}"


def requirement(facts: dict[str, str]) -> str:
    """The torch a build runs with, as a requirement for its metadata: the same minor release
    (``torch==2.13.*``), or exactly the same version for a pre-release or source build of torch."""
    if not is_release(facts["torch"]):
        return f"torch=={facts['torch']}"
    major, minor, _ = _numbers(facts["torch"])
    return f"torch=={major}.{minor}.*"


def python_unsupported(version: tuple[int, ...] = tuple(sys.version_info[:2])) -> str | None:
    """Why torch_shard cannot be built for Python ``version`` (major, minor), or None if it can."""
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED_PYTHON
    if SUPPORTED_PYTHON[0] <= tuple(version[:2]) <= SUPPORTED_PYTHON[1]:
        return None
    return (
        f"torch_shard is built and tested for Python {lo_major}.{lo_minor} to {hi_major}.{hi_minor}, and this is "
        f"Python {version[0]}.{version[1]}"
    )


def unsupported(facts: dict[str, str]) -> str | None:
    """Why setup.py must not build against this torch (outside SUPPORTED), or None."""
    numbers = _numbers(facts["torch"])
    if numbers is None or not SUPPORTED[0] <= numbers[:2] <= SUPPORTED[1]:
        return (
            f"torch_shard supports torch {SUPPORTED_SPEC} (its C++ follows torch's C++ API release by "
            f"release), and this environment has torch {facts['torch']}"
        )
    return None


def record_header(facts: dict[str, str], cuda_code: bool = False) -> str:
    """The C header setup.py writes for csrc/build_info.cpp: the record's keys that Python knows."""
    values = {key: facts.get(key, "") for key in PYTHON_KEYS}
    values["cuda_code"] = "1" if cuda_code else "0"
    for key, value in values.items():
        if not _SAFE.fullmatch(value):
            raise ValueError(f"torch_shard build record: unexpected characters in {key}={value!r}")
    body = " ".join(f'"{key}={value}\\n"' for key, value in values.items())
    return (
        "// Generated by setup.py (torch_shard/_support/_build_info.py): the torch this build compiles against,\n"
        "// as Python sees it. csrc/build_info.cpp stores it in the library.\n"
        f"#define TORCH_SHARD_BUILD_RECORD_FROM_PYTHON {body}\n"
    )


def parse_record(data: bytes) -> dict[str, str] | None:
    """The record in ``data`` (a library's bytes), or None if there is none."""
    start = data.find(MARKER)
    if start < 0:
        return None
    end = data.find(b"\0", start)
    text = data[start + len(MARKER) : end if end >= 0 else len(data)].decode("ascii", "replace")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def read_record(path: str) -> dict[str, str] | None:
    """The record stored in the library at ``path``, read from the file (the library is not loaded)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        start = data.find(MARKER)
        if start < 0:
            return None
        return parse_record(data[start : start + 4096])


def incompatibility(recorded: dict[str, str] | None, running: dict[str, str]) -> str | None:
    """Why a library with ``recorded`` cannot run with the ``running`` torch, or None if it can."""
    if recorded is None:
        return "the library carries no build record (it was built by an older torch_shard, or not by its setup.py)"
    built = _numbers(recorded.get("headers", "")) or _numbers(recorded.get("torch", ""))
    now = _numbers(running["torch"])
    reasons = []
    if built is None or now is None or built[:2] != now[:2]:
        reasons.append("torch changes its C++ ABI between minor releases")
    elif not (is_release(recorded.get("torch", "")) and is_release(running["torch"])) and (
        recorded.get("torch") != running["torch"] or recorded.get("git") != running["git"]
    ):
        reasons.append("a pre-release or source build of torch has its own C++ ABI: only the exact build runs it")
    if recorded.get("cxx11_abi") != running["cxx11_abi"]:
        reasons.append(
            f"the library was compiled with _GLIBCXX_USE_CXX11_ABI={recorded.get('cxx11_abi')}, "
            f"torch with {running['cxx11_abi']}"
        )
    if recorded.get("cuda_code") == "1" and variant(recorded) != variant(running):
        reasons.append(f"the library's CUDA code is for {variant(recorded)}, torch is {variant(running)}")
    return "; ".join(reasons) or None


def describe(facts: dict[str, str]) -> str:
    """``2.13.0+cpu (CPU, C++11 ABI)``: a torch, for messages."""
    kind = variant(facts)
    kind = "CPU" if kind == "cpu" else f"CUDA {facts['cuda']}" if facts.get("cuda") else f"ROCm {facts['hip']}"
    abi = "C++11 ABI" if facts.get("cxx11_abi") == "1" else "pre-C++11 ABI"
    return f"{facts.get('torch', '?')} ({kind}, {abi})"


def _source_tree() -> str | None:
    """The source checkout this package lives in (an editable install, a build in the tree), or None."""
    # This file is <root>/torch_shard/_support/_build_info.py.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    if os.path.isfile(os.path.join(root, "setup.py")) and os.path.isdir(os.path.join(root, "csrc")):
        return root
    return None


def _installed_from_directory() -> str | None:
    """The local folder pip installed this (non-editable) torch_shard from, or None (a wheel, an index)."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        text = distribution("torch_shard").read_text("direct_url.json")
    except (ImportError, PackageNotFoundError):
        return None
    if not text:
        return None
    try:
        url = json.loads(text)
    except ValueError:
        return None
    path = url.get("url", "")
    if "dir_info" in url and path.startswith("file://"):
        path = path[len("file://") :]
        return path if os.path.isdir(path) else None
    return None


def fix_command(recorded: dict[str, str] | None, running: dict[str, str]) -> str:
    """The one command that makes the two agree: rebuild torch_shard against the running torch where
    that torch is supported and the source is at hand, else install the torch the library was built
    for."""
    python = shlex.quote(sys.executable)
    rebuildable = unsupported(running) is None
    root = _source_tree()
    if rebuildable and root is not None:
        # Build isolation is fine (the in-tree backend builds against the installed torch) and needs
        # nothing of the environment but pip.
        return f"{python} -m pip install -e {shlex.quote(root)}"
    folder = _installed_from_directory()
    if rebuildable and folder is not None:
        return f"{python} -m pip install {shlex.quote(folder)}"
    if recorded is None or not recorded.get("torch"):
        return f"{python} -m pip install --force-reinstall torch_shard"
    return f"{python} -m pip install {shlex.quote(requirement(recorded))}"


def library_path() -> str:
    """The file of ``torch_shard._C`` (not loaded); ImportError saying how to build it when there is none."""
    spec = importlib.util.find_spec("torch_shard._C")
    if spec is None or not spec.origin:
        raise ImportError(
            "torch_shard's C++ library (torch_shard._C) is not built; build it with: "
            f"{shlex.quote(sys.executable)} -m pip install -e "
            f"{shlex.quote(_source_tree() or '<the torch_shard source folder>')}"
        )
    return spec.origin


def check(library: str | None = None) -> dict[str, str]:
    """Raise ImportError unless the library (``torch_shard._C`` by default) can run with the running
    torch; return its record. Called by ``torch_shard/__init__.py`` before it loads the library."""
    if library is None:
        library = library_path()
    recorded = read_record(library)
    running = torch_facts()
    reason = incompatibility(recorded, running)
    if reason is not None:
        built = describe(recorded) if recorded else "an unknown torch"
        raise ImportError(
            f"torch_shard cannot run with this torch: its C++ library was built for torch {built}, "
            f"and this Python has torch {describe(running)}; {reason}.\n"
            f"  library: {library}\n"
            f"To fix it, run:\n    {fix_command(recorded, running)}"
        )
    return recorded
