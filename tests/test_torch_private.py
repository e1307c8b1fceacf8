"""The private torch names torch_shard uses (torch_shard/_support/_torch_private.py) exist in the running
torch, and its wrappers around private attributes and signatures work on it. Run on every torch the
project is tested with, this is where a torch release that moves one of them fails first. Single
process; the names are resolved in a fresh interpreter, because one of them imports
torch.distributed._shard, which would spoil later torch_shard.compat tests in this worker.
"""

import os
import subprocess
import sys
import textwrap
import unittest

from torch_shard.testing import package_root, run_tests

_CHECK = textwrap.dedent(
    """
    import os
    import torch
    import torch.distributed as dist
    import torch_shard._support._torch_private as private

    for name in private.__all__:
        getattr(private, name)

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
    dist.init_process_group("gloo", rank=0, world_size=1)
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor, init_device_mesh

    assert private.default_group() is dist.group.WORLD
    assert not private.rank_not_in_group(private.default_group())
    assert private.group_ranks_by_group()[private.default_group()] == {0: 0}
    mesh = init_device_mesh("cpu", (1,))
    full = torch.arange(12.0).view(4, 3)
    dt = distribute_tensor(full, mesh, [Shard(0)])
    assert private.local_tensor(dt) is dt._local_tensor
    spec = private.dtensor_spec(mesh, (Shard(0),), (4, 3), (3, 1), torch.float32)
    assert spec == private.spec_of(dt), (spec, private.spec_of(dt))
    again = private.dtensor_with_spec(private.local_tensor(dt), spec, False)
    assert isinstance(again, DTensor) and torch.equal(again.full_tensor(), full)
    strided = private.strided_shard(0, 2)
    assert isinstance(strided, private.StridedShard) and strided.split_factor == 2
    pieces = private.split_indices(Shard(0), torch.arange(5), 2)
    assert [p.tolist() for p in pieces] == [[0, 1, 2], [3, 4]], pieces
    assert private.op_name(torch.ops.aten.add.Tensor) == private.op_name(torch.ops.aten.add) == "aten::add"
    dist.destroy_process_group()
    print("ok")
    """
)


class TestTorchPrivate(unittest.TestCase):
    def test_every_name_resolves(self):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, PORT=str(port))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root(), env.get("PYTHONPATH", "")]))
        proc = subprocess.run([sys.executable, "-c", _CHECK], env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        self.assertEqual(proc.stdout.strip().splitlines()[-1], "ok")


if __name__ == "__main__":
    run_tests()
