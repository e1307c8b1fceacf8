"""Multi-process test cases that fail, skip or hang on purpose, for test_harness.py to run.

test_harness.py runs each case with a ``unittest.TestResult`` and checks what the harness reports.
The file name does not start with ``test_``, so test runners do not collect these cases; rank
processes import the module by name, like any test module.
"""

import os
import time
import unittest

import torch
import torch.distributed as dist

from torch_shard.testing import (
    MultiProcessTestCase,
    ShardedTensorTestBase,
    cuda_only,
    device_type,
    gloo_only,
    placement,
    rank_device,
    with_comms,
)

# Set by test_harness.py in the test process; ranks must see it.
PROBE_ENV = "TORCH_SHARD_HARNESS_PROBE"
PROBE_OUTPUT = "torch-shard-harness-probe"
# Long enough that only the harness ends it.
HANG_S = 600.0
# Set by test_harness.py to the device it expects the ranks to run on.
EXPECTED_DEVICE_ENV = "TORCH_SHARD_HARNESS_EXPECTED_DEVICE"


class HarnessCases(MultiProcessTestCase):
    def test_one_rank_fails(self):
        if self.rank == 2:
            raise ValueError("rank 2 refuses")

    def test_every_rank_skips(self):
        raise unittest.SkipTest(f"skipped on rank {self.rank}")

    def test_sees_environment(self):
        if os.environ.get(PROBE_ENV) != "rank sees me":
            raise AssertionError(f"{PROBE_ENV}={os.environ.get(PROBE_ENV)!r} in rank {self.rank}")

    def test_writes_output(self):
        # To the file descriptors: sys.stdout may be a test runner's capture object.
        os.write(1, f"{PROBE_OUTPUT} stdout rank {self.rank}\n".encode())
        os.write(2, f"{PROBE_OUTPUT} stderr rank {self.rank}\n".encode())


class HangAfterFailureCase(MultiProcessTestCase):
    # Short grace: the case checks that the harness stops hung peers, not how long it waits.
    failure_grace_s = 1.0

    def test_peers_hang_after_failure(self):
        if self.rank == 1:
            raise RuntimeError("rank 1 fails first")
        time.sleep(HANG_S)


class HangingRankCase(MultiProcessTestCase):
    # No rank fails, one never returns: the overall limit applies.
    timeout_s = 3.0

    def test_one_rank_hangs(self):
        if self.rank == 3:
            time.sleep(HANG_S)


class DeviceSelectionCases(ShardedTensorTestBase):
    """What a rank sees of the device selection (TORCH_SHARD_TEST_DEVICE) and the gloo/CUDA guards."""

    @with_comms(init_rpc=False)
    def test_rank_follows_the_selection(self):
        # The test process's choice, from the environment it had when the test started.
        # "cpu", "cuda" (a GPU per rank, NCCL) or "one-gpu" (every rank on cuda:0, gloo).
        mode = os.environ[EXPECTED_DEVICE_ENV]
        expected = "cpu" if mode == "cpu" else "cuda"
        if (self.device_type, device_type()) != (expected, expected):
            raise AssertionError(f"rank {self.rank} runs on {self.device_type}, the test process chose {expected}")
        backend = "nccl" if mode == "cuda" else "gloo"
        if (self.backend, dist.get_backend()) != (backend, backend):
            raise AssertionError(f"rank {self.rank}: backend {self.backend} / {dist.get_backend()}, expected {backend}")
        device = torch.device({"cpu": "cpu", "cuda": f"cuda:{self.rank}", "one-gpu": "cuda:0"}[mode])
        if self.device != device or torch.device(rank_device(self.rank)) != device:
            raise AssertionError(f"rank {self.rank}: device {self.device}, expected {device}")
        if placement(self.rank) != f"rank:{self.rank}/{device}":
            raise AssertionError(f"rank {self.rank}: placement {placement(self.rank)}")
        guarded = self.gloo_only("the case checks the guard itself")
        if guarded != (backend == "gloo"):
            raise AssertionError(f"gloo_only() returned {guarded} on {backend}")

    @gloo_only("the case checks the decorator itself")
    @with_comms(init_rpc=False, backend="gloo")
    def test_gloo_only_runs_on_gloo(self):
        if dist.get_backend() != "gloo":
            raise AssertionError(f"ran on {dist.get_backend()}")

    # The decorator reads with_comms' backend: this case skips before with_comms would need GPUs.
    @gloo_only("the case checks the decorator itself")
    @with_comms(init_rpc=False, backend="nccl")
    def test_gloo_only_skips_other_backends(self):
        raise AssertionError(f"ran on {dist.get_backend()}")

    @cuda_only("the case checks the decorator itself")
    @with_comms(init_rpc=False)
    def test_cuda_only(self):
        if not (self.device_type == "cuda" and torch.cuda.current_device() == self.rank):
            raise AssertionError(f"rank {self.rank} ran on {self.device_type}")
