"""A small multi-process unittest harness: each test method runs on ``world_size`` processes.

The parent process starts one process per rank, each runs the same test method with ``self.rank``
set, and the parent collects every rank's outcome: a failure on any rank fails the test with that
rank's traceback; skips propagate; a rank that hangs (e.g. in a collective after a peer raised) is
killed after a grace period instead of hanging CI.

Processes are forked on machines without CUDA (start-up costs milliseconds instead of a fresh
interpreter importing torch) and spawned when CUDA is present, since CUDA does not survive fork.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import tempfile
import time
import traceback
import types
import unittest
from functools import wraps

import torch

from ._case import TestCase

# Upper bound for one test on all ranks; far above what any test needs, low enough to stop a hang.
TEST_TIMEOUT_S = float(os.environ.get("TORCH_SHARD_TEST_TIMEOUT", "300"))
# After one rank fails, how long the others get to finish (they often fail too, with a better error).
FAILURE_GRACE_S = 20.0


def _start_method() -> str:
    return "spawn" if torch.cuda.is_available() else "fork"


class MultiProcessTestCase(TestCase):
    """Base class: every test method runs once per rank in its own process."""

    MAIN_PROCESS_RANK = -1

    @property
    def world_size(self) -> int:
        return 4

    def __init__(self, methodName: str = "runTest") -> None:
        super().__init__(methodName)
        self.rank = self.MAIN_PROCESS_RANK
        self.file_name = ""
        fn = getattr(self, methodName, None)
        if fn is not None:
            setattr(self, methodName, types.MethodType(_join_or_run(fn), self))

    def setUp(self) -> None:
        super().setUp()
        if self.rank == self.MAIN_PROCESS_RANK:
            fd, self.file_name = tempfile.mkstemp(prefix="torch_shard_store_")
            os.close(fd)
            self._processes: list = []
            self._pipes: list = []
            self._start_processes()

    def tearDown(self) -> None:
        if self.rank == self.MAIN_PROCESS_RANK:
            for proc in getattr(self, "_processes", []):
                if proc.is_alive():
                    proc.kill()
                proc.join(timeout=5)
            self._processes = []
            if self.file_name and os.path.exists(self.file_name):
                os.remove(self.file_name)
        super().tearDown()

    def _start_processes(self) -> None:
        ctx = torch.multiprocessing.get_context(_start_method())
        for rank in range(self.world_size):
            parent_conn, child_conn = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=type(self)._run,
                name=f"rank {rank}",
                args=(rank, self._testMethodName, self.file_name, child_conn),
                daemon=True,
            )
            proc.start()
            child_conn.close()
            self._processes.append(proc)
            self._pipes.append(parent_conn)

    @classmethod
    def _run(cls, rank: int, test_name: str, file_name: str, conn) -> None:
        self = cls(test_name)
        self.rank = rank
        self.file_name = file_name
        try:
            getattr(self, test_name)()
            _close_leftover_group()
            outcome = ("ok", "")
        except unittest.SkipTest as exc:
            outcome = ("skip", str(exc))
        except BaseException:  # noqa: BLE001 - everything goes back to the parent
            outcome = ("error", traceback.format_exc())
        try:
            conn.send(outcome)
        finally:
            conn.close()

    def _join_processes(self) -> None:
        deadline = time.monotonic() + TEST_TIMEOUT_S
        outcomes: dict[int, tuple[str, str]] = {}
        pending = {conn: rank for rank, conn in enumerate(self._pipes)}
        while pending:
            now = time.monotonic()
            if now >= deadline:
                break
            ready = multiprocessing.connection.wait(list(pending), timeout=min(1.0, deadline - now))
            for conn in ready:
                rank = pending.pop(conn)
                try:
                    outcomes[rank] = conn.recv()
                except EOFError:
                    proc = self._processes[rank]
                    proc.join(timeout=5)
                    outcomes[rank] = ("error", f"process exited with code {proc.exitcode} before reporting")
            if any(kind == "error" for kind, _ in outcomes.values()):
                deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
        for conn, rank in pending.items():
            outcomes[rank] = ("error", "timed out (killed); it was probably waiting on a failed peer")
        for proc in self._processes:
            if proc.is_alive():
                proc.kill()

        errors = [(rank, text) for rank, (kind, text) in sorted(outcomes.items()) if kind == "error"]
        if errors:
            report = "\n".join(f"----- rank {rank} -----\n{text}" for rank, text in errors)
            self.fail(f"{len(errors)} of {self.world_size} ranks failed:\n{report}")
        skips = [text for kind, text in outcomes.values() if kind == "skip"]
        if skips:
            raise unittest.SkipTest(skips[0])


def _close_leftover_group() -> None:
    # A test that initialised a process group and left it open would let this rank exit while a
    # peer is still connecting or communicating, failing the peer. Leave together instead.
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _join_or_run(fn):
    @wraps(fn)
    def wrapper(self):
        if self.rank == self.MAIN_PROCESS_RANK:
            self._join_processes()
        else:
            fn()

    return wrapper
