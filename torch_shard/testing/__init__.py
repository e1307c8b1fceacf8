"""Test support for torch_shard: the port of upstream's ShardedTensorTestBase and ``with_comms``.

World size is 4, one process per rank. The device and backend of the distributed tests come from the
machine, or from the environment variable ``TORCH_SHARD_TEST_DEVICE``:

* unset (or ``auto``): CUDA with NCCL when ``torch.cuda.device_count() >= 4`` and NCCL is available,
  otherwise the CPU with gloo;
* ``cuda``: CUDA with NCCL. Without 4 GPUs (or without NCCL) every distributed test FAILS with an
  error saying so: a run that asked for GPUs must not pass on the CPU, nor skip its way to green;
* ``cpu``: the CPU with gloo, also on a GPU machine;
* ``one-gpu``: every rank's shards on GPU 0, with gloo (which torch_shard stages CUDA shards through
  host memory for; NCCL refuses two ranks on one GPU). On a machine with one GPU (or more) this runs the
  whole distributed suite through the CUDA kernels and CUDA placements. Without a GPU every distributed
  test FAILS, saying so.

Shards of rank ``r`` live on ``cuda:r`` (each rank's current CUDA device), on ``cuda:0`` (``one-gpu``)
or on the CPU. The variable is read whenever a test asks (:func:`device_type`, :func:`placement`, ...),
not once at import: a rank process sees the environment of the test process as it was when the test
started, so the test process and its ranks always agree. Tests take devices and placement strings from :func:`placement` /
:func:`rank_device` (or ``self.device`` / ``self.device_type`` in a ShardedTensorTestBase), so the same
test body runs on both; assertions that hold only on gloo are guarded with
:meth:`ShardedTensorTestBase.gloo_only` or the :func:`gloo_only` decorator, which give the reason.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import unittest
from datetime import timedelta
from functools import partial, wraps

import torch
import torch.distributed as dist
from torch.distributed import rpc

from ._case import TestCase
from ._multiprocess import MultiProcessTestCase

try:
    # Registers the test-only ops, torch.ops.torch_shard_testing.*.
    importlib.import_module("torch_shard._testing_C")
    _has_testing_library = True
except ModuleNotFoundError as e:
    # Not built: a wheel's install (wheels carry the product library alone, setup.py). A library that is
    # there but does not load (built against another torch_shard._C) raises.
    if e.name != "torch_shard._testing_C":
        raise
    _has_testing_library = False

__all__ = [
    "DEVICE_ENV",
    "DEVICE_TYPE",
    "DEFAULT_BACKEND",
    "HAS_TESTING_LIBRARY",
    "MultiProcessTestCase",
    "ONE_GPU",
    "ShardedTensorTestBase",
    "TEST_GPU_NUM",
    "TEST_WORLD_SIZE",
    "TestCase",
    "cpu_loops",
    "cuda_only",
    "default_backend",
    "device_type",
    "full_tensor",
    "gloo_only",
    "one_gpu",
    "package_root",
    "placement",
    "rank_device",
    "requires_cuda",
    "requires_testing_library",
    "run_tests",
    "with_comms",
    "worker_placement",
]

TEST_WORLD_SIZE = 4
# Upstream's name for the world size of these tests (one rank per GPU there).
TEST_GPU_NUM = TEST_WORLD_SIZE
#: The environment variable that picks the tests' device: "cpu", "cuda", "one-gpu", or unset / "auto".
DEVICE_ENV = "TORCH_SHARD_TEST_DEVICE"
#: Its value for every rank on GPU 0, over gloo.
ONE_GPU = "one-gpu"
#: Whether the test library torch_shard._testing_C (torch.ops.torch_shard_testing.*) is installed: every
#: development build has it (`pip install -e .`, `make build`); a wheel's install does not.
HAS_TESTING_LIBRARY = _has_testing_library
# Loopback only; tests never reach for another interface.
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Collectives in tests move kilobytes; a minute means something is stuck.
PG_TIMEOUT = timedelta(seconds=60)


def _cuda_device_count() -> int:
    # Counting creates no CUDA context in the test process (its ranks set up CUDA themselves).
    return torch.cuda.device_count()


def device_type() -> str:
    """``"cuda"`` or ``"cpu"``: the device the distributed tests run on (see the module doc).

    Raises ValueError for an unknown ``TORCH_SHARD_TEST_DEVICE`` and RuntimeError when it asks for CUDA
    on a machine without ``TEST_WORLD_SIZE`` GPUs or without NCCL.
    """
    raw = os.environ.get(DEVICE_ENV, "")
    requested = _requested_device()
    if requested == ONE_GPU:
        count = _cuda_device_count()
        if count < 1:
            raise RuntimeError(f"{DEVICE_ENV}={ONE_GPU} puts every rank's shards on GPU 0, but this machine has no GPU")
        return "cuda"
    if requested in ("", "auto"):
        enough = _cuda_device_count() >= TEST_WORLD_SIZE and dist.is_nccl_available()
        return "cuda" if enough else "cpu"
    if requested == "cpu":
        return "cpu"
    if requested == "cuda":
        count = _cuda_device_count()
        if count < TEST_WORLD_SIZE:
            raise RuntimeError(
                f"{DEVICE_ENV}=cuda asks for one GPU per rank, {TEST_WORLD_SIZE} in all, but this machine has "
                f"{count}; unset it (or set it to cpu) to run the tests on the CPU with gloo"
            )
        if not dist.is_nccl_available():
            raise RuntimeError(f"{DEVICE_ENV}=cuda runs the tests on NCCL, but this torch build has no NCCL")
        return "cuda"
    raise ValueError(f"{DEVICE_ENV} must be 'cpu', 'cuda', '{ONE_GPU}' or 'auto' (or unset), but got {raw!r}")


def _requested_device() -> str:
    """``TORCH_SHARD_TEST_DEVICE`` as asked for, case and spaces aside ("" when unset)."""
    return os.environ.get(DEVICE_ENV, "").strip().lower()


def one_gpu() -> bool:
    """Whether the tests run in the ``one-gpu`` mode: every rank on ``cuda:0``, gloo (see the module doc)."""
    return _requested_device() == ONE_GPU


def default_backend() -> str:
    """The process-group backend of the tests' device: ``"nccl"`` for CUDA (one GPU per rank), ``"gloo"``
    for the CPU and for the ``one-gpu`` mode."""
    return "nccl" if device_type() == "cuda" and not one_gpu() else "gloo"


def __getattr__(name: str):
    # DEVICE_TYPE / DEFAULT_BACKEND (upstream-style module constants) are computed when asked for, so
    # a module importing them reads the environment of its own import (see the module doc).
    if name == "DEVICE_TYPE":
        return device_type()
    if name == "DEFAULT_BACKEND":
        return default_backend()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def rank_device(rank: int) -> str:
    """The device a rank's shards live on in tests: ``cuda:<rank>`` with a GPU per rank, ``cuda:0`` in the
    ``one-gpu`` mode, else ``cpu``."""
    if device_type() != "cuda":
        return "cpu"
    return "cuda:0" if one_gpu() else f"cuda:{rank}"


def full_tensor(dt) -> torch.Tensor:
    """``dt.full_tensor()`` of a DTensor, gathered through the CPU where ``dt`` holds CUDA tensors on a
    gloo mesh (the one-gpu mode): there torch 2.11's DTensor all-gather (``all_gather_into_tensor``
    through gloo's CUDA path) killed every rank with SIGSEGV (docs/howto/gpus.md). Elsewhere it is
    ``dt.full_tensor()`` itself."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

    if dt.device.type != "cuda":
        return dt.full_tensor()
    mesh = dt.device_mesh
    groups = [mesh.get_group(d) for d in range(mesh.ndim)]
    if dist.get_backend(groups[0]) != "gloo":
        return dt.full_tensor()
    cpu_mesh = DeviceMesh.from_group(groups if mesh.ndim > 1 else groups[0], "cpu", mesh=mesh.mesh)
    local = DTensor.from_local(
        dt.to_local().cpu(), cpu_mesh, dt.placements, run_check=False, shape=dt.shape, stride=dt.stride()
    )
    return local.full_tensor().to(dt.device)


