"""Test support for torch_shard: the port of upstream's ShardedTensorTestBase and ``with_comms``.

World size is 4, one process per rank. On a machine with at least 4 GPUs and NCCL the tests run
with NCCL and ``cuda:<rank>`` placements; anywhere else with gloo and ``cpu`` placements. Ported
tests take devices and placement strings from :func:`placement` / :func:`rank_device`, so the same
test body runs on both.
"""

from __future__ import annotations

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

__all__ = [
    "DEVICE_TYPE",
    "MultiProcessTestCase",
    "ShardedTensorTestBase",
    "TEST_GPU_NUM",
    "TEST_WORLD_SIZE",
    "TestCase",
    "placement",
    "rank_device",
    "requires_cuda",
    "run_tests",
    "with_comms",
    "worker_placement",
]

TEST_WORLD_SIZE = 4
# Upstream's name for the world size of these tests (one rank per GPU there).
TEST_GPU_NUM = TEST_WORLD_SIZE
# Loopback only; tests never reach for another interface.
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("OMP_NUM_THREADS", "1")

_USE_CUDA = (
    torch.cuda.is_available()
    and torch.cuda.device_count() >= TEST_WORLD_SIZE
    and dist.is_nccl_available()
)
DEVICE_TYPE = "cuda" if _USE_CUDA else "cpu"
DEFAULT_BACKEND = "nccl" if _USE_CUDA else "gloo"
# Collectives in tests move kilobytes; a minute means something is stuck.
PG_TIMEOUT = timedelta(seconds=60)


def rank_device(rank: int) -> str:
    """The device a rank's shards live on in tests: ``cuda:<rank>`` with GPUs, else ``cpu``."""
    return f"cuda:{rank}" if DEVICE_TYPE == "cuda" else "cpu"


def placement(rank: int, device_index: int | None = None) -> str:
    """Placement string for ``rank``: ``rank:<rank>/cuda:<device_index or rank>`` or ``rank:<rank>/cpu``."""
    return f"rank:{rank}/{rank_device(rank if device_index is None else device_index)}"


def worker_placement(rank: int) -> str:
    """RPC worker-name placement for ``rank``: ``worker<rank>/cuda:<rank>`` or ``worker<rank>/cpu``."""
    return f"worker{rank}/{rank_device(rank)}"


def requires_cuda(n: int = 1):
    """Skip (with a reason) unless at least ``n`` CUDA devices exist: for tests about CUDA itself."""
    return unittest.skipUnless(
        torch.cuda.is_available() and torch.cuda.device_count() >= n,
        f"needs {n} CUDA device(s); this machine has {torch.cuda.device_count() if torch.cuda.is_available() else 0}",
    )


class ShardedTensorTestBase(MultiProcessTestCase):
    """Upstream's ShardedTensorTestBase: 4 ranks, process group and RPC set-up helpers."""

    @property
    def world_size(self) -> int:
        return TEST_WORLD_SIZE

    @property
    def backend(self) -> str:
        return DEFAULT_BACKEND

    @property
    def device_type(self) -> str:
        return DEVICE_TYPE

    def init_pg(self, backend: str | None = None) -> None:
        backend = backend or self.backend
        if backend not in ["nccl", "gloo", "mpi", "hccl"]:
            raise RuntimeError(f"Backend {backend} not supported!")
        dist.init_process_group(
            backend=backend,
            world_size=self.world_size,
            rank=self.rank,
            init_method=f"file://{self.file_name}",
            timeout=PG_TIMEOUT,
        )
        if backend == "nccl":
            torch.cuda.set_device(self.rank)

    def init_rpc(self) -> None:
        options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=PG_TIMEOUT.total_seconds())
        options.init_method = f"file://{self.file_name}"
        if DEVICE_TYPE == "cuda":
            for rank in range(self.world_size):
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

    ``backend=None`` means the machine's default: NCCL with 4 GPUs, gloo otherwise.
    """
    if func is None:
        return partial(with_comms, init_rpc=init_rpc, backend=backend)

    @wraps(func)
    def wrapper(self, *args, **kwargs):
        chosen = backend or self.backend
        if chosen == "nccl" and torch.cuda.device_count() < self.world_size:
            raise unittest.SkipTest(f"NCCL test needs {self.world_size} GPUs")
        self.init_comms(init_rpc=init_rpc, backend=chosen)
        func(self, *args, **kwargs)
        self.destroy_comms(destroy_rpc=init_rpc)

    return wrapper


def run_tests() -> None:
    """Entry point for running a test file directly (``python tests/test_x.py``)."""
    unittest.main(argv=sys.argv)
