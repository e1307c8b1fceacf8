"""Build script for torch_shard: the C++ extension ``torch_shard._C`` (and the test-only ``_testing_C``,
which wheels leave out: TESTING_LIBRARY below).

The extension is C++ against torch's C++ ABI, so it is built against the torch installed in the
environment it will run in, and its metadata says so:

- the version carries the torch minor release and flavour it was built for: ``0.1.0+pt213cpu``;
- it requires that minor release: ``torch==2.13.*`` (patch releases share the ABI: docs/development.md);
- the library stores a record of that torch (csrc/build_info.cpp), which ``import torch_shard`` checks
  against the running torch (torch_shard/_support/_build_info.py).

Any of these builds against the installed torch (pyproject.toml's in-tree backend, build_backend/,
finds it even under pip's build isolation):

    pip install .                                  # from a checkout
    pip install --no-build-isolation -e .          # development
    make wheel                                     # a wheel in dist/ for the installed torch

Objects go to build/temp-<python>-torch<version>[-debug|-sanitize]/, kept between builds: ninja
recompiles only what changed, and `make wheel` reuses the objects of `make build`.
"""

import glob
import importlib.util
import os
import sys

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
DEBUG = os.environ.get("DEBUG", "0") == "1"
# TORCH_SHARD_SANITIZE=1: AddressSanitizer + UndefinedBehaviorSanitizer build (see scripts/sanitize.sh).
SANITIZE = os.environ.get("TORCH_SHARD_SANITIZE", "0") == "1"
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]


def _load_by_path(name: str, filename: str):
    # By path: importing the package would import torch and the library this script builds.
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "torch_shard", "_support", filename))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_info = _load_by_path("_torch_shard_build_info", "_build_info.py")
if (why := build_info.python_unsupported()) is not None:
    sys.exit(f"{why}: build it with one of those (pyproject.toml's requires-python).")
# NOTE [ One C++ runtime ] (torch_shard/_support/_cxx_runtime.py): the link flags that keep the extension on the
# shared libstdc++ torch uses, and the check of the built library.
cxx_runtime = _load_by_path("_torch_shard_cxx_runtime", "_cxx_runtime.py")

try:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError as e:
    sys.exit(
        f"torch_shard builds against the torch installed where it is installed, and importing torch failed "
        f"({e}). Install torch first, e.g. `pip install 'torch{build_info.SUPPORTED_SPEC}'`, then build "
        "again (`pip install .`, or `pip install --no-build-isolation -e .` for development)."
    )

FACTS = build_info.torch_facts(torch)
if (why := build_info.unsupported(FACTS)) is not None:
    sys.exit(f"{why}: install a supported torch first, e.g. `pip install 'torch{build_info.SUPPORTED_SPEC}'`.")


# csrc/testing/ is the test-only library torch_shard._testing_C (torch.ops.torch_shard_testing.*); the
# product library torch_shard._C is everything else under csrc/.
TESTING_DIR = os.path.join("csrc", "testing")
# The test library is built with the product everywhere but into a wheel: `pip install -e .` (so a
# plain `pytest` finds it, with nothing prepared), `setup.py build_ext` (the sanitizer build, the
# legs). A wheel (`pip install .`, `pip wheel .`, `python -m build`: setuptools runs this file with the
# bdist_wheel command) carries the product alone. TORCH_SHARD_TESTING_LIBRARY=1 or 0 decides either way.
TESTING_LIBRARY = os.environ.get("TORCH_SHARD_TESTING_LIBRARY", "0" if "bdist_wheel" in sys.argv[1:] else "1") == "1"


# Unity translation units. A .cpp that includes ATen takes about 30 s to compile on a 2-core machine,
# most of it parsing the same headers, and csrc/ is split into files by concept (one job each), so each
# folder of concept files (csrc/layout, csrc/comm, csrc/ops) is compiled as ONE translation unit: a
# generated file, build/unity/<folder>.cpp, that includes them all. A fresh build then compiles 9 units
# instead of 32 (docs/performance.md, "Figures behind design choices", has the times). The price: a
# name in a file's anonymous namespace must be unique within its folder (two that collide fail the
# build at once, in every configuration), and an edit recompiles its folder's unit. TORCH_SHARD_UNITY=0 compiles every file on its own (while
# iterating on one file, or for tools that want one unit per file).
UNITY = os.environ.get("TORCH_SHARD_UNITY", "1") != "0"
UNITY_FOLDERS = ("layout", "comm", "ops")
UNITY_DIR = os.path.join("build", "unity")


