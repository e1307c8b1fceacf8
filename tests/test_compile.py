"""torch.compile of a model holding a ShardedTensor parameter, 4 ranks (ours, not an upstream port).

Model (DLRM-like): a dense bottom MLP on dense features, a sharded EmbeddingBag on ids, their
concatenation, a dense top MLP. Dynamo cannot trace a ShardedTensor (NOTE [ ShardedTensor under
torch.compile ]): it breaks the graph once, at the embedding module's call, runs the sharded lookup
eagerly and compiles the rest into two graphs (bottom MLP; concatenation and top MLP). Checked: that
count of breaks and graphs, the break's reason, and that a few training steps give the same losses,
gradients (the local shard's and the dense layers') and updated weights as the same model run eagerly;
``fullgraph=True`` raises ``torch._dynamo.exc.Unsupported`` with the documented reason. And, each in a
fresh interpreter: the compiler-disable wrappers are installed whatever the import order (torch_shard
first, torch._dynamo first, under torch_shard.compat).
"""

import copy
import os
import subprocess
import sys
import textwrap
import unittest

import torch
import torch.nn as nn

from torch_shard import shard_parameter
from torch_shard._support._compile import SHARDED_TENSOR_GRAPH_BREAK_REASON as GRAPH_BREAK_REASON
from torch_shard.sharded_tensor import ShardedTensor
from torch_shard.sharding_spec import ChunkShardingSpec
from torch_shard.testing import (
    TEST_WORLD_SIZE,
    ShardedTensorTestBase,
    package_root,
    placement,
    rank_device,
    run_tests,
    with_comms,
)

