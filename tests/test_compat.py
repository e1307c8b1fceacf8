"""torch_shard.compat: the torch.distributed._shard alias, its refusal when upstream is already loaded,
upstream-style test code running through it, the test base's comparison semantics, and the upstream
runner's mechanical edits.

The alias changes the process's import state, so every alias test runs in a fresh interpreter (this
pytest process has typically imported torch.distributed.checkpoint, i.e. upstream's package, already).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import unittest
from pathlib import Path

import torch

from torch_shard.testing import TestCase, package_root

REPO = Path(__file__).resolve().parent.parent


def run_python(code: str, cwd: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root(), env.get("PYTHONPATH", "")]))
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


class TestAlias(unittest.TestCase):
    def assert_ok(self, proc: subprocess.CompletedProcess) -> None:
        self.assertEqual(proc.returncode, 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")

    def test_upstream_names_resolve_to_torch_shard(self):
        proc = run_python(
            """
            import importlib, sys
            import torch_shard.compat
            import torch, torch_shard
            names = [
                "", ".api", ".metadata", ".sharder", ".sharded_tensor", ".sharded_tensor.api",
                ".sharded_tensor.metadata", ".sharded_tensor.shard", ".sharded_tensor.utils",
                ".sharded_tensor.logger", ".sharding_spec", ".sharding_spec._internals",
                ".sharding_spec.api", ".sharding_spec.chunk_sharding_spec", ".sharding_plan",
                ".sharded_optim", ".common_op_utils", ".op_registry_utils",
            ]
            for suffix in names:
                upstream = importlib.import_module("torch.distributed._shard" + suffix)
                ours = importlib.import_module("torch_shard" + suffix)
                assert upstream is ours, (suffix, upstream)
            assert torch.distributed._shard is torch_shard
            from torch.distributed._shard.sharded_tensor import ShardedTensor, Shard
            from torch.distributed._shard.sharded_tensor.api import ShardedTensor as ApiShardedTensor
            from torch.distributed._shard.metadata import ShardMetadata
            from torch.distributed._shard import shard_module, _shard_tensor
            assert ShardedTensor is ApiShardedTensor is torch_shard.sharded_tensor.ShardedTensor
            assert ShardMetadata is torch_shard.ShardMetadata
            assert shard_module is torch_shard.shard_module and _shard_tensor is torch_shard._shard_tensor

            import torch_shard.testing as testing
            base = "torch.testing._internal.distributed._shard"
            assert importlib.import_module(base + ".sharded_tensor") is testing
            assert importlib.import_module(base + ".sharded_tensor._test_st_common") is testing._test_st_common
            assert importlib.import_module(base + ".sharded_tensor._test_ops_common") is testing._test_ops_common
            assert importlib.import_module(base + ".test_common") is testing._test_common
            from torch.testing._internal.distributed._shard.sharded_tensor import (
                ShardedTensorTestBase, with_comms, TEST_GPU_NUM,
            )
            assert TEST_GPU_NUM == 4 and ShardedTensorTestBase is testing.ShardedTensorTestBase

            # torch's own importers of the package see torch_shard's classes when imported afterwards.
            import torch.distributed.checkpoint._sharded_tensor_utils as dcp_utils
            import torch.distributed.checkpoint.planner_helpers as helpers
            assert dcp_utils.ShardedTensor is ShardedTensor and helpers.ShardedTensor is ShardedTensor
            # upstream's `checkpoint` is torch.distributed.checkpoint, whatever torch_shard names so.
            import torch.distributed._shard.checkpoint as shim
            assert shim is sys.modules["torch.distributed.checkpoint"], shim
            import torch.distributed._shard.sharded_tensor.api as api_module
            assert not hasattr(api_module, "__path__")  # aliasing leaves torch_shard's modules as they are
            from torch.distributed._shard._utils import narrow_tensor_by_index
            import torch.distributed._shard._utils as upstream_utils
            assert upstream_utils.ShardMetadata is ShardMetadata
            upstream_mods = [n for n, m in sys.modules.items()
                             if n.startswith("torch.distributed._shard") and m is not None
                             and not m.__name__.startswith("torch_shard")
                             and n != "torch.distributed._shard._utils"
                             and not n.startswith("torch.distributed._shard.checkpoint")]
            assert upstream_mods == [], upstream_mods
            print("ok")
            """
        )
        self.assert_ok(proc)
        self.assertIn("ok", proc.stdout)

    def test_install_is_idempotent(self):
        proc = run_python(
            """
            import sys
            import torch_shard.compat as compat
            before = list(sys.meta_path)
            module = sys.modules["torch.distributed._shard.sharded_tensor"]
            compat.install()
            compat.install()
            import torch_shard.compat
            assert compat.installed()
            assert sys.meta_path == before, (before, sys.meta_path)
            assert sum(type(f).__name__ == "_AliasFinder" for f in sys.meta_path) == 1
            assert sys.modules["torch.distributed._shard.sharded_tensor"] is module
            print("ok")
            """
        )
        self.assert_ok(proc)

    def test_refuses_when_upstream_classes_are_in_use(self):
        proc = run_python(
            """
            import torch.distributed.checkpoint
            from torch.distributed._shard.sharded_tensor import ShardedTensor as UpstreamST
            try:
                import torch_shard.compat
            except RuntimeError as exc:
                print("RAISED", exc)
            import sys
            assert sys.modules["torch.distributed._shard.sharded_tensor"].ShardedTensor is UpstreamST
            import torch_shard.compat as compat
            """
        )
        self.assertIn("RAISED", proc.stdout)
        message = proc.stdout
        self.assertIn("torch.distributed._shard was imported before the alias was installed", message)
        self.assertIn("two ShardedTensor classes in play", message)
        self.assertIn("torch.distributed.checkpoint", message)
        # A second import attempt raises again instead of leaving a half-installed alias.
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("RuntimeError: torch_shard.compat", proc.stderr)

    def test_unmapped_upstream_module_is_a_clear_import_error(self):
        proc = run_python(
            """
            import torch_shard.compat
            try:
                import torch.distributed._shard.sharded_tensor.reshard
            except ModuleNotFoundError as exc:
                print("RAISED", exc)
            """
        )
        self.assert_ok(proc)
        self.assertIn("RAISED No module named 'torch.distributed._shard.sharded_tensor.reshard'", proc.stdout)
        self.assertIn("torch_shard.sharded_tensor.reshard", proc.stdout)

    def test_dcp_round_trip_through_the_alias(self):
        # DCP imported after the alias binds torch_shard's classes; save/load of a ShardedTensor works.
        proc = run_python(
            """
            import torch_shard.compat
            import os, tempfile
            import torch
            import torch.distributed as dist
            import torch.distributed.checkpoint as dcp
            from torch.distributed._shard import sharded_tensor
            from torch.distributed._shard.sharding_spec import ChunkShardingSpec
            fd, store = tempfile.mkstemp(); os.close(fd)
            dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
            spec = ChunkShardingSpec(dim=0, placements=["rank:0/cpu", "rank:0/cpu"])
            st = sharded_tensor.rand(spec, 6, 4)
            with tempfile.TemporaryDirectory() as path:
                dcp.save({"w": st}, checkpoint_id=path)
                target = sharded_tensor.zeros(ChunkShardingSpec(dim=1, placements=["rank:0/cpu"]), 6, 4)
                dcp.load({"w": target}, checkpoint_id=path)
            full = torch.empty(6, 4)
            st.gather(out=full)
            assert torch.equal(target.local_tensor(), full)
            dist.destroy_process_group()
            print("ok")
            """
        )
        self.assert_ok(proc)


# An upstream-style test file: upstream's imports, upstream's test-base names, tensor assertNotEqual,
# and a Sharder written for upstream (shards the submodule in place, returns a holder without forward).
UPSTREAM_STYLE_TEST = '''
import copy
import unittest

import torch
import torch.nn as nn
from torch.distributed._shard import shard_module, sharded_tensor
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed._shard.sharder import Sharder
from torch.distributed._shard.sharding_plan import ShardingPlan
from torch.distributed._shard.sharding_spec import ChunkShardingSpec
from torch.testing._internal.distributed._shard.sharded_tensor import (
    ShardedTensorTestBase,
    TEST_GPU_NUM,
    rank_device,
    with_comms,
)
from torch.testing._internal.distributed._shard.sharded_tensor._test_st_common import (
    _chunk_sharding_specs_list_for_test,
)


class Bags(nn.Module):
    def __init__(self):
        super().__init__()
        self.bags = nn.ModuleDict({f"b{i}": nn.EmbeddingBag(10, 8, mode="sum") for i in range(2)})

    def forward(self, inputs):
        return torch.cat([bag(inputs) for bag in self.bags.values()])


class Holder(nn.Module):
    def __init__(self, bags, spec):
        super().__init__()
        for name in bags.bags:
            shard_module(bags, ShardingPlan(plan={f"bags.{name}.weight": spec}))
        self.bags = bags.bags


class HolderSharder(Sharder):
    def __init__(self, spec):
        self.spec = spec

    def shard(self, module):
        return Holder(module, self.spec)


class UpstreamStyle(ShardedTensorTestBase):
    @with_comms(init_rpc=False)
    def test_optimizer_changes_shard(self):
        spec = _chunk_sharding_specs_list_for_test([0], seed=3)[0]
        st = sharded_tensor.rand(spec, 8, 4, requires_grad=True)
        before = st.local_shards()[0].tensor.detach().clone()
        opt = torch.optim.SGD([st.local_shards()[0].tensor], lr=0.5)
        st.local_shards()[0].tensor.sum().backward()
        opt.step()
        self.assertNotEqual(before, st.local_shards()[0].tensor)
        self.assertEqual(before - 0.5, st.local_shards()[0].tensor)

    @with_comms(init_rpc=False)
    def test_sharder_written_for_upstream(self):
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.ebc = Bags()

            def forward(self, inputs):
                return self.ebc(inputs)

        # The base's device type, as newer upstream test files read it: cuda:<rank> under NCCL (cuda:0
        # for every rank in the one-gpu mode), else the CPU.
        devices = [f"rank:{i}/{rank_device(i)}" for i in range(TEST_GPU_NUM)]
        device = torch.device(rank_device(self.rank))
        local = Model().to(device)
        sharded = copy.deepcopy(local)
        shard_module(sharded, ShardingPlan(plan={"ebc": HolderSharder(ChunkShardingSpec(dim=0, placements=devices))}))
        self.assertIsInstance(sharded.ebc, Bags)
        self.assertIsInstance(sharded.ebc.bags["b0"].weight, ShardedTensor)
        inputs = torch.arange(8, device=device).reshape(2, 4)
        self.assertEqual(local(inputs), sharded(inputs))


if __name__ == "__main__":
    unittest.main()
'''


class TestUpstreamStyleEndToEnd(unittest.TestCase):
    def test_upstream_style_file_runs_through_the_alias(self):
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "test_upstream_style.py"
            path.write_text(UPSTREAM_STYLE_TEST)
            proc = run_python(
                f"""
                import torch_shard.compat
                import sys, unittest
                sys.path.insert(0, {tmp!r})
                suite = unittest.defaultTestLoader.loadTestsFromName("test_upstream_style")
                result = unittest.TextTestRunner(verbosity=2).run(suite)
                sys.exit(0 if result.wasSuccessful() and result.testsRun == 2 else 1)
                """,
                cwd=tmp,
                timeout=600,
            )
        self.assertEqual(proc.returncode, 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        self.assertIn("test_sharder_written_for_upstream", proc.stderr)
        self.assertIn("test_optimizer_changes_shard", proc.stderr)


class TestComparisonSemantics(TestCase):
    """The test base's assertEqual / assertNotEqual follow PyTorch's TestCase."""

    def test_devices_must_match(self):
        # Unlike PyTorch's TestCase (exact_device=False there), a tensor on another device differs.
        a = torch.arange(6.0).view(2, 3)
        elsewhere = torch.empty(2, 3, device="meta")
        with self.assertRaisesRegex(self.failureException, "device"):
            self.assertEqual(a, elsewhere)
        self.assertNotEqual(a, elsewhere)
        with self.assertRaisesRegex(self.failureException, "device"):
            self.assertEqual([a], [elsewhere])
        if torch.cuda.is_available():
            self.assertNotEqual(a, a.cuda())
            self.assertEqual(a, a.cuda(), exact_device=False)

    def test_tensors(self):
        a = torch.arange(6.0).view(2, 3)
        self.assertEqual(a, a.clone())
        self.assertNotEqual(a, a + 1)
        self.assertNotEqual(a, a.double())  # dtype must match
        self.assertEqual(a, a.double(), exact_dtype=False)
        self.assertNotEqual(a, a.view(3, 2))
        self.assertEqual(a, [[0, 1, 2], [3, 4, 5]])
        self.assertEqual(torch.tensor([float("nan")]), torch.tensor([float("nan")]))
        self.assertEqual(a, a + 1e-7)  # float32 default tolerance
        with self.assertRaises(self.failureException):
            self.assertNotEqual(a, a.clone())
        with self.assertRaises(self.failureException):
            self.assertEqual(a, a + 1)

    def test_numbers_and_scalars(self):
        self.assertEqual(0.1 + 0.2, 0.3)
        self.assertEqual(1, 1.0)
        self.assertNotEqual(1, 2)
        self.assertNotEqual(1.0, 1.001)
        self.assertEqual(torch.tensor(3.0), 3)
        self.assertEqual(True, 1)
        self.assertNotEqual(True, False)

    def test_containers_and_objects(self):
        self.assertEqual(torch.Size([2, 3]), (2, 3))
        self.assertEqual([1, 2], (1, 2))
        self.assertNotEqual([1, 2], [1, 2, 3])
        self.assertEqual({"a": torch.ones(2)}, {"a": torch.ones(2)})
        self.assertNotEqual({"a": 1}, {"b": 1})
        self.assertEqual(None, None)
        self.assertNotEqual(None, 0)
        self.assertEqual("abc", "abc")
        self.assertNotEqual("abc", "abd")
        self.assertEqual({1, 2}, {2, 1})
        self.assertEqual(torch.float32, torch.float32)
        self.assertNotEqual(torch.float32, torch.float64)
        with self.assertRaisesRegex(self.failureException, "extra message"):
            self.assertEqual(1, 2, "extra message")


def _load_runner():
    spec = importlib.util.spec_from_file_location("run_upstream", REPO / "tests" / "upstream" / "run_upstream.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


class TestRunnerEdits(unittest.TestCase):
    """The upstream runner's mechanical edits, on a snippet in upstream's style."""

    def test_edits(self):
        runner = _load_runner()
        source = textwrap.dedent(
            '''
            class T(ShardedTensorTestBase):
                @with_comms(init_rpc=False, backend="nccl")
                @skip_if_lt_x_gpu(4)
                @requires_nccl()
                def test_x(self):
                    spec = ChunkShardingSpec(dim=0, placements=["rank:0/cuda:0", f"rank:{r}/cuda:{r}"])
                    acc = [f"rank:1/{device_type}:1", "worker2/cuda:2"]
                    t = torch.rand(4).cuda(self.rank)
                    m = Model().cuda()
                    e = torch.nn.Embedding(3, 4).to(self.rank)
                    d = torch.device("cuda:1")
                    local = torch.rand(3).to(f"{DEVICE_TYPE}:{self.rank}")
                    if torch.cuda.is_available():
                        pass
            '''
        )
        edited, counts = runner.edit_source(source)
        self.assertNotIn("skip_if_lt_x_gpu", edited)
        self.assertNotIn("requires_nccl", edited)
        self.assertIn('backend="gloo"', edited)
        self.assertIn('placements=["rank:0/cpu", f"rank:{r}/cpu"]', edited)
        self.assertIn('acc = [f"rank:1/cpu", "worker2/cpu"]', edited)
        self.assertIn("t = torch.rand(4).cpu()", edited)
        self.assertIn("m = Model().cpu()", edited)
        self.assertIn("e = torch.nn.Embedding(3, 4).cpu()", edited)
        self.assertIn('d = torch.device("cpu")', edited)
        self.assertIn('local = torch.rand(3).to("cpu")', edited)
        self.assertIn("torch.cuda.is_available()", edited)  # only the listed edits apply
        self.assertEqual(counts["gpu-skip-decorator"], 2)
        self.assertEqual(counts["cuda-placement"], 3)
