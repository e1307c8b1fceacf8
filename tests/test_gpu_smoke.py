"""examples/gpu_smoke.py under torchrun, as a user runs it: 4 CPU ranks on gloo (``--device cpu``),
and also 4 GPUs on NCCL (``--device cuda``) when the tests run on CUDA (TORCH_SHARD_TEST_DEVICE), or
4 ranks on GPU 0 over gloo (``--device cuda --backend gloo``) in the one-gpu mode.

The script prints ``PASS <case>`` / ``FAIL <case>: <why>`` per case and ``gpu_smoke: P/T pass`` last;
every case must pass and torchrun must exit with 0.
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

from torch_shard.testing import TEST_WORLD_SIZE, device_type, one_gpu

# Launches ranks of its own: not a single-process test (tests/conftest.py).
pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "gpu_smoke.py"
# The script takes about a minute on 4 CPU ranks of a busy 2-core machine; far more means a hang.
TIMEOUT_S = 900
# The script's own process-group timeout: a stuck collective fails the run well before TIMEOUT_S.
PG_TIMEOUT_S = 180


def run_smoke(device: str, backend: str = "auto") -> subprocess.CompletedProcess:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="torch_shard_smoke_test_") as checkpoints:
        return subprocess.run(
            [
                sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={TEST_WORLD_SIZE}",
                str(SCRIPT), "--device", device, "--backend", backend, "--timeout", str(PG_TIMEOUT_S),
                "--checkpoint-dir", checkpoints,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )


class TestGpuSmokeScript(unittest.TestCase):
    def _check(self, device: str, backend: str = "auto") -> None:
        proc = run_smoke(device, backend)
        output = f"exit code {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
        lines = proc.stdout.strip().splitlines()
        self.assertTrue(lines, output)
        cases = [line for line in lines[:-1] if line.startswith(("PASS ", "FAIL "))]
        failed = [line for line in cases if line.startswith("FAIL ")]
        self.assertEqual([], failed, output)
        self.assertGreaterEqual(len(cases), 12, output)
        match = re.fullmatch(r"gpu_smoke: (\d+)/(\d+) pass", lines[-1])
        self.assertIsNotNone(match, output)
        self.assertEqual((int(match[1]), int(match[2])), (len(cases), len(cases)), output)
        self.assertEqual(proc.returncode, 0, output)

    def test_every_case_passes(self):
        # With the tests on CUDA, also the script's default (NCCL on the GPUs), or in the one-gpu mode
        # 4 ranks on GPU 0 over gloo.
        runs = [("cpu", "auto")]
        if device_type() == "cuda":
            runs.append(("cuda", "gloo" if one_gpu() else "nccl"))
        for device, backend in runs:
            with self.subTest(device=device, backend=backend):
                self._check(device, backend)


if __name__ == "__main__":
    unittest.main()