def _unity_source(folder: str, members: list) -> str:
    """The generated unit that includes ``members`` (csrc/<folder>/*.cpp), written only when it changes
    (a new mtime would make ninja recompile the folder for nothing)."""
    path = os.path.join(UNITY_DIR, f"{folder}.cpp")
    lines = [f"// Generated by setup.py (UNITY_FOLDERS): csrc/{folder}/*.cpp as one translation unit."]
    lines += [f'#include "{os.path.relpath(m, "csrc")}"' for m in members]
    content = "\n".join(lines) + "\n"
    os.makedirs(os.path.join(HERE, UNITY_DIR), exist_ok=True)
    full = os.path.join(HERE, path)
    if not os.path.exists(full) or open(full).read() != content:
        with open(full, "w") as f:
            f.write(content)
    return path


def _sources(testing: bool):
    # Paths relative to setup.py: setuptools rejects absolute source paths in editable builds.
    files = sorted(glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True))
    files = [f for f in files if f.startswith(TESTING_DIR + os.sep) == testing]
    if not UNITY:
        return files
    sources = []
    for folder in UNITY_FOLDERS:
        prefix = os.path.join("csrc", folder) + os.sep
        members = [f for f in files if f.startswith(prefix)]
        if members:
            sources.append(_unity_source(folder, members))
            files = [f for f in files if f not in members]
    return files + sources


class BuildExt(BuildExtension.with_options(use_ninja=True)):
    """torch's BuildExtension with a build folder of its own per torch and flavour (setuptools gives
    editable builds a new temporary one each time: every build would compile everything), and the
    header that puts the torch's Python-side facts into the build record (csrc/build_info.cpp)."""

    def finalize_options(self):
        if self.build_temp is None:  # not given on the command line (scripts/build_out_of_tree.sh does)
            tag = f"temp-{sys.implementation.cache_tag}-torch{FACTS['torch']}"
            tag += "-debug" if DEBUG else ""
            tag += "-sanitize" if SANITIZE else ""
            self.build_temp = os.path.join(HERE, "build", tag)
        super().finalize_options()

    def build_extensions(self):
        generated = os.path.abspath(os.path.join(self.build_temp, "generated"))
        os.makedirs(generated, exist_ok=True)
        header = os.path.join(generated, "torch_shard_build_record.h")
        content = build_info.record_header(FACTS, cuda_code=False)
        # Written only when it changes: a new mtime would recompile build_info.cpp for nothing.
        if not os.path.exists(header) or open(header).read() != content:
            with open(header, "w") as f:
                f.write(content)
        for extension in self.extensions:
            if generated not in extension.include_dirs:
                extension.include_dirs.append(generated)
        super().build_extensions()
        for extension in self.extensions:
            problem = cxx_runtime.problem(self.get_ext_fullpath(extension.name))
            if problem is not None:
                raise SystemExit(
                    f"torch_shard: {problem}. The link asked for it ({' '.join(cxx_runtime.LINK_ARGS)}); build "
                    f"with a compiler that links libstdc++ dynamically, e.g. CXX=g++."
                )


# No -std flag: torch.utils.cpp_extension adds the standard its headers need (C++20 for torch 2.13;
# our own code is C++17-clean).
extra_compile_args = {
    "cxx": [
        "-O0" if DEBUG else "-O2",
        "-Wall",
        "-Wextra",
        "-Wno-unused-parameter",
        "-Wno-missing-field-initializers",
        "-fdiagnostics-color=always",
    ]
}
if DEBUG:
    extra_compile_args["cxx"].append("-g")
extra_link_args = list(cxx_runtime.LINK_ARGS)
if SANITIZE:
    extra_compile_args["cxx"] += ["-O1", "-g"] + SANITIZE_FLAGS
    extra_link_args += SANITIZE_FLAGS

setup(
    name="torch_shard",
    version=build_info.version(FACTS),
    packages=find_packages(include=["torch_shard", "torch_shard.*"]),
    # xxhash: the digests .checksums records (4.1: XXH3 dispatched to AVX2/AVX-512 at run time, the GIL
    # let go while hashing); zlib-ng: the zip CRC-32s of checkpoints without .checksums.
    install_requires=[build_info.requirement(FACTS), "xxhash>=4.1", "zlib-ng"],
    ext_modules=[
        CppExtension(
            name,
            _sources(testing=name.endswith("_testing_C")),
            include_dirs=[os.path.join(HERE, "csrc")],
            extra_compile_args=extra_compile_args,
            extra_link_args=extra_link_args,
        )
        for name in ("torch_shard._C", "torch_shard._testing_C")
        if TESTING_LIBRARY or not name.endswith("_testing_C")
    ],
    cmdclass={"build_ext": BuildExt},
)
