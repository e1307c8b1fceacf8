"""Build script for torch_shard: the C++ extension ``torch_shard._C`` (and the test-only ``_testing_C``).

The extension is C++ against torch's C++ ABI, so it is built against the torch installed in the
environment it will run in, and its metadata says so:

- the version carries the torch minor release and flavour it was built for: ``0.1.0+pt213cpu``;
- it requires that minor release: ``torch==2.13.*`` (patch releases share the ABI: docs/development.md);
- the library stores a record of that torch (csrc/build_info.cpp), which ``import torch_shard`` checks
  against the running torch (torch_shard/_build_info.py).

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


def _load_build_info():
    # By path: importing the package would import torch and the library this script builds.
    spec = importlib.util.spec_from_file_location(
        "_torch_shard_build_info", os.path.join(HERE, "torch_shard", "_build_info.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_info = _load_build_info()

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


def _sources(testing: bool):
    # Paths relative to setup.py: setuptools rejects absolute source paths in editable builds.
    files = glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True)
    return sorted(f for f in files if f.startswith(TESTING_DIR + os.sep) == testing)


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
extra_link_args = []
if SANITIZE:
    extra_compile_args["cxx"] += ["-O1", "-g"] + SANITIZE_FLAGS
    extra_link_args += SANITIZE_FLAGS

setup(
    name="torch_shard",
    version=build_info.version(FACTS),
    packages=find_packages(include=["torch_shard", "torch_shard.*"]),
    install_requires=[build_info.requirement(FACTS), "zlib-ng"],
    ext_modules=[
        CppExtension(
            name,
            _sources(testing=name.endswith("_testing_C")),
            include_dirs=[os.path.join(HERE, "csrc")],
            extra_compile_args=extra_compile_args,
            extra_link_args=extra_link_args,
        )
        for name in ("torch_shard._C", "torch_shard._testing_C")
    ],
    cmdclass={"build_ext": BuildExt},
)
