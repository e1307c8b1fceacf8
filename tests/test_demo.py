"""examples/demo.py (what ``make demo`` runs) under torchrun on 4 CPU ranks, as a user runs it.

Rank 0 prints one line per check, ``✓ <n>. <what>: max abs diff <x>[; <extra>]`` (``✗ FAILED`` instead
of the mark when a check fails), three layout pictures, and ``demo: all checks passed (...)`` last;
torchrun must exit with 0.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import pytest

from torch_shard.testing import TEST_WORLD_SIZE

# Launches ranks of its own: not a single-process test (tests/conftest.py).
pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "demo.py"
# The demo takes about 25 s on 4 CPU ranks of a busy 2-core machine, most of it start-up; far more
# means a hang.
TIMEOUT_S = 600
PG_TIMEOUT_S = 180
STEPS = 7
STEP = re.compile(r"(✓|✗ FAILED) (\d+)\. (.+): max abs diff (\S+?)(;.*)?")


def run_demo() -> subprocess.CompletedProcess:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONIOENCODING="utf-8")
    with tempfile.TemporaryDirectory(prefix="torch_shard_demo_test_") as checkpoints:
        return subprocess.run(
            [
                sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={TEST_WORLD_SIZE}",
                str(SCRIPT), "--timeout", str(PG_TIMEOUT_S), "--checkpoint-dir", checkpoints,
            ],
            env=env,
            capture_output=True,
            text=True,
            encoding="utf-8",
            timeout=TIMEOUT_S,
        )


class TestDemo(unittest.TestCase):
    def test_every_step_passes(self):
        proc = run_demo()
        output = f"exit code {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
        lines = proc.stdout.strip().splitlines()
        steps = [m for m in map(STEP.fullmatch, lines) if m]
        self.assertEqual([m[1] for m in steps], ["✓"] * STEPS, output)
        self.assertEqual([int(m[2]) for m in steps], list(range(1, STEPS + 1)), output)
        self.assertTrue(all(float(m[4]) < 1e-5 for m in steps), output)
        # The checkpoint step reports both readers: the byte-range reader, checking every byte against
        # the save's .checksums, reads about a quarter of what DCP's reader reads.
        read = re.search(
            r"ByteRangeFileSystemReader \(every byte checked\) ([\d.]+), DCP's FileSystemReader \(unchecked\) ([\d.]+)",
            proc.stdout,
        )
        self.assertIsNotNone(read, output)
        self.assertLess(float(read[1]), 0.3 * float(read[2]), output)
        # Each picture is printed once, by rank 0 only.
        self.assertEqual(proc.stdout.count("ShardedTensor [4096, 64] float32"), 3, output)
        self.assertIn("rank 0 owns 2 shards", proc.stdout, output)
        self.assertIn("empty shards: rank 3 at [4096, 0]", proc.stdout, output)
        self.assertRegex(lines[-1], r"^demo: all checks passed \(", output)
        # The test-only ops are not the demo's business.
        self.assertNotIn("torch_shard_testing", proc.stdout, output)
        self.assertEqual(proc.returncode, 0, output)


if __name__ == "__main__":
    unittest.main()
