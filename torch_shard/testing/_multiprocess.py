"""A small multi-process unittest harness: each test method runs on ``world_size`` processes.

The parent process starts one process per rank, each runs the same test method with ``self.rank``
set, and the parent collects every rank's outcome: a failure on any rank fails the test with that
rank's traceback; skips propagate; a rank that hangs (e.g. in a collective after a peer raised) is
killed after a grace period instead of hanging CI.

Rank processes come from a fork server (see NOTE [ Rank processes come from a fork server ]): they
start in milliseconds, yet never inherit the test process's OpenMP or CUDA state. Rank processes
write to the test process's stdout and stderr, so a test runner's output capture sees them.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import json
import multiprocessing.connection
import multiprocessing.forkserver
import os
import shutil
import sys
import sysconfig
import tempfile
import time
import traceback
import types
import unittest
from functools import wraps
from multiprocessing import reduction

import torch

from . import _forkserver_preload
from ._case import TestCase

# Upper bound for one test on all ranks; far above what any test needs, low enough to stop a hang.
TEST_TIMEOUT_S = float(os.environ.get("TORCH_SHARD_TEST_TIMEOUT", "300"))
# After one rank fails, how long the others get to finish (they often fail too, with a better error).
FAILURE_GRACE_S = 20.0

# NOTE [ Rank processes come from a fork server ]
# A test process has usually run ATen code before its first multi-process test (in-process tests
# do). Forking it then copies a used OpenMP runtime, and GNU OpenMP is not fork-safe: a child's
# first parallel region waits forever for pool threads that fork did not copy. On GPU machines an
# initialised CUDA driver is unusable after fork as well. So ranks are never forked from the test
# process. multiprocessing's "forkserver" method starts one fresh interpreter (exec, not fork) the
# first time a test needs ranks; the server only imports modules (no parallel region runs, CUDA is
# not initialised) and forks every rank from that clean state. Ranks then initialise OpenMP and
# CUDA themselves, as spawned processes would, but start in milliseconds instead of the seconds a
# fresh interpreter needs to import torch.
#
# What the server imports: on machines without CUDA, every module the test process had loaded
# from installed libraries or torch_shard when the server started (pytest has collected, so that
# is what the test modules import: torch.distributed.checkpoint, sympy, ...), but never test
# modules, whose import runs test code; see _forkserver_preload, which also makes sure the imports
# started no thread. On GPU machines only torch, torch.distributed and torch_shard, which do not
# touch CUDA when imported (other libraries might ask it for devices, initialising it); ranks
# import the rest themselves, more slowly.
#
# What a rank gets from the test process when its test starts, as fork would give it: the
# environment, stdout and stderr (so output capture sees rank output), sys.path and the working
# directory (multiprocessing sends those). A rank imports its test module itself; the server
# lives as long as the test process. TORCH_SHARD_TEST_START_METHOD=spawn|fork overrides the
# method when debugging the harness; "fork" has the hazard above.
_START_METHODS = ("forkserver", "spawn", "fork")
_FORKSERVER_PRELOAD = ("torch", "torch.distributed", "torch.distributed.rpc", "torch_shard")
_PRELOAD_MODULE = f"{__package__}._forkserver_preload"
# Preloaded packages a rank must have from the same files as the test process.
_CHECKED_MODULES = ("torch", "torch_shard")


def _start_method() -> str:
    method = os.environ.get("TORCH_SHARD_TEST_START_METHOD", "forkserver")
    if method not in _START_METHODS:
        raise ValueError(
            f"TORCH_SHARD_TEST_START_METHOD must be one of {', '.join(_START_METHODS)}, got {method!r}"
        )
    return method


def _context():
    method = _start_method()
    ctx = torch.multiprocessing.get_context(method)
    if method == "forkserver":
        _start_fork_server(ctx)
    return ctx


_fork_server_started = False


def _start_fork_server(ctx) -> None:
    """Start the fork server (once) with what it preloads; see the NOTE above."""
    global _fork_server_started
    preload = list(_FORKSERVER_PRELOAD)
    if _compat_installed():
        # The server imports what the test process has loaded, torch.distributed.checkpoint and
        # torch.distributed.fsdp among them, which import torch.distributed._shard: the alias must be
        # in place first, as it was in the test process, or the ranks could not install it.
        preload.insert(0, "torch_shard.compat")
    full = not torch.cuda.is_available()
    if full:
        preload.append(_PRELOAD_MODULE)
    if "pytest" in sys.modules:
        # Each rank re-runs the process's main script, as multiprocessing does; for the
        # ``pytest`` launcher that imports pytest.
        preload.append("pytest")
    ctx.set_forkserver_preload(preload)
    if _fork_server_started:
        return  # (should the server die, multiprocessing restarts it with the short list)
    if full:
        os.environ[_forkserver_preload.PRELOAD_ENV] = _write_preload_list()
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        os.environ.pop(_forkserver_preload.PRELOAD_ENV, None)
    _fork_server_started = True


def _write_preload_list() -> str:
    """Write the fork server's module list (see ``_forkserver_preload``); returns the file's path."""
    roots = {sysconfig.get_path(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    prefixes = tuple(os.path.join(os.path.realpath(root), "") for root in roots if root)
    modules = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file or name.startswith("__"):
            continue
        # Installed libraries and torch_shard; never test modules, whose import runs test code.
        if name.partition(".")[0] == "torch_shard" or os.path.realpath(file).startswith(prefixes):
            modules.append(name)
    path = os.path.join(_session_dir(), "forkserver_preload.json")
    with open(path, "w") as f:
        json.dump({"sys_path": sys.path, "modules": modules}, f)
    return path


class MultiProcessTestCase(TestCase):
    """Base class: every test method runs once per rank in its own process."""

    MAIN_PROCESS_RANK = -1
    #: Seconds all ranks get for one test before the stragglers are killed.
    timeout_s: float = TEST_TIMEOUT_S
    #: Seconds the other ranks get to finish once one rank has failed.
    failure_grace_s: float = FAILURE_GRACE_S

    @property
    def world_size(self) -> int:
        return 4

    def __init__(self, methodName: str = "runTest") -> None:  # noqa: N803 - unittest's name
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
            try:
                self._start_processes()
            except BaseException:
                # unittest skips tearDown when setUp raises: stop the ranks that did start.
                self._stop_processes()
                raise

    def tearDown(self) -> None:
        if self.rank == self.MAIN_PROCESS_RANK:
            self._stop_processes()
        super().tearDown()

    def _stop_processes(self) -> None:
        for proc in getattr(self, "_processes", []):
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=5)
        self._processes = []
        for conn in getattr(self, "_pipes", []):
            conn.close()
        self._pipes = []
        if self.file_name and os.path.exists(self.file_name):
            os.remove(self.file_name)

    def _start_processes(self) -> None:
        ctx = _context()
        cls = type(self)
        module_file = getattr(sys.modules.get(cls.__module__), "__file__", None)
        target = _TestTarget(cls.__module__, module_file, cls.__qualname__)
        setup = _RankSetup(
            stdout=_InheritedFd.of(1),
            stderr=_InheritedFd.of(2),
            environ=dict(os.environ),
            pycache_prefix=_rank_pycache_prefix(),
            modules={name: getattr(sys.modules.get(name), "__file__", None) for name in _CHECKED_MODULES},
            compat=_compat_installed(),
        )
        for rank in range(self.world_size):
            parent_conn, child_conn = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_rank_main,
                name=f"rank {rank}",
                args=(setup, target, self._testMethodName, rank, self.file_name, child_conn),
                daemon=True,
            )
            proc.start()
            child_conn.close()
            self._processes.append(proc)
            self._pipes.append(parent_conn)

    @classmethod
    def _run(cls, rank: int, test_name: str, file_name: str) -> tuple[str, str]:
        """Run ``test_name`` as ``rank`` in this (rank) process; returns ``(outcome, detail)``."""
        self = cls(test_name)
        self.rank = rank
        self.file_name = file_name
        try:
            getattr(self, test_name)()
            _close_leftover_group()
            return ("ok", "")
        except unittest.SkipTest as exc:
            return ("skip", str(exc))
        except BaseException:  # noqa: BLE001 - everything goes back to the parent
            return ("error", traceback.format_exc())

    def _join_processes(self) -> None:
        deadline = time.monotonic() + self.timeout_s
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
                deadline = min(deadline, time.monotonic() + self.failure_grace_s)
        for rank in pending.values():
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


class _InheritedFd:
    """One of the parent's file descriptors, duplicated into the rank process when pickled.

    Under fork the object is not pickled and ``fd`` is the (already inherited) same number.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def of(cls, fd: int) -> _InheritedFd | None:
        """``fd`` of this process, or None if it is not open."""
        try:
            os.fstat(fd)
        except OSError:
            return None
        return cls(fd)

    def __reduce__(self):
        return (_InheritedFd._rebuild, (reduction.DupFd(self.fd),))

    @staticmethod
    def _rebuild(dup) -> _InheritedFd:
        return _InheritedFd(dup.detach())

    def install_as(self, target_fd: int) -> None:
        if self.fd != target_fd:
            os.dup2(self.fd, target_fd)
            os.close(self.fd)


