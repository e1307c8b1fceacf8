"""Multi-process test cases that fail, skip or hang on purpose, for test_harness.py to run.

test_harness.py runs each case with a ``unittest.TestResult`` and checks what the harness reports.
The file name does not start with ``test_``, so test runners do not collect these cases; rank
processes import the module by name, like any test module.
"""

import os
import time
import unittest

from torch_shard.testing import MultiProcessTestCase

# Set by test_harness.py in the test process; ranks must see it.
PROBE_ENV = "TORCH_SHARD_HARNESS_PROBE"
PROBE_OUTPUT = "torch-shard-harness-probe"
# Long enough that only the harness ends it.
HANG_S = 600.0


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
