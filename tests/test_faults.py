"""Faults around the agreement round: the other ranks raise instead of hanging.

The agreement round makes every argument error raise on every rank. What it cannot prevent is a rank
that fails later, once every rank has agreed and the data moves: a bug, a lost device, a killed
process. Then the other ranks must still raise (a timeout or a closed connection from the backend)
instead of hanging. The test-only hook ``torch.ops.torch_shard_testing._inject_fault(op, action)`` (NOTE
[ Fault injection ] in csrc/testing/testing_ops.cpp) makes this process's next exchange of ``op`` fail right
after the agreement: "raise" throws, "exit" ends the process on the spot (exit code 43). With
"exit_before" the process ends as it enters the exchange, so its peers run the agreement round without
it: on a small CPU group that round goes through a hub (group rank 0, NOTE [ Round 1 through a hub ]),
which must tell the others that the rank is gone, or, after a big op, as an all-to-all, which fails on
every rank.

These tests start their own 4 processes (not the shared multi-process harness) because one scenario
needs a rank that is EXPECTED to die, and all of them a short process-group timeout and a teardown
without the final barrier a broken group could not pass. The processes are spawned (fresh
interpreters): a fork of this test process could inherit a used OpenMP runtime, which is not
fork-safe.

Gloo only, on every machine (gloo groups and CPU placements whatever TORCH_SHARD_TEST_DEVICE says):
what a peer sees of a failed rank is the backend's behaviour, and these expectations are gloo's (a
closed connection or a timeout raised in the waiting rank, the hub reporting a lost peer). NCCL
reports a failed peer through its watchdog, which by default aborts the waiting process instead.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
import traceback
import unittest
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import torch_shard
from torch_shard.sharding_spec import ChunkShardingSpec
from torch_shard.testing import TestCase, run_tests  # also sets GLOO_SOCKET_IFNAME=lo

# Launches ranks of its own: not a single-process test (tests/conftest.py).
pytestmark = pytest.mark.distributed

WORLD = 4
FAULT_RANK = 2
TIMEOUT = timedelta(seconds=10)
INJECTED_EXIT_CODE = 43
# A rank still running this long after the launch is taken to hang: it is killed and sends no report,
# which fails the test. Far beyond the backend's 10 s timeout plus start-up on a loaded machine, so
# only a hang reaches it.
LAUNCH_DEADLINE_S = 240.0


def _placements():
    # gloo and the CPU, on every machine (see the module doc).
    return [f"rank:{r}/cpu" for r in range(WORLD)]


def _reshard_scenario(rank: int, action: str, fault_rank: int, after_big: bool = False):
    """Every rank reshards rows -> columns of a tensor large enough that every rank sends every peer
    more than the hub's 16 KiB slot: the data moves in round 2, where everyone waits for the faulty
    rank's messages. A small gather first puts round 1 on the hub (NOTE [ Round 1 follows the group's
    history ]); ``after_big``: a reshard of the same size first, so round 1 is an all-to-all whose rooms
    carry the data, where everyone waits for the faulty rank in round 1."""
    tensor = torch.arange(256 * 512, dtype=torch.float32).view(256, 512)
    rows, cols = (ChunkShardingSpec(dim=d, placements=_placements()) for d in (0, 1))
    st = torch_shard._shard_tensor(tensor, rows)
    if after_big:
        st.reshard(cols)
        st.reshard(rows)
    else:
        small = torch_shard._shard_tensor(torch.ones(8, 8), rows)
        small.gather(0, torch.empty(8, 8) if rank == 0 else None)
    if rank == fault_rank:
        torch.ops.torch_shard_testing._inject_fault("reshard", action)
    st.reshard(cols)


def _reshard_after_big_scenario(rank: int, action: str, fault_rank: int):
    _reshard_scenario(rank, action, fault_rank, after_big=True)


def _embedding_scenario(rank: int, action: str, fault_rank: int):
    """Sharded embedding_bag: the inputs are shared in ONE round (small), then the results travel in
    an all-to-all derived from them. The faulty rank fails after agreeing on the inputs, so the
    others complete the sharing and then wait for it in the all-to-all."""
    weight = torch_shard._shard_tensor(
        torch.randn(16, 8, generator=torch.Generator().manual_seed(0)),
        ChunkShardingSpec(dim=0, placements=_placements()),
    )
    if rank == fault_rank:
        torch.ops.torch_shard_testing._inject_fault("share_inputs", action)
    F.embedding_bag(torch.tensor([1, 5, 9, 13]), weight, torch.tensor([0, 2]), mode="sum")


# The stalled-rank scenario's own group: a short timeout, so the test takes seconds.
STALL_TIMEOUT_S = 2.0


def _stall_scenario(rank: int, action: str, fault_rank: int):
    """A rank that is alive but late: it enters a gather twice the group's timeout after the others."""
    group = dist.new_group(list(range(WORLD)), timeout=timedelta(seconds=STALL_TIMEOUT_S))
    st = torch_shard._shard_tensor(
        torch.arange(64 * 64, dtype=torch.float32).view(64, 64),
        ChunkShardingSpec(dim=0, placements=_placements()),
        process_group=group,
    )
    if rank == fault_rank:
        time.sleep(2 * STALL_TIMEOUT_S)
    st.gather(0, torch.empty(64, 64) if rank == 0 else None)


