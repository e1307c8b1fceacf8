"""Build script for torch_shard: one C++ extension, ``torch_shard._C``.

Build against the torch that is already installed (the extension is tied to its exact C++ ABI):

    pip install --no-build-isolation -e .
"""

import glob
import os

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))
DEBUG = os.environ.get("DEBUG", "0") == "1"
# TORCH_SHARD_SANITIZE=1: AddressSanitizer + UndefinedBehaviorSanitizer build (see scripts/sanitize.sh).
SANITIZE = os.environ.get("TORCH_SHARD_SANITIZE", "0") == "1"
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]


def _sources():
    # Paths relative to setup.py: setuptools rejects absolute source paths in editable builds.
    files = glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True)
    return sorted(files)


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
    packages=find_packages(include=["torch_shard", "torch_shard.*"]),
    ext_modules=[
        CppExtension(
            "torch_shard._C",
            _sources(),
            include_dirs=[os.path.join(HERE, "csrc")],
            extra_compile_args=extra_compile_args,
            extra_link_args=extra_link_args,
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