def placement(rank: int, device_index: int | None = None) -> str:
    """Placement string for ``rank``: ``rank:<rank>/cuda:<device_index or rank>`` or ``rank:<rank>/cpu``."""
    return f"rank:{rank}/{rank_device(rank if device_index is None else device_index)}"


def worker_placement(rank: int) -> str:
    """RPC worker-name placement for ``rank``: ``worker<rank>/cuda:<rank>`` or ``worker<rank>/cpu``."""
    return f"worker{rank}/{rank_device(rank)}"


def requires_cuda(n: int = 1):
    """Skip (with a reason) unless at least ``n`` CUDA devices exist: for tests about CUDA itself."""
    return unittest.skipUnless(
        _cuda_device_count() >= n,
        f"needs {n} CUDA device(s); this machine has {_cuda_device_count()}",
    )


_NO_TESTING_LIBRARY = (
    "needs the test library torch_shard._testing_C, which wheels do not carry (a development build has it)"
)


def requires_testing_library(test):
    """Decorator (a test or a test class): skip unless the test library is installed, which only a
    wheel's install lacks (:data:`HAS_TESTING_LIBRARY`); for tests that call the test-only ops. The
    suite's conftest refuses a source checkout without the library, so these tests never skip there."""
    return unittest.skipUnless(HAS_TESTING_LIBRARY, _NO_TESTING_LIBRARY)(test)


