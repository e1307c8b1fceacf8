"""The multi-process test harness (ours): rank start-up and what it reports.

``TestOpenMPBeforeRanks`` is the regression test for ranks forked from a test process that had
already run OpenMP-parallel ATen code: GNU OpenMP is not fork-safe, so such ranks hung in their
first parallel region. Here the test process runs a parallel op with 2 threads right before its
ranks start, and every rank runs the same op with 2 threads, then a collective.

``TestHarnessReports`` runs the deliberately failing, skipping and hanging cases of
``_harness_cases`` and checks the outcome the harness reports for each.

``TestForkServerPreload`` checks that the fork server's preload notices imports that start threads.

``TestDeviceSelection`` checks how ``TORCH_SHARD_TEST_DEVICE`` picks the tests' device and backend, in
the test process and in its ranks, and the ``gloo_only`` / ``cuda_only`` guards.
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
from unittest import mock

# Only the module: its cases are meant to fail, so they must not become attributes of this one.
import _harness_cases
import torch
import torch.distributed as dist

import torch_shard.testing as testing
from torch_shard.testing import (
    DEVICE_ENV,
    MultiProcessTestCase,
    ShardedTensorTestBase,
    TestCase,
    default_backend,
    device_type,
    placement,
    rank_device,
    run_tests,
    with_comms,
)

# Far above ATen's parallel grain size (32768 elements), so reductions and element-wise ops split
# the work over the OpenMP threads.
NUMEL = 1 << 22
THREADS = 2


def parallel_sum() -> float:
    """sum(exp(0) * i for i < NUMEL), through a parallel element-wise op and a parallel reduction."""
    x = torch.arange(NUMEL, dtype=torch.float64)
    return (x * torch.zeros_like(x).exp()).sum().item()


EXPECTED_SUM = float(NUMEL * (NUMEL - 1) // 2)  # exact in float64


class TestOpenMPBeforeRanks(ShardedTensorTestBase):
    def setUp(self):
        if self.rank == self.MAIN_PROCESS_RANK:
            # The test process uses its OpenMP pool just before the ranks start.
            self._saved_threads = torch.get_num_threads()
            torch.set_num_threads(THREADS)
            self.assertEqual(EXPECTED_SUM, parallel_sum())
        super().setUp()

    def tearDown(self):
        super().tearDown()
        if self.rank == self.MAIN_PROCESS_RANK:
            torch.set_num_threads(self._saved_threads)

    @with_comms(init_rpc=False)
    def test_parallel_ops_in_ranks(self):
        torch.set_num_threads(THREADS)
        self.assertEqual(THREADS, torch.get_num_threads())
        # The OpenMP work is on the CPU; the collective runs on the tests' device (NCCL needs CUDA).
        total = torch.tensor([parallel_sum()], dtype=torch.float64, device=self.device)
        self.assertEqual(EXPECTED_SUM, total.item())
        dist.all_reduce(total)
        self.assertEqual(EXPECTED_SUM * self.world_size, total.item())


def run_case(case: unittest.TestCase) -> unittest.TestResult:
    result = unittest.TestResult()
    case.run(result)
    return result


class TestHarnessReports(TestCase):
    def assert_failed(self, result: unittest.TestResult) -> str:
        """The single failure's report."""
        self.assertEqual([], result.errors)
        self.assertEqual(1, len(result.failures), result.failures)
        return result.failures[0][1]

    def test_failing_rank_reports_its_traceback(self):
        report = self.assert_failed(run_case(_harness_cases.HarnessCases("test_one_rank_fails")))
        self.assertIn("1 of 4 ranks failed", report)
        self.assertIn("----- rank 2 -----", report)
        self.assertIn('raise ValueError("rank 2 refuses")', report)
        self.assertIn("ValueError: rank 2 refuses", report)

    def test_skips_propagate(self):
        result = run_case(_harness_cases.HarnessCases("test_every_rank_skips"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(1, len(result.skipped))
        self.assertRegex(result.skipped[0][1], r"^skipped on rank \d$")

    def test_peers_of_failed_rank_are_killed(self):
        report = self.assert_failed(run_case(_harness_cases.HangAfterFailureCase("test_peers_hang_after_failure")))
        self.assertIn("4 of 4 ranks failed", report)
        self.assertIn("RuntimeError: rank 1 fails first", report)
        for rank in (0, 2, 3):
            self.assertIn(f"----- rank {rank} -----\ntimed out (killed)", report)

    def test_hung_rank_is_killed_at_timeout(self):
        report = self.assert_failed(run_case(_harness_cases.HangingRankCase("test_one_rank_hangs")))
        self.assertIn("----- rank 3 -----\ntimed out (killed)", report)

    def test_ranks_get_the_test_process_environment(self):
        # Set after the fork server started (earlier tests started it): ranks must still see it.
        os.environ[_harness_cases.PROBE_ENV] = "rank sees me"
        try:
            result = run_case(_harness_cases.HarnessCases("test_sees_environment"))
        finally:
            del os.environ[_harness_cases.PROBE_ENV]
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)

    def test_rank_output_goes_to_test_process_stdout_and_stderr(self):
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                result = run_case(_harness_cases.HarnessCases("test_writes_output"))
            finally:
                for fd, copy in saved.items():
                    os.dup2(copy, fd)
                    os.close(copy)
            out.seek(0)
            err.seek(0)
            written = {"stdout": out.read().decode(), "stderr": err.read().decode()}
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        for stream, text in written.items():
            for rank in range(4):
                self.assertIn(f"{_harness_cases.PROBE_OUTPUT} {stream} rank {rank}\n", text)

    def test_unimportable_test_class_is_reported(self):
        # A class whose module a rank cannot import: the rank says so instead of just exiting.
        ghost = type("GhostCase", (MultiProcessTestCase,), {"test_nothing": lambda self: None})
        ghost.__module__ = "torch_shard_no_such_test_module"
        report = self.assert_failed(run_case(ghost("test_nothing")))
        self.assertIn("4 of 4 ranks failed", report)
        self.assertIn("cannot import test module 'torch_shard_no_such_test_module'", report)


def _machine_has_a_cuda_world() -> bool:
    return torch.cuda.device_count() >= testing.TEST_WORLD_SIZE and dist.is_nccl_available()


class TestDeviceSelection(TestCase):
    """TORCH_SHARD_TEST_DEVICE, read whenever asked (here in the test process, and by each rank)."""

    def _env(self, value: str | None):
        """The test process's environment with TORCH_SHARD_TEST_DEVICE set to ``value`` (None: unset)."""
        env = {k: v for k, v in os.environ.items() if k != DEVICE_ENV}
        if value is not None:
            env[DEVICE_ENV] = value
        return mock.patch.dict(os.environ, env, clear=True)

    def _assert_selected(self, device: str) -> None:
        backend = "nccl" if device == "cuda" else "gloo"
        self.assertEqual((device_type(), default_backend()), (device, backend))
        self.assertEqual((testing.DEVICE_TYPE, testing.DEFAULT_BACKEND), (device, backend))
        self.assertEqual(rank_device(2), "cuda:2" if device == "cuda" else "cpu")
        self.assertEqual(placement(3), "rank:3/cuda:3" if device == "cuda" else "rank:3/cpu")

    def test_default_follows_the_machine(self):
        expected = "cuda" if _machine_has_a_cuda_world() else "cpu"
        for value in (None, "", "auto", " AUTO "):
            with self._env(value):
                self._assert_selected(expected)

    def test_cpu_on_request(self):
        for value in ("cpu", "CPU"):
            with self._env(value):
                self._assert_selected("cpu")

    def test_cuda_on_request(self):
        with self._env("cuda"):
            if _machine_has_a_cuda_world():
                self._assert_selected("cuda")
                return
            count = torch.cuda.device_count()
            message = f"TORCH_SHARD_TEST_DEVICE=cuda asks for one GPU per rank, 4 in all, but this machine has {count}"
            if count >= testing.TEST_WORLD_SIZE:
                message = "TORCH_SHARD_TEST_DEVICE=cuda runs the tests on NCCL, but this torch build has no NCCL"
            for ask in (device_type, default_backend, lambda: rank_device(0), lambda: testing.DEVICE_TYPE):
                with self.assertRaisesRegex(RuntimeError, message):
                    ask()

    def test_unknown_value(self):
        with self._env("tpu"):
            with self.assertRaisesRegex(
                ValueError, "TORCH_SHARD_TEST_DEVICE must be 'cpu', 'cuda', 'one-gpu' or 'auto' \\(or unset\\), but got 'tpu'"
            ):
                device_type()

    def test_one_gpu_on_request(self):
        # Every rank on GPU 0, over gloo: the distributed suite through CUDA on a one-GPU machine.
        for value in ("one-gpu", " ONE-GPU "):
            with self._env(value):
                if torch.cuda.device_count() >= 1:
                    self.assertEqual((device_type(), default_backend()), ("cuda", "gloo"))
                    self.assertTrue(testing.one_gpu())
                    self.assertEqual([rank_device(r) for r in range(4)], ["cuda:0"] * 4)
                    self.assertEqual(placement(3), "rank:3/cuda:0")
                    continue
                message = "TORCH_SHARD_TEST_DEVICE=one-gpu puts every rank's shards on GPU 0, but this machine has no GPU"
                for ask in (device_type, default_backend, lambda: rank_device(0)):
                    with self.assertRaisesRegex(RuntimeError, message):
                        ask()

    def test_ranks_follow_the_test_process(self):
        # The fork server started long before (earlier tests): ranks take the environment the test
        # process has when the test starts, not the one the server was started with.
        choices = [None, "cpu"] + (["cuda"] if _machine_has_a_cuda_world() else [])
        choices += ["one-gpu"] if torch.cuda.device_count() >= 1 else []
        for value in choices:
            with self.subTest(value=value), self._env(value):
                os.environ[_harness_cases.EXPECTED_DEVICE_ENV] = "one-gpu" if testing.one_gpu() else device_type()
                result = run_case(_harness_cases.DeviceSelectionCases("test_rank_follows_the_selection"))
                self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
                self.assertEqual([], result.skipped)

    def test_unusable_selection_fails_before_any_rank_starts(self):
        cases = [("tpu", "ValueError: TORCH_SHARD_TEST_DEVICE must be")]
        if not _machine_has_a_cuda_world():
            cases.append(("cuda", "RuntimeError: TORCH_SHARD_TEST_DEVICE=cuda "))
        if torch.cuda.device_count() == 0:
            cases.append(("one-gpu", "RuntimeError: TORCH_SHARD_TEST_DEVICE=one-gpu "))
        for value, message in cases:
            with self.subTest(value=value), self._env(value):
                case = _harness_cases.DeviceSelectionCases("test_rank_follows_the_selection")
                result = run_case(case)
                self.assertEqual([], result.failures)
                self.assertEqual(1, len(result.errors), result.errors)
                self.assertIn(message, result.errors[0][1])
                self.assertEqual([], getattr(case, "_processes", []))

    def test_gloo_only(self):
        with self._env("cpu"):
            result = run_case(_harness_cases.DeviceSelectionCases("test_gloo_only_runs_on_gloo"))
            self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
            self.assertEqual([], result.skipped)
        result = run_case(_harness_cases.DeviceSelectionCases("test_gloo_only_skips_other_backends"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(["gloo only: the case checks the decorator itself"], [why for _, why in result.skipped])
        with self.assertRaisesRegex(ValueError, "needs the reason"):
            testing.gloo_only("")

    def test_cuda_only(self):
        with self._env("cpu"):
            result = run_case(_harness_cases.DeviceSelectionCases("test_cuda_only"))
            self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
            self.assertEqual(["CUDA only: the case checks the decorator itself"], [why for _, why in result.skipped])
        if _machine_has_a_cuda_world():
            with self._env("cuda"):
                result = run_case(_harness_cases.DeviceSelectionCases("test_cuda_only"))
                self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
                self.assertEqual([], result.skipped)


class TestForkServerPreload(TestCase):
    def test_counts_threads_started_by_preloaded_imports(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "starts_a_thread.py"), "w") as f:
                f.write(textwrap.dedent(
                    """
                    import threading
                    threading.Thread(target=threading.Event().wait, daemon=True).start()
                    """
                ))
            spec_path = os.path.join(tmp, "preload.json")
            with open(spec_path, "w") as f:
                json.dump({"sys_path": [tmp, *sys.path], "modules": ["json", "no_such_module_here", "starts_a_thread"]}, f)
            probe = (
                "import torch_shard.testing._forkserver_preload as p; "
                "print(p.started_threads, p.failed_modules)"
            )
            env = dict(os.environ, TORCH_SHARD_TEST_FORKSERVER_PRELOAD=spec_path)
            out = subprocess.run(
                [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
            ).stdout
        self.assertEqual("1 ['no_such_module_here']", out.strip())


if __name__ == "__main__":
    run_tests()
