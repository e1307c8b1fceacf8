"""FSDP1's ShardedTensor state dicts with torch_shard.compat: the cases in _fsdp1_cases.py, run in a
fresh interpreter that installs the alias first (this test process has imported upstream's
torch.distributed._shard already, through torch.distributed.checkpoint).

What FSDP1 cannot do on CPU is documented in docs/howto/upstream.md (section "FSDP1").
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import unittest
from pathlib import Path

import pytest

from torch_shard.testing import package_root

# Launches ranks of its own: not a single-process test (tests/conftest.py).
pytestmark = pytest.mark.distributed

HERE = Path(__file__).resolve().parent
CASES = 2


class TestFSDP1ThroughTheAlias(unittest.TestCase):
    def test_fsdp1_cases(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root(), env.get("PYTHONPATH", "")]))
        env["TORCH_SHARD_TEST_DEVICE"] = "cpu"  # the cases are about FSDP1 on the CPU, with gloo
        code = f"""
            import torch_shard.compat
            import sys, unittest
            suite = unittest.defaultTestLoader.loadTestsFromName("_fsdp1_cases")
            result = unittest.TextTestRunner(verbosity=2).run(suite)
            sys.exit(0 if result.wasSuccessful() and result.testsRun == {CASES} else 1)
            """
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)], cwd=HERE, env=env, capture_output=True, text=True, timeout=900
        )
        self.assertEqual(proc.returncode, 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-20000:]}")
        # (rank output interleaves with the runner's lines, so each is checked on its own)
        for name in ("test_sharded_state_dict_and_optimizer_state_through_dcp", "test_local_state_dict_through_dcp"):
            self.assertIn(f"{name} (_fsdp1_cases.TestFSDP1.{name})", proc.stderr)
        self.assertIn(f"Ran {CASES} tests", proc.stderr)


if __name__ == "__main__":
    unittest.main()
