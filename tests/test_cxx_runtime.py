"""NOTE [ One C++ runtime ] (torch_shard/_support/_cxx_runtime.py): torch_shard's libraries load the shared
libstdc++ that torch uses, even where the compiler links libstdc++ statically.

The GPU machines of issue 41 set CXX to a GCC whose library folder holds only libstdc++.a; every
library it built carried a private C++ runtime, and the first error message with a number in it
(c10::str through std::ostream) killed the process with SIGSEGV. Here the same compiler is emulated by
``g++ -static-libstdc++``, with which the number silently drops out of the message instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import textwrap
import unittest
from unittest import mock

import torch
from torch.utils import cpp_extension

import torch_shard
from torch_shard._support import _cxx_runtime
from torch_shard.testing import HAS_TESTING_LIBRARY

GXX = shutil.which("g++")
# The source of a library that uses the C++ runtime (an ostream insertion, as c10::str does).
_RUNTIME_USER = "#include <sstream>\nstd::string f(long n) { std::ostringstream s; s << n; return s.str(); }\n"


class TestCxxRuntime(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="torch_shard_cxx_runtime_")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def _static_compiler(self) -> str:
        """A g++ that links libstdc++ statically, as the GPU machines' CXX did."""
        path = os.path.join(self.tmp, "g++-static-libstdc++")
        with open(path, "w") as f:
            f.write(f'#!/bin/sh\nexec {GXX} -static-libstdc++ "$@"\n')
        os.chmod(path, 0o755)
        return path

    def _link(self, name: str, extra: list[str]) -> str:
        source = os.path.join(self.tmp, "user.cpp")
        with open(source, "w") as f:
            f.write(_RUNTIME_USER)
        out = os.path.join(self.tmp, name)
        subprocess.run([self._static_compiler(), "-shared", "-fPIC", source, "-o", out, *extra], check=True)
        return out

    def test_built_libraries_load_the_shared_runtime(self):
        # The test library too wherever it is installed (everywhere but a wheel's install).
        libraries = [torch_shard._C]
        if HAS_TESTING_LIBRARY:
            from torch_shard import _testing_C

            libraries.append(_testing_C)
        for module in libraries:
            needed = _cxx_runtime.needed_libraries(module.__file__)
            self.assertIn(_cxx_runtime.RUNTIME, needed, module.__file__)
            self.assertIsNone(_cxx_runtime.problem(module.__file__))

    def test_needed_libraries_of_files_that_are_no_library(self):
        text = os.path.join(self.tmp, "text")
        with open(text, "w") as f:
            f.write("not an ELF file")
        self.assertIsNone(_cxx_runtime.needed_libraries(text))
        with open(torch_shard._C.__file__, "rb") as f:
            head = f.read(100)  # the ELF header and no more: the program headers are cut off
        cut = os.path.join(self.tmp, "cut.so")
        with open(cut, "wb") as f:
            f.write(head)
        self.assertIsNone(_cxx_runtime.needed_libraries(cut))
        self.assertIsNone(_cxx_runtime.problem(cut))  # unreadable: not refused

    @unittest.skipIf(GXX is None, "needs g++")
    def test_a_private_runtime_is_refused_and_the_link_args_prevent_it(self):
        private = self._link("private.so", [])
        self.assertNotIn(_cxx_runtime.RUNTIME, _cxx_runtime.needed_libraries(private))
        with self.assertRaisesRegex(ImportError, r"does not load the shared C\+\+ runtime \(libstdc\+\+\.so\.6\)"):
            _cxx_runtime.check(private)
        shared = self._link("shared.so", list(_cxx_runtime.LINK_ARGS))
        self.assertIn(_cxx_runtime.RUNTIME, _cxx_runtime.needed_libraries(shared))
        _cxx_runtime.check(shared)

    @unittest.skipIf(GXX is None, "needs g++")
    def test_an_extension_built_by_a_static_compiler_raises_whole_messages(self):
        # An op that fails a TORCH_CHECK_VALUE with a number in its message, built as setup.py builds
        # torch_shard (the link args) by a compiler that links libstdc++ statically.
        source = textwrap.dedent(
            """
            #include <c10/util/Exception.h>
            #include <torch/library.h>

            namespace {
            at::Tensor probe(const at::Tensor& t, int64_t dim) {
              TORCH_CHECK_VALUE(dim < t.dim(), "torch_shard_runtime_probe: bad dim ", dim);
              return t;
            }
            } // namespace

            TORCH_LIBRARY(torch_shard_runtime_probe, m) {
              m.def("probe(Tensor t, int dim) -> Tensor", &probe);
            }
            """
        )
        with mock.patch.dict(os.environ, {"CXX": self._static_compiler()}):
            library = cpp_extension.load_inline(
                "torch_shard_runtime_probe",
                cpp_sources=[source],
                extra_ldflags=list(_cxx_runtime.LINK_ARGS),
                is_python_module=False,
                build_directory=self.tmp,
            )
        del library
        built = os.path.join(self.tmp, "torch_shard_runtime_probe.so")
        self.assertIn(_cxx_runtime.RUNTIME, _cxx_runtime.needed_libraries(built))
        with self.assertRaises(ValueError) as caught:
            torch.ops.torch_shard_runtime_probe.probe(torch.zeros(2), 3)
        self.assertEqual(str(caught.exception).splitlines()[0], "torch_shard_runtime_probe: bad dim 3")


if __name__ == "__main__":
    unittest.main()