def _checkpoint_dir() -> str:
    """The read-once scenario's checkpoint: named after the test process (the ranks' parent), which
    removes it."""
    return os.path.join(tempfile.gettempdir(), f"torch_shard_faults_ckpt_{os.getppid()}")


def _read_once_scenario(rank: int, action: str, fault_rank: int):
    """A checkpoint load read once across the ranks (issue 43): a replicated tensor that one rank
    reads and hands to the others. The faulty rank dies after the agreement, as it starts to read its
    units again to send them (its process exits), so the others wait for it in the exchange."""
    from unittest import mock

    import torch.distributed.checkpoint as dcp

    from torch_shard.checkpoint import ChecksumFileSystemWriter, load
    from torch_shard.checkpoint.read.read_once import ReadOnceLoad

    path = _checkpoint_dir()
    dcp.save({"rep": torch.arange(256 * 512, dtype=torch.float32).view(256, 512)},
             storage_writer=ChecksumFileSystemWriter(path))
    dist.barrier()
    target = {"rep": torch.zeros(256, 512)}
    if rank == fault_rank and action == "exit":
        def die(*args, **kwargs):
            os._exit(INJECTED_EXIT_CODE)

        with mock.patch.object(ReadOnceLoad, "_read_round", die):
            load(target, path, read_once=True)
    load(target, path, read_once=True)


SCENARIOS = {"reshard": _reshard_scenario, "reshard_after_big": _reshard_after_big_scenario,
             "embedding": _embedding_scenario, "stall": _stall_scenario, "read_once": _read_once_scenario}


def _rank_main(rank: int, store_path: str, scenario: str, action: str, fault_rank: int, conn) -> None:
    """One rank: run the scenario, report (outcome, exception class, message, seconds in the op)."""
    try:
        dist.init_process_group(
            "gloo", rank=rank, world_size=WORLD, init_method=f"file://{store_path}", timeout=TIMEOUT
        )
        store = dist.distributed_c10d._get_default_store()
        start = time.monotonic()
        try:
            SCENARIOS[scenario](rank, action, fault_rank)
            report = ("ok", "", "", time.monotonic() - start)
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            report = ("raised", type(exc).__name__, str(exc), time.monotonic() - start)
            if not isinstance(exc, RuntimeError):
                report = ("raised", type(exc).__name__, traceback.format_exc(), time.monotonic() - start)
        # The faulty rank stays in the group until the others have finished (else they would see a
        # closed connection instead of waiting for it): it waits for their marks in the store.
        if rank == fault_rank:
            store.wait([f"done{r}" for r in range(WORLD) if r != fault_rank], timedelta(seconds=LAUNCH_DEADLINE_S))
        else:
            store.set(f"done{rank}", "1")
        conn.send(report)
    except BaseException:  # noqa: BLE001
        conn.send(("error", "", traceback.format_exc(), 0.0))
    finally:
        conn.close()
    # No barrier: the group is broken by design. Leave without running the group's destructors.
    os._exit(0)


