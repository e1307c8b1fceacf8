"""TorchRec on torch_shard: DistributedModelParallel over sharded embedding collections, 4 gloo ranks.

The ranks run ``torchrec_scenarios.py`` under torchrun, with ``torch_shard.compat`` installed first,
so every ShardedTensor TorchRec builds is torch_shard's (this test process cannot take the alias: it
has imported upstream's ``torch.distributed._shard`` long before). One launch runs every scenario;
each test below reports one of them.

The ranks get ``PYTHONHASHSEED=0`` in their environment: TorchRec tags the point-to-point messages of
its resharding with ``hash()`` of tuples holding table names, so the ranks (separate interpreters,
each with its own string-hash seed otherwise) must hash alike.

TorchRec 1.8.0 and fbgemm-gpu-cpu 1.8.0 are installed by ``make test`` (see requirements/torchrec.txt).
The tests skip, saying why, only where they are not installed or cannot be imported at all.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import pytest

from torch_shard.testing import package_root

# Launches ranks of its own: not a single-process test (tests/conftest.py).
pytestmark = pytest.mark.distributed

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RUNNER = HERE / "torchrec_scenarios.py"
WORLD_SIZE = 4
# The whole run takes about a minute on a busy 2-core machine; this only stops a hang.
TIMEOUT_S = 900

SCENARIOS = (
    "ebc_forward_backward_against_dense_reference",
    "ebc_state_dict_types_and_values",
    "ebc_dcp_save_and_load_into_another_plan_with_optimizer_state",
    "ebc_rowwise_adagrad_checkpoint_into_a_trained_second_model",
    "ebc_dynamic_resharding",
    "embedding_collection_state_dict_and_forward",
)


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root(), env.get("PYTHONPATH", "")]))
    env["PYTHONHASHSEED"] = "0"
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def scenarios_command(results: str, upstream: bool = False) -> list[str]:
    """torchrun of every scenario on WORLD_SIZE ranks, each rank's outcomes into ``results``; on upstream
    torch.distributed._shard instead of torch_shard with ``upstream``."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={WORLD_SIZE}",
        str(RUNNER),
        results,
    ] + (["--upstream"] if upstream else [])