ROWS, DIM, DENSE, BAGS, IDS = 40, 8, 5, 6, 15
STEPS = 3


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(DENSE, DIM), nn.ReLU())
        self.bag = nn.EmbeddingBag(ROWS, DIM, mode="sum")
        self.top = nn.Sequential(nn.Linear(2 * DIM, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, dense, ids, offsets):
        return self.top(torch.cat([self.bottom(dense), self.bag(ids, offsets)], dim=1))


def batch(step, rank, device):
    """This rank's batch at ``step`` (same shapes every step, so the compiled code is reused)."""
    g = torch.Generator().manual_seed(100 * step + rank)
    dense = torch.randn(BAGS, DENSE, generator=g)
    ids = torch.randint(0, ROWS, (IDS,), generator=g)
    offsets = torch.tensor([0, 2, 2, 7, 9, 14])  # bag 1 is empty
    return dense.to(device), ids.to(device), offsets.to(device)


def _dynamo():
    """torch._dynamo, imported in the test process only (it imports torch.distributed._shard, which
    test_compat needs unimported in the pytest process)."""
    import torch._dynamo
    import torch._dynamo.utils

    return torch._dynamo


class TestCompile(ShardedTensorTestBase):
    def _models(self, dim):
        torch.manual_seed(0)
        eager = Model().to(rank_device(self.rank))
        spec = ChunkShardingSpec(dim=dim, placements=[placement(r) for r in range(TEST_WORLD_SIZE)])
        shard_parameter(eager.bag, "weight", spec)
        self.assertIsInstance(eager.bag.weight, ShardedTensor)
        # The compiled model is a copy with the same weights (its own local shard and dense layers).
        other = copy.deepcopy(eager)
        return eager, other

    def _params(self, model):
        return [model.bag.weight.local_shards()[0].tensor, *model.bottom.parameters(), *model.top.parameters()]

    def _train_and_compare(self, dim, backend):
        eager, model = self._models(dim)
        dynamo = _dynamo()
        counters = dynamo.utils.counters
        dynamo.reset()
        counters.clear()
        compiled = torch.compile(model, backend=backend)
        device = rank_device(self.rank)
        for step in range(STEPS):
            dense, ids, offsets = batch(step, self.rank, device)
            losses = []
            for net, params in ((compiled, self._params(model)), (eager, self._params(eager))):
                for p in params:
                    p.grad = None
                loss = net(dense, ids, offsets).square().mean()
                loss.backward()
                with torch.no_grad():
                    for p in params:
                        p -= 0.1 * p.grad
                losses.append(loss.detach())
            msg = f"dim {dim}, backend {backend}, step {step}"
            self.assertEqual(losses[0], losses[1], msg=msg)
            for got, expected in zip(self._params(model), self._params(eager)):
                self.assertIsNotNone(got.grad, msg)
                self.assertEqual(got.grad, expected.grad, msg=msg)
                self.assertEqual(got, expected, msg=msg)
        # The sharded lookup is the only break; the bottom MLP and the top MLP (with the
        # concatenation) are the two graphs, compiled once and reused by the later steps.
        reasons = [str(reason) for reason in counters["graph_break"]]
        self.assertEqual(sum(counters["graph_break"].values()), 1, reasons)
        (reason,) = reasons
        self.assertIn(GRAPH_BREAK_REASON, reason)
        self.assertEqual(counters["stats"]["unique_graphs"], 2)

    @with_comms(init_rpc=False)
    def test_compiled_model_matches_eager_rowwise(self):
        # aot_eager: dynamo's graphs through AOTAutograd (forward and backward graphs), run by eager
        # kernels; the sharded lookup's registered autograd runs between the two backward graphs.
        self._train_and_compare(0, "aot_eager")

    @with_comms(init_rpc=False)
    def test_compiled_model_matches_eager_colwise(self):
        self._train_and_compare(1, "aot_eager")

    @with_comms(init_rpc=False)
    def test_fullgraph_raises_unsupported(self):
        _, model = self._models(0)
        dynamo = _dynamo()
        dynamo.reset()
        dense, ids, offsets = batch(0, self.rank, rank_device(self.rank))
        compiled = torch.compile(model, backend="eager", fullgraph=True)
        with self.assertRaises(dynamo.exc.Unsupported) as caught:
            compiled(dense, ids, offsets)
        self.assertIn(GRAPH_BREAK_REASON, str(caught.exception))
        # Nothing ran: no rank entered the sharded lookup's exchange (which would hang the others),
        # and the same model still runs, eagerly.
        self.assertEqual(model(dense, ids, offsets).shape, (BAGS, 1))


def _run_python(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (import order is the point), with this checkout importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root(), env.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )


# Whether dynamo would skip ShardedTensor's torch functions: torch.compiler.disable marks its wrapper.
_CHECK_WRAPPED = """
from torch_shard.sharded_tensor.api import ShardedTensorBase
import torch_shard.interop  # prepares redistribute when imported
from torch_shard._support import _compile
for name in ("__torch_function__", "__torch_dispatch__"):
    assert getattr(getattr(ShardedTensorBase, name), "_torchdynamo_disable", False), name
assert getattr(_compile.untraced_redistribute, "_torchdynamo_disable", False), "interop.redistribute"
"""


class TestCompileWrappersInstalled(unittest.TestCase):
    """The compiler-disable wrappers are in place whatever the import order (NOTE [ ShardedTensor under
    torch.compile ], NOTE [ redistribute under torch.compile ]), and importing torch_shard does not
    import torch._dynamo."""

    def _assert_ok(self, code: str) -> None:
        """Runs ``code``, then checks that the wrappers are installed."""
        proc = _run_python(textwrap.dedent(code) + _CHECK_WRAPPED)
        self.assertEqual(proc.returncode, 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")

    def test_torch_shard_first(self):
        # A lookup that does not import (find_spec) must not use the hook up.
        self._assert_ok(
            """
            import importlib.util, sys
            import torch_shard, torch_shard.interop
            from torch_shard.sharded_tensor.api import ShardedTensorBase
            assert "torch._dynamo" not in sys.modules
            assert not hasattr(ShardedTensorBase.__torch_function__, "_torchdynamo_disable")
            assert torch_shard._support._compile.untraced_redistribute is None
            assert importlib.util.find_spec("torch._dynamo") is not None
            import torch._dynamo
            """
        )

    def test_dynamo_first(self):
        self._assert_ok("import torch._dynamo\nimport torch_shard\n")

    def test_under_compat(self):
        # torch._dynamo imports torch.distributed._shard (through FSDP): with the alias it is torch_shard.
        self._assert_ok(
            """
            import torch_shard.compat
            import torch, torch_shard
            import torch._dynamo
            assert torch.distributed._shard is torch_shard
            """
        )


if __name__ == "__main__":
    run_tests()