@contextlib.contextmanager
def cpu_loops(on: bool):
    """Inside the block, CPU tensors take the fused loops written for them (``True``, the product's) or
    the ATen composition every other device takes (``False``), in this process: torch_shard's one switch
    between the two (csrc/ops/lookup_common.h, ``cpu_loops()``). Set it alike on every rank of a group.
    Without the test library (a wheel's install) nothing can switch them off: ``True`` is then the
    state already, and ``False`` skips the test (or the subtest) it runs in."""
    if not HAS_TESTING_LIBRARY:
        if not on:
            raise unittest.SkipTest(_NO_TESTING_LIBRARY)
        yield
        return
    before = torch.ops.torch_shard_testing._cpu_loops()
    torch.ops.torch_shard_testing._set_cpu_loops(on)
    try:
        yield
    finally:
        torch.ops.torch_shard_testing._set_cpu_loops(before)


def gloo_only(reason: str):
    """Decorator: run the test only when its default process group is gloo; skip it, with ``reason``,
    on any other backend (NCCL). For tests whose every assertion is about gloo. It goes above
    ``with_comms`` (so a skip happens before any group exists) and reads the backend ``with_comms``
    was given, else the tests' default. A part of a test uses :meth:`ShardedTensorTestBase.gloo_only`.
    """
    if not reason:
        raise ValueError("gloo_only needs the reason the test holds only on gloo")

    def decorate(func):
        comms_backend = getattr(func, "_comms_backend", None)

        @wraps(func)
        def wrapper(self, *args, **kwargs):
            if dist.is_available() and dist.is_initialized():
                raise RuntimeError("gloo_only must decorate the test above with_comms (no process group yet)")
            if (comms_backend or self.backend) != "gloo":
                raise unittest.SkipTest(f"gloo only: {reason}")
            return func(self, *args, **kwargs)

        return wrapper

    return decorate


def cuda_only(reason: str):
    """Decorator: run the test only when the tests run on CUDA (see the module doc); skip it, with
    ``reason``, on the CPU. For tests about CUDA itself (``.cuda()`` moves); put it above ``with_comms``.
    Unlike :func:`requires_cuda` it follows ``TORCH_SHARD_TEST_DEVICE``, read when the test runs."""
    if not reason:
        raise ValueError("cuda_only needs the reason the test needs CUDA")

    def decorate(func):
        @wraps(func)
        def wrapper(self, *args, **kwargs):
            if device_type() != "cuda":
                raise unittest.SkipTest(f"CUDA only: {reason}")
            return func(self, *args, **kwargs)

        return wrapper

    return decorate


