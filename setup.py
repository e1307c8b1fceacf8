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


# csrc/testing/ is the test-only library torch_shard._testing_C (torch.ops.torch_shard_testing.*); the
# product library torch_shard._C is everything else under csrc/.
TESTING_DIR = os.path.join("csrc", "testing")


def _sources(testing: bool):
    # Paths relative to setup.py: setuptools rejects absolute source paths in editable builds.
    files = glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True)
    return sorted(f for f in files if f.startswith(TESTING_DIR + os.sep) == testing)


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
            name,
            _sources(testing=name.endswith("_testing_C")),
            include_dirs=[os.path.join(HERE, "csrc")],
            extra_compile_args=extra_compile_args,
            extra_link_args=extra_link_args,
        )
        for name in ("torch_shard._C", "torch_shard._testing_C")
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
