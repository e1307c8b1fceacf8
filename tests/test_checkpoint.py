"""Checkpoints through torch.distributed.checkpoint (DCP): save in one layout, load into another.

torch_shard's ShardedTensor implements DCP's checkpointable protocol (__create_write_items__,
__create_chunk_list__, __get_tensor_shard__), so dcp.save / dcp.load work on it and a load reads, for
every local shard, exactly the overlapping parts of the saved shards. Modelled on upstream's
test_file_system_checkpoint_cpu.py (TestDistributedReshardOnLoad) and test_dtensor_resharding.py.
"""

import itertools
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from torch_shard import _shard_tensor, sharded_tensor
from torch_shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec, ShardMetadata
from torch_shard.testing import ShardedTensorTestBase, placement, run_tests, with_comms


def _specs():
    """Two chunk specs and two enumerable ones (uneven, empty shards, several shards per rank)."""
    return {
        "rows": ChunkShardingSpec(dim=0, placements=[placement(r) for r in range(4)]),
        "cols_3_of_4": ChunkShardingSpec(dim=1, placements=[placement(r) for r in (2, 0, 1)]),
        "uneven_grid": EnumerableShardingSpec(
            [
                ShardMetadata([0, 0], [4, 21], placement(3)),
                ShardMetadata([4, 0], [6, 10], placement(3)),
                ShardMetadata([4, 10], [6, 11], placement(1)),
                ShardMetadata([10, 0], [0, 21], placement(0)),
            ]
        ),
        "blocks": EnumerableShardingSpec(
            [
                ShardMetadata([0, 0], [5, 7], placement(0)),
                ShardMetadata([0, 7], [5, 14], placement(1)),
                ShardMetadata([5, 0], [5, 14], placement(2)),
                ShardMetadata([5, 14], [5, 7], placement(0)),
            ]
        ),
    }


def _expected_slice(full, shard):
    md = shard.metadata
    return full[tuple(slice(o, o + s) for o, s in zip(md.shard_offsets, md.shard_sizes))]


def _make(full, spec):
    st = sharded_tensor.empty(spec, *full.shape, dtype=full.dtype)
    for shard in st.local_shards():
        shard.tensor.copy_(_expected_slice(full, shard))
    return st


class TestCheckpointReshardOnLoad(ShardedTensorTestBase):
    def _tmp_dir(self):
        holder = [tempfile.mkdtemp(prefix="torch_shard_dcp_") if self.rank == 0 else None]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]

    def _cleanup(self, path):
        dist.barrier()
        if self.rank == 0:
            shutil.rmtree(path, ignore_errors=True)

    @with_comms(init_rpc=False)
    def test_load_with_different_shard_plan(self):
        torch.manual_seed(0)
        full = torch.rand(10, 21).to(self.device)
        specs = _specs()
        for (save_name, save_spec), (load_name, load_spec) in itertools.product(specs.items(), repeat=2):
            path = self._tmp_dir()
            dcp.save({"w": _make(full, save_spec), "step": torch.tensor(7)}, checkpoint_id=path)
            target = sharded_tensor.zeros(load_spec, 10, 21)
            state = {"w": target, "step": torch.tensor(0)}
            dcp.load(state, checkpoint_id=path)
            msg = f"saved as {save_name}, loaded as {load_name}"
            for shard in target.local_shards():
                self.assertEqual(shard.tensor, _expected_slice(full, shard), msg)
            self.assertEqual(state["step"], torch.tensor(7), msg)
            out = torch.zeros(10, 21, device=self.device) if self.rank == 1 else None
            target.gather(1, out)
            if self.rank == 1:
                self.assertEqual(out, full, msg)
            self._cleanup(path)

    @with_comms(init_rpc=False)
    def test_switch_between_sharded_tensor_and_tensor(self):
        torch.manual_seed(1)
        full = torch.rand(32, dtype=torch.float64).to(self.device)
        spec = ChunkShardingSpec(dim=0, placements=[placement(r) for r in (3, 1, 0, 2)])
        # Saved sharded, loaded into a plain tensor on every rank.
        path = self._tmp_dir()
        dcp.save({"t": _shard_tensor(full, spec)}, checkpoint_id=path)
        plain = {"t": torch.zeros(32, dtype=torch.float64, device=self.device)}
        dcp.load(plain, checkpoint_id=path)
        self.assertEqual(plain["t"], full)
        self._cleanup(path)
        # Saved plain (the same tensor on every rank), loaded sharded.
        path = self._tmp_dir()
        dcp.save({"t": full}, checkpoint_id=path)
        target = sharded_tensor.zeros(spec, 32, dtype=torch.float64)
        dcp.load({"t": target}, checkpoint_id=path)
        for shard in target.local_shards():
            self.assertEqual(shard.tensor, _expected_slice(full, shard))
        self._cleanup(path)

    @with_comms(init_rpc=False)
    def test_dtypes_survive_exactly(self):
        spec = ChunkShardingSpec(dim=0, placements=[placement(r) for r in range(4)])
        values = {
            "int64": torch.arange(2**40, 2**40 + 24, dtype=torch.int64).view(6, 4),
            "bf16": torch.linspace(-3, 3, 24).to(torch.bfloat16).view(6, 4),
            "bool": (torch.arange(24) % 3 == 0).view(6, 4),
        }
        values = {name: value.to(self.device) for name, value in values.items()}
        path = self._tmp_dir()
        dcp.save({k: _shard_tensor(v, spec) for k, v in values.items()}, checkpoint_id=path)
        cols = ChunkShardingSpec(dim=1, placements=[placement(r) for r in (1, 0)])
        targets = {k: sharded_tensor.empty(cols, 6, 4, dtype=v.dtype) for k, v in values.items()}
        dcp.load(targets, checkpoint_id=path)
        for name, target in targets.items():
            for shard in target.local_shards():
                self.assertEqual(shard.tensor, _expected_slice(values[name], shard), name)
        self._cleanup(path)


if __name__ == "__main__":
    run_tests()