def _launch(scenario: str, action: str, fault_rank: int = FAULT_RANK) -> tuple[dict[int, tuple], list[int | None]]:
    """Run ``scenario`` on WORLD fresh processes; (reports by rank, exit codes). A rank that sent no
    report (it died) has none; a rank still running at the deadline is killed (exit code < 0)."""
    ctx = multiprocessing.get_context("spawn")
    fd, store_path = tempfile.mkstemp(prefix="torch_shard_faults_")
    os.close(fd)
    procs, pipes = [], []
    try:
        for rank in range(WORLD):
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_rank_main, args=(rank, store_path, scenario, action, fault_rank, child), daemon=True)
            proc.start()
            child.close()
            procs.append(proc)
            pipes.append(parent)
        deadline = time.monotonic() + LAUNCH_DEADLINE_S
        reports = {}
        for rank, conn in enumerate(pipes):
            if conn.poll(max(0.0, deadline - time.monotonic())):
                try:
                    reports[rank] = conn.recv()
                except EOFError:
                    pass  # died before reporting
        for proc in procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()) + 5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        return reports, [proc.exitcode for proc in procs]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        os.remove(store_path)


class TestFaultsAfterAgreement(TestCase):
    def _check_peers_raised(self, reports, exit_codes, fault_rank=FAULT_RANK,
                            classes=("RuntimeError", "DistBackendError"), within=None):
        """Every rank but ``fault_rank`` raised (one of ``classes`` where given; within ``within``
        seconds where given) and exited cleanly."""
        for rank in range(WORLD):
            if rank == fault_rank:
                continue
            self.assertIn(rank, reports, f"rank {rank} sent no report (exit code {exit_codes[rank]})")
            kind, cls, message, seconds = reports[rank]
            self.assertEqual(kind, "raised", f"rank {rank} did not raise: {reports[rank]}")
            # c10d's DistBackendError is a RuntimeError; the class name is all that crossed the pipe.
            if classes is not None:
                self.assertIn(cls, classes, f"rank {rank}: {cls}: {message}")
            if within is not None:
                self.assertLess(seconds, within, f"rank {rank}: {message}")
            self.assertEqual(exit_codes[rank], 0)

    def _check_raise(self, scenario):
        reports, exit_codes = _launch(scenario, "raise")
        op = {"reshard": "reshard", "embedding": "share_inputs"}[scenario]
        self.assertIn(FAULT_RANK, reports, f"exit codes {exit_codes}")
        kind, cls, message, _ = reports[FAULT_RANK]
        self.assertEqual((kind, cls), ("raised", "RuntimeError"), message)
        self.assertIn(f"torch_shard.{op}: injected fault on rank {FAULT_RANK} after the agreement round", message)
        self._check_peers_raised(reports, exit_codes)

    def _check_exit(self, scenario):
        reports, exit_codes = _launch(scenario, "exit")
        self.assertNotIn(FAULT_RANK, reports)
        self.assertEqual(exit_codes[FAULT_RANK], INJECTED_EXIT_CODE, f"reports {reports}")
        self._check_peers_raised(reports, exit_codes)

    def test_rank_raising_in_round_two(self):
        self._check_raise("reshard")

    def test_rank_exiting_in_round_two(self):
        self._check_exit("reshard")

    def test_rank_exiting_before_the_agreement(self):
        # The hub (rank 0) finds rank 2's connection closed and tells ranks 1 and 3, so all three raise
        # the same error naming it, instead of ranks 1 and 3 waiting on the hub.
        reports, exit_codes = _launch("reshard", "exit_before")
        self.assertNotIn(FAULT_RANK, reports)
        self.assertEqual(exit_codes[FAULT_RANK], INJECTED_EXIT_CODE, f"reports {reports}")
        self._check_peers_raised(reports, exit_codes)
        for rank, (_, cls, message, _) in reports.items():
            self.assertEqual(cls, "DistBackendError", f"rank {rank}: {message}")
            self.assertIn(
                f"torch_shard.reshard: rank {FAULT_RANK} of the process group did not take part in the agreement round",
                message,
            )

    def test_rank_exiting_before_an_all_to_all_agreement(self):
        # Round 1 is an all-to-all (the group's last op was big): every rank's collective fails on the
        # closed connection, so every rank raises (gloo's error) instead of waiting.
        reports, exit_codes = _launch("reshard_after_big", "exit_before")
        self.assertNotIn(FAULT_RANK, reports)
        self.assertEqual(exit_codes[FAULT_RANK], INJECTED_EXIT_CODE, f"reports {reports}")
        self._check_peers_raised(reports, exit_codes)

    def test_hub_exiting_before_the_agreement(self):
        # The hub itself is gone: every other rank's round-1 message to it fails.
        reports, exit_codes = _launch("reshard", "exit_before", fault_rank=0)
        self.assertNotIn(0, reports)
        self.assertEqual(exit_codes[0], INJECTED_EXIT_CODE, f"reports {reports}")
        self._check_peers_raised(reports, exit_codes, fault_rank=0)

    def test_rank_stalling_past_the_group_timeout(self):
        # Rank 2 is alive but enters the gather late. The hub's wait for it times out, and gloo then
        # closes every connection of the hub (NOTE [ Round 1 through a hub ]): ranks 1 and 3 see it
        # closed (or time out themselves) instead of waiting, the hub raises naming rank 2, and the late
        # rank fails on the closed connection. Every rank raises within about one timeout of the hub.
        reports, exit_codes = _launch("stall", "none")
        self._check_peers_raised(reports, exit_codes)
        for rank, (_, _cls, message, seconds) in reports.items():
            if rank != FAULT_RANK:
                self.assertLess(seconds, 2 * STALL_TIMEOUT_S + 5, f"rank {rank}: {message}")
        self.assertIn(
            f"torch_shard.gather: rank {FAULT_RANK} of the process group did not take part in the agreement round",
            reports[0][2],
        )
        self.assertEqual(reports[0][1], "DistBackendError", reports[0][2])
        self.assertIn(FAULT_RANK, reports, f"exit codes {exit_codes}")
        kind, cls, message, _ = reports[FAULT_RANK]
        self.assertEqual(kind, "raised", message)
        self.assertIn(cls, ("RuntimeError", "DistBackendError"), message)

    def test_rank_dying_in_a_read_once_load(self):
        # Every rank loads a replicated tensor read once across the ranks; rank 2 dies after the
        # agreement, as it starts to deliver. The others reach the exchange, see it gone, and raise
        # within seconds (gloo: a closed connection, the hub reporting a lost peer), never hang.
        import shutil

        try:
            reports, exit_codes = _launch("read_once", "exit")
        finally:
            shutil.rmtree(os.path.join(tempfile.gettempdir(), f"torch_shard_faults_ckpt_{os.getpid()}"), True)
        self.assertNotIn(FAULT_RANK, reports)
        self.assertEqual(exit_codes[FAULT_RANK], INJECTED_EXIT_CODE, f"reports {reports}")
        self._check_peers_raised(reports, exit_codes, classes=None, within=TIMEOUT.total_seconds() + 20)

    def test_rank_raising_after_sharing_embedding_inputs(self):
        self._check_raise("embedding")

    def test_rank_exiting_after_sharing_embedding_inputs(self):
        self._check_exit("embedding")


class TestFaultHook(unittest.TestCase):
    """The hook's own argument checks (no process group needed)."""

    def test_arguments(self):
        with self.assertRaisesRegex(ValueError, "action must be 'raise', 'exit', 'exit_before' or 'none'"):
            torch.ops.torch_shard_testing._inject_fault("reshard", "explode")
        with self.assertRaisesRegex(ValueError, "unknown data op 'scatter'"):
            torch.ops.torch_shard_testing._inject_fault("scatter", "raise")
        torch.ops.torch_shard_testing._inject_fault("", "none")


if __name__ == "__main__":
    run_tests()