def run_isolated(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``command`` in its own session (so a timeout stops the ranks torchrun started, too), with the
    ranks' environment; its output (stdout and stderr) in ``stdout``. scripts/stress_torchrec.py uses it
    too."""
    proc = subprocess.Popen(
        command, env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        output += f"\n(killed after {timeout} s)"
    return subprocess.CompletedProcess(command, proc.returncode, output, "")


def _why_torchrec_is_unusable() -> str | None:
    """Why TorchRec cannot be used in this environment at all (without torch_shard), or None."""
    missing = [name for name in ("torchrec", "fbgemm_gpu") if importlib.util.find_spec(name) is None]
    if missing:
        return (
            f"{' and '.join(missing)} not installed (`make test` installs torchrec 1.8.0 and "
            "fbgemm-gpu-cpu 1.8.0 from requirements/torchrec.txt)"
        )
    probe = run_isolated([sys.executable, "-c", "import fbgemm_gpu, torchrec"], timeout=300)
    if probe.returncode != 0:
        last = (probe.stdout.strip().splitlines() or ["(no output)"])[-1]
        return f"torchrec cannot be imported with this torch: {last}"
    return None


class TestTorchRec(unittest.TestCase):
    outcomes: dict[int, dict] = {}
    launch_output = ""

    @classmethod
    def setUpClass(cls) -> None:
        if any(importlib.util.find_spec(name) is None for name in ("torchrec", "fbgemm_gpu")):
            raise unittest.SkipTest(_why_torchrec_is_unusable())
        with tempfile.TemporaryDirectory(prefix="torch_shard_torchrec_") as results:
            proc = run_isolated(scenarios_command(results), TIMEOUT_S)
            cls.launch_output = proc.stdout
            for rank in range(WORLD_SIZE):
                path = Path(results) / f"rank{rank}.json"
                if path.exists():
                    cls.outcomes[rank] = json.loads(path.read_text())
        if not cls.outcomes:
            # No rank got as far as its first scenario: TorchRec itself may be unusable here.
            reason = _why_torchrec_is_unusable()
            if reason:
                raise unittest.SkipTest(reason)

    def _check(self, name: str) -> None:
        if not self.outcomes:
            self.fail(f"no rank reported (torchrun output follows)\n{self.launch_output[-20000:]}")
        report = []
        for rank in range(WORLD_SIZE):
            outcome = self.outcomes.get(rank, {}).get(name)
            if outcome is None:
                report.append(f"----- rank {rank}: no outcome (the rank died?)")
            elif outcome["status"] != "ok":
                report.append(f"----- rank {rank}: {outcome['status']}\n{outcome['detail']}")
        if report:
            tail = self.launch_output[-6000:] if any("no outcome" in r for r in report) else ""
            self.fail("\n".join(report) + (f"\ntorchrun output (end):\n{tail}" if tail else ""))

    def test_every_scenario_has_a_test(self):
        self.assertEqual(sorted(self.outcomes), list(range(WORLD_SIZE)), self.launch_output[-6000:])
        for rank, outcomes in self.outcomes.items():
            self.assertEqual(sorted(outcomes), sorted(SCENARIOS), f"rank {rank}")

    def test_ebc_forward_backward_against_dense_reference(self):
        self._check("ebc_forward_backward_against_dense_reference")

    def test_ebc_state_dict_types_and_values(self):
        self._check("ebc_state_dict_types_and_values")

    def test_ebc_dcp_save_and_load_into_another_plan_with_optimizer_state(self):
        self._check("ebc_dcp_save_and_load_into_another_plan_with_optimizer_state")

    def test_ebc_rowwise_adagrad_checkpoint_into_a_trained_second_model(self):
        self._check("ebc_rowwise_adagrad_checkpoint_into_a_trained_second_model")

    def test_ebc_dynamic_resharding(self):
        self._check("ebc_dynamic_resharding")

    def test_embedding_collection_state_dict_and_forward(self):
        self._check("embedding_collection_state_dict_and_forward")


# FBGEMM alone (no TorchRec, no process group, no torch_shard): a CPU kernel of two tables, one of
# them without rows, trained by exact Adagrad; the kernel's row counts are followed in memory by a value
# above FBGEMM's 2^31-row limit, as a bad heap state may leave there by chance.
_FBGEMM_TABLE_SIZES = """
import sys, torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)
rows = [int(r) for r in sys.argv[1:]]
where = (EmbeddingLocation.HOST, ComputeDevice.CPU)
kernel = SplitTableBatchedEmbeddingBagsCodegen(
    [(r, 8, *where) for r in rows], optimizer=EmbOptimType.EXACT_ADAGRAD, learning_rate=0.5)
cumsum = kernel.hash_size_cumsum.tolist()
kernel.hash_size_cumsum = torch.tensor(cumsum + [1 << 40])[: len(cumsum)]
# One bag per table: both ids of the table with rows, none of the empty one.
full = rows.index(2)
offsets = torch.tensor([0, 0, 2] if full == 1 else [0, 2, 2])
kernel(torch.tensor([0, 1]), offsets).sum().backward()
print("trained")
"""


class TestFbgemmTableSizes(unittest.TestCase):
    """The FBGEMM behaviour behind ``torchrec_scenarios._guard_fbgemm_kernels``: a CPU kernel whose last
    table has no rows reads past its table sizes; one whose empty table comes first does not."""

    def setUp(self) -> None:
        if any(importlib.util.find_spec(name) is None for name in ("torchrec", "fbgemm_gpu")):
            self.skipTest(_why_torchrec_is_unusable())

    def _train(self, *rows: int) -> subprocess.CompletedProcess:
        return run_isolated([sys.executable, "-c", _FBGEMM_TABLE_SIZES, *map(str, rows)], timeout=300)

    def test_an_empty_last_table_makes_the_kernel_read_past_its_sizes(self):
        proc = self._train(2, 0)
        self.assertNotEqual(proc.returncode, 0, proc.stdout)
        self.assertIn("doesn't support embedding tables with more than 2B rows", proc.stdout)

    def test_an_empty_first_table_is_read_within_bounds(self):
        proc = self._train(0, 2)
        self.assertEqual(proc.returncode, 0, proc.stdout)
        self.assertIn("trained", proc.stdout)


if __name__ == "__main__":
    unittest.main()