class _RankSetup:
    """What a rank process needs from the test process besides the test itself."""

    def __init__(
        self,
        stdout: _InheritedFd | None,
        stderr: _InheritedFd | None,
        environ: dict[str, str],
        pycache_prefix: str | None,
        modules: dict[str, str | None],
        compat: bool = False,
    ) -> None:
        self.stdout = stdout
        self.stderr = stderr
        # The test process's environment when the test starts (the fork server's is older).
        self.environ = environ
        self.pycache_prefix = pycache_prefix
        # Preloaded module name -> the file the test process imported it from.
        self.modules = modules
        # Whether the test process had torch_shard.compat's alias installed: the rank installs it
        # too before importing the test module, whose upstream imports must resolve the same way.
        self.compat = compat


class _TestTarget:
    """Names the test class so a rank process can import it (test modules are often not packages)."""

    def __init__(self, module: str, file: str | None, qualname: str) -> None:
        self.module = module
        self.file = file
        self.qualname = qualname

    def resolve(self) -> type:
        module = sys.modules.get(self.module)
        if module is None:
            module = self._import()
        obj = module
        for part in self.qualname.split("."):
            obj = getattr(obj, part)
        return obj

    def _import(self) -> types.ModuleType:
        try:
            spec = importlib.util.find_spec(self.module)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and (self.file is None or _same_file(spec.origin, self.file)):
            return importlib.import_module(self.module)
        # Imported by path in the test process (e.g. pytest's importlib mode): do the same.
        if self.file is None:
            raise ImportError(f"cannot import test module {self.module!r} in a rank process")
        spec = importlib.util.spec_from_file_location(self.module, self.file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[self.module] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[self.module]
            raise
        return module


def _compat_installed() -> bool:
    compat = sys.modules.get("torch_shard.compat")
    return compat is not None and compat.installed()


def _same_file(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and os.path.realpath(a) == os.path.realpath(b)


def _rank_main(setup: _RankSetup, target: _TestTarget, test_name: str, rank: int, file_name: str, conn) -> None:
    """Entry point of a rank process: run one test method as ``rank``, send the outcome home."""
    for inherited, target_fd in ((setup.stdout, 1), (setup.stderr, 2)):
        if inherited is not None:
            inherited.install_as(target_fd)
    try:
        _set_environ(setup.environ)
        _check_fork_server()
        _check_preloaded_modules(setup.modules)
        if setup.pycache_prefix is not None:
            sys.pycache_prefix = setup.pycache_prefix
            sys.dont_write_bytecode = False
        if setup.compat:
            import torch_shard.compat  # noqa: F401 - installs the alias on import

        cls = target.resolve()
        outcome = cls._run(rank, test_name, file_name)
    except BaseException:  # noqa: BLE001 - a rank that cannot even load the test reports that
        outcome = ("error", traceback.format_exc())
    try:
        conn.send(outcome)
    finally:
        conn.close()


def _set_environ(environ: dict[str, str]) -> None:
    for name in [name for name in os.environ if name not in environ]:
        del os.environ[name]
    os.environ.update(environ)


def _check_fork_server() -> None:
    preload = sys.modules.get(_PRELOAD_MODULE)
    if preload is not None and preload.started_threads:
        raise RuntimeError(
            f"the test fork server started {preload.started_threads} thread(s) while importing the "
            "libraries the test process had loaded; processes forked from it can hang (set "
            "TORCH_SHARD_TEST_START_METHOD=spawn to run the tests anyway)"
        )


def _check_preloaded_modules(expected: dict) -> None:
    # The fork server imported these with its own sys.path; make sure that found the same files
    # the test process uses, so ranks never test other code than the test process imported.
    for name, file in expected.items():
        loaded = getattr(sys.modules.get(name), "__file__", None)
        if file is not None and loaded is not None and not _same_file(loaded, file):
            raise ImportError(
                f"rank process has {name} from {loaded}, but the test process imported it from {file}; "
                "make both find the same one (PYTHONPATH, or set TORCH_SHARD_TEST_START_METHOD=spawn)"
            )


# NOTE [ Byte-code cache for rank processes ]
# Each rank imports its test module afresh (see NOTE [ Rank processes come from a fork server ]).
# Python normally caches the compiled module in __pycache__, but with PYTHONDONTWRITEBYTECODE set
# every rank of every test would compile it again (a tenth of a second for a large test file, four
# ranks per test). Then ranks keep the byte code in a private directory that lives as long as the
# test process (sys.pycache_prefix), leaving the source tree untouched as the setting asked.


def _rank_pycache_prefix() -> str | None:
    return os.path.join(_session_dir(), "pycache") if sys.dont_write_bytecode else None


_session_dir_path: str | None = None


def _session_dir() -> str:
    """A private directory for this test process's harness files, removed when it exits."""
    global _session_dir_path
    if _session_dir_path is None:
        _session_dir_path = tempfile.mkdtemp(prefix="torch_shard_tests_")
        atexit.register(shutil.rmtree, _session_dir_path, ignore_errors=True)
    return _session_dir_path


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