class ShardedTensorTestBase(MultiProcessTestCase):
    """Upstream's ShardedTensorTestBase: 4 ranks, process group and RPC set-up helpers.

    ``device_type`` / ``backend`` are the tests' device and backend (see the module doc), ``device`` is
    this rank's device (``cuda:<rank>`` or ``cpu``): build dense references and ``out`` tensors there.
    """

    @property
    def world_size(self) -> int:
        return TEST_WORLD_SIZE

    @property
    def backend(self) -> str:
        return default_backend()

    @property
    def device_type(self) -> str:
        return device_type()

    @property
    def device(self) -> torch.device:
        """This rank's device: where its shards live, and where its dense references belong."""
        return torch.device(rank_device(self.rank))

    def setUp(self) -> None:
        if self.rank == self.MAIN_PROCESS_RANK:
            # An unusable TORCH_SHARD_TEST_DEVICE fails here, once, before any rank starts.
            device_type()
        super().setUp()

    def _backend_in_use(self) -> str:
        """The default group's backend once the test has one, else the one it would get."""
        if dist.is_available() and dist.is_initialized():
            return dist.get_backend()
        return self.backend

    def gloo_only(self, reason: str) -> bool:
        """True when the test runs on gloo: ``if self.gloo_only("why"):`` guards assertions that hold
        only there (round counts of the hub, ...); ``reason`` says why, for the reader and for the
        log line of a run on another backend, where the guarded part does not run."""
        if not reason:
            raise ValueError("gloo_only needs the reason the guarded part holds only on gloo")
        if self._backend_in_use() == "gloo":
            return True
        print(f"{self.id()} rank {self.rank}: skipped a gloo-only part: {reason}", file=sys.stderr)
        return False

    def init_pg(self, backend: str | None = None) -> None:
        backend = backend or self.backend
        if backend not in ["nccl", "gloo", "mpi", "hccl"]:
            raise RuntimeError(f"Backend {backend} not supported!")
        if self.device_type == "cuda":
            # Before the group exists: NCCL binds each rank to its current device.
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            backend=backend,
            world_size=self.world_size,
            rank=self.rank,
            init_method=f"file://{self.file_name}",
            timeout=PG_TIMEOUT,
        )

    def init_rpc(self) -> None:
        options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=PG_TIMEOUT.total_seconds())
        options.init_method = f"file://{self.file_name}"
        if self.device_type == "cuda":
            for rank in range(self.world_size):
                if one_gpu():
                    options.set_device_map(f"worker{rank}", {0: 0})
                else:
                    options.set_device_map(f"worker{rank}", {rank: self.rank, self.rank: rank})
        rpc.init_rpc(
            name=f"worker{self.rank:d}",
            rank=self.rank,
            world_size=self.world_size,
            rpc_backend_options=options,
        )

    def init_comms(self, init_rpc: bool = True, backend: str | None = None) -> None:
        if init_rpc:
            self.init_rpc()
        self.init_pg(backend=backend)

    def destroy_comms(self, destroy_rpc: bool = True) -> None:
        # Every rank reaches here before anything is torn down.
        dist.barrier()
        if destroy_rpc:
            rpc.shutdown()
        dist.destroy_process_group()

    def assert_sharded_tensor_equal(self, st1, st2) -> None:
        st1_local_shards = st1.local_shards()
        st2_local_shards = st2.local_shards()
        self.assertEqual(len(st1_local_shards), len(st2_local_shards))
        for i, st1_local_shard in enumerate(st1_local_shards):
            self.assertEqual(st1_local_shard.tensor, st2_local_shards[i].tensor)
            self.assertEqual(st1_local_shard.metadata, st2_local_shards[i].metadata)
        self.assertEqual(st1.metadata(), st2.metadata())
        self.assertEqual(st1.sharding_spec(), st2.sharding_spec())
        self.assertEqual(len(st1.remote_shards()), len(st2.remote_shards()))


def with_comms(func=None, init_rpc: bool = True, backend: str | None = None):
    """Run the test between init_comms and destroy_comms (RPC too unless ``init_rpc=False``).

    ``backend=None`` means the tests' default (see the module doc): NCCL on CUDA, gloo on the CPU.
    """
    if func is None:
        return partial(with_comms, init_rpc=init_rpc, backend=backend)

    @wraps(func)
    def wrapper(self, *args, **kwargs):
        chosen = backend or self.backend
        if chosen == "nccl" and _cuda_device_count() < self.world_size:
            raise unittest.SkipTest(f"NCCL test needs {self.world_size} GPUs")
        self.init_comms(init_rpc=init_rpc, backend=chosen)
        func(self, *args, **kwargs)
        self.destroy_comms(destroy_rpc=init_rpc)

    # For decorators above this one (gloo_only): the backend the test asked for, None for the default.
    wrapper._comms_backend = backend
    return wrapper


def package_root() -> str:
    """The folder a fresh interpreter must find first on ``sys.path`` to import this same torch_shard:
    the parent of the package as it was imported. Tests that start interpreters put it on PYTHONPATH
    (not their checkout's root, whose torch_shard may hold another build: `make test`'s legs test a
    linked package tree built against another torch). Links are not resolved, for the same reason."""
    import torch_shard

    return os.path.dirname(os.path.dirname(os.path.abspath(torch_shard.__file__)))


def run_tests() -> None:
    """Entry point for running a test file directly (``python tests/test_x.py``)."""
    unittest.main(argv=sys.argv)
