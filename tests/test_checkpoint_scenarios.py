"""Upstream's DTensor checkpoint-resharding scenarios (test_dtensor_resharding.py) with ShardedTensor.

Each test saves a tensor with ``torch.distributed.checkpoint`` in one layout and loads it into another,
then checks every loaded shard's values and dtype exactly:

* placement change in 1-D (rows <-> columns, permuted placements), and back to the saved layout;
* "mesh change": save on 4 ranks, load on a 2-rank sub-group and on a subset of the ranks, and back;
* 2-D grids (EnumerableShardingSpec 2 x 2) <-> rows / columns;
* uneven shards (upstream's 16 x 1 save and load plans, and 14 x 1 in 4 + 4 + 4 + 2 rows);
* empty shards anywhere: trailing chunks past the end of a short dim, inside another shard's range,
  several on one rank, tensors with no elements at all; saved metadata stays in bounds;
* the checkpointable API: a user tensor subclass wrapping a ShardedTensor that implements
  ``__create_write_items__`` / ``__create_chunk_list__`` / ``__get_tensor_shard__`` by delegation.

TestCrossLibraryCheckpoints: checkpoints written by DTensor and by upstream's
``torch.distributed._shard`` load into torch_shard, and torch_shard's load into both, as plain tensors
and as module state_dicts with sharded parameters.

Both classes run again with every load through torch_shard.checkpoint.ByteRangeFileSystemReader;
TestByteRangeReader checks that it reads only the bytes a rank needs.
"""

import functools
import itertools
import math
import warnings
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from _shared import box_slice, chunks, filled, grid_spec, shared_tmp_dir
from torch import nn
from torch.distributed._shard import shard_parameter as up_shard_parameter
from torch.distributed._shard import sharded_tensor as up_sharded_tensor
from torch.distributed._shard.sharding_spec import (
    ChunkShardingSpec as UpChunkShardingSpec,
)
from torch.distributed._shard.sharding_spec import (
    EnumerableShardingSpec as UpEnumerableShardingSpec,
)
from torch.distributed._shard.sharding_spec import (
    ShardMetadata as UpShardMetadata,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor import Shard as DShard
from torch.distributed.tensor import zeros as dtensor_zeros
from torch.testing._internal.distributed.checkpoint_utils import Rot13Example, get_test_extension_registry

from torch_shard import shard_parameter, sharded_tensor
from torch_shard.checkpoint import ByteRangeFileSystemReader, ChecksumFileSystemWriter
from torch_shard.checkpoint.read import chunk as read_chunk
from torch_shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec, ShardMetadata
from torch_shard.testing import ShardedTensorTestBase, full_tensor, placement, run_tests, with_comms


def _rows_plan(plan, ncols: int = 1):
    """EnumerableShardingSpec of (offset, length) row blocks, block i on rank i (upstream's plans)."""
    return EnumerableShardingSpec(
        [ShardMetadata([o, 0], [n, ncols], placement(rank)) for rank, (o, n) in enumerate(plan)]
    )


class CheckpointableShardedTensor(torch.Tensor):
    """A user tensor subclass that is not a ShardedTensor but checkpoints like one: it wraps a
    ShardedTensor and answers DCP's checkpointable protocol by delegating to it (as upstream's
    CheckpointableDistTensor answers it for one local tensor)."""

    _st: Any

    @staticmethod
    def __new__(cls, st):
        obj = torch.Tensor._make_wrapper_subclass(cls, st.size(), dtype=st.dtype, device=st.device)
        obj._st = st
        return obj

    def __init__(self, *args, **kwargs):
        super().__init__()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"{func} is not supported for CheckpointableShardedTensor")

    def __create_write_items__(self, fqn: str, object: Any):
        return self._st.__create_write_items__(fqn, self._st)

    def __create_chunk_list__(self):
        return self._st.__create_chunk_list__()

    def __get_tensor_shard__(self, index):
        return self._st.__get_tensor_shard__(index)

    def __repr__(self):
        return f"CheckpointableShardedTensor({self._st.metadata()})"


class TestCheckpointScenarios(ShardedTensorTestBase):
    # Every load goes through this StorageReader class (DCP's own; a subclass below runs the same
    # scenarios through torch_shard's ByteRangeFileSystemReader).
    reader_cls = dcp.FileSystemReader

    def _load(self, state_dict, path, process_group=None, **reader_kwargs) -> None:
        reader = self.reader_cls(path, **reader_kwargs)
        dcp.load(state_dict, storage_reader=reader, process_group=process_group)

    def _tmp_dir(self) -> str:
        return shared_tmp_dir(self, "torch_shard_dcp_")

    def _assert_holds(self, st, full: torch.Tensor, msg: str = "") -> None:
        """Every local shard of ``st`` equals its box of ``full``, dtype and device included."""
        for shard in st.local_shards():
            expected = box_slice(full, shard.metadata)
            self.assertEqual(shard.tensor.dtype, full.dtype, msg)
            self.assertEqual(shard.tensor.device, full.device, msg)
            self.assertTrue(torch.equal(shard.tensor, expected), f"{msg}: shard {shard.metadata}")

    def _assert_metadata_in_bounds(self, path: str, key: str, size) -> None:
        """The saved chunks of ``key`` lie inside the tensor and tile it; empty chunks only for a tensor
        with no elements."""
        md = dcp.FileSystemReader(path).read_metadata().state_dict_metadata[key]
        self.assertEqual(list(md.size), list(size))
        volume = 0
        for chunk in md.chunks:
            for offset, length, extent in zip(chunk.offsets, chunk.sizes, size):
                self.assertLessEqual(offset + length, extent, f"{key}: chunk {chunk} out of bounds")
            if math.prod(size) != 0:
                self.assertNotEqual(math.prod(chunk.sizes), 0, f"{key}: empty chunk {chunk} saved")
            volume += math.prod(chunk.sizes)
        self.assertEqual(volume, math.prod(size))

    def _save_load(self, full, save_spec, load_spec, msg="", save_pg=None, load_pg=None):
        """Save ``full`` in ``save_spec`` (by the ranks of ``save_pg``), load it into ``load_spec`` (by the
        ranks of ``load_pg``) and check the loaded shards. Returns the loaded tensor (or None on a rank
        outside ``load_pg``)."""
        path = self._tmp_dir()
        if save_pg is None or self.rank in dist.get_process_group_ranks(save_pg):
            dcp.save({"w": filled(full, save_spec, save_pg)}, checkpoint_id=path, process_group=save_pg)
        dist.barrier()
        if load_pg is not None and self.rank not in dist.get_process_group_ranks(load_pg):
            return None
        target = sharded_tensor.full(load_spec, full.shape, -7, dtype=full.dtype, process_group=load_pg)
        self._load({"w": target}, path, process_group=load_pg)
        self._assert_holds(target, full, msg)
        return target

    @with_comms(init_rpc=False)
    def test_1d_placement_change(self):
        specs = {
            "rows": chunks(0, range(4)),
            "cols": chunks(1, range(4)),
            "rows_permuted": chunks(0, (3, 1, 0, 2)),
            "cols_permuted": chunks(1, (2, 0, 3, 1)),
        }
        values = {
            "arange_4x4": torch.arange(16, dtype=torch.float, device=self.device).view(4, 4),
            "int64_10x7": torch.arange(2**40, 2**40 + 70, dtype=torch.int64, device=self.device).view(10, 7),
        }
        registry = get_test_extension_registry()
        for (vname, full), (sname, save_spec) in itertools.product(values.items(), specs.items()):
            # Upstream's test also saves through a storage extension; every other save here is plain.
            extensions = [Rot13Example()] if sname == "rows_permuted" else None
            path = self._tmp_dir()
            saved = filled(full, save_spec)
            dcp.save({"w": saved}, storage_writer=dcp.FileSystemWriter(path, _extensions=extensions))
            for lname, load_spec in specs.items():
                if lname == sname:
                    continue
                msg = f"{vname}: saved as {sname}, loaded as {lname}"
                target = sharded_tensor.zeros(load_spec, *full.shape, dtype=full.dtype)
                self._load({"w": target}, path, _extension_registry=registry)
                self._assert_holds(target, full, msg)
                # Back to the saved layout: the same local shards as the tensor that was saved.
                target.reshard(save_spec)
                for mine, original in zip(target.local_shards(), saved.local_shards()):
                    self.assertEqual(mine.metadata, original.metadata, msg)
                    self.assertTrue(torch.equal(mine.tensor, original.tensor), msg)

    @with_comms(init_rpc=False)
    def test_mesh_change_to_subgroup_and_back(self):
        full = torch.arange(9 * 6, dtype=torch.float64, device=self.device).view(9, 6) / 7
        sub = dist.new_group([1, 3])
        # 4 ranks -> the 2-rank group {1, 3} (only its ranks load), by rows and by columns.
        for load_spec in (chunks(0, (3, 1)), chunks(1, (1, 3))):
            self._save_load(full, chunks(0, range(4)), load_spec, "4 ranks -> group {1, 3}", load_pg=sub)
        # The group {1, 3} saves; all 4 ranks load, into rows and into a 2 x 2 grid.
        for load_spec in (chunks(0, range(4)), grid_spec(9, 6)):
            self._save_load(full, chunks(1, (3, 1)), load_spec, "group {1, 3} -> 4 ranks", save_pg=sub)
        # A subset of the default group's ranks (0 and 2) holds the tensor; 1 and 3 hold nothing.
        subset = chunks(0, (2, 0))
        self._save_load(full, chunks(1, range(4)), subset, "4 ranks -> ranks {0, 2}")
        self._save_load(full, subset, chunks(1, (3, 2, 1, 0)), "ranks {0, 2} -> 4 ranks")
        # Round trip through the sub-group: save there, load there.
        self._save_load(full, chunks(0, (1, 3)), chunks(1, (3, 1)), "{1, 3}", save_pg=sub, load_pg=sub)

    @with_comms(init_rpc=False)
    def test_2d_grid_to_rows_and_cols(self):
        full = (torch.arange(7 * 5, device=self.device) - 17).to(torch.int32).view(7, 5)
        specs = {
            "grid": grid_spec(7, 5),
            "grid_transposed": grid_spec(7, 5, order=(0, 2, 1, 3)),
            "rows": chunks(0, range(4)),
            "cols": chunks(1, (1, 2, 3, 0)),
        }
        for (sname, save_spec), (lname, load_spec) in itertools.product(specs.items(), repeat=2):
            if sname != lname and ("grid" in sname or "grid" in lname):
                self._save_load(full, save_spec, load_spec, f"saved as {sname}, loaded as {lname}")

    @with_comms(init_rpc=False)
    def test_uneven_shards(self):
        full = torch.arange(16, dtype=torch.float, device=self.device).view(16, 1)
        saving = _rows_plan([(0, 4), (4, 3), (7, 4), (11, 5)])
        for loading in ([(0, 2), (2, 4), (6, 6), (12, 4)], [(0, 6), (6, 2), (8, 1), (9, 7)]):
            self._save_load(full, saving, _rows_plan(loading), f"uneven {loading}")
        # 14 rows in 4 + 4 + 4 + 2, loaded into a plain tensor on every rank.
        full = torch.arange(14, dtype=torch.float, device=self.device).view(14, 1)
        path = self._tmp_dir()
        dcp.save({"uneven": filled(full, chunks(0, range(4)))}, checkpoint_id=path)
        plain = {"uneven": torch.rand(14, 1).to(self.device)}
        self._load(plain, path)
        self.assertTrue(torch.equal(plain["uneven"], full))

    @with_comms(init_rpc=False)
    def test_empty_shards(self):
        # Upstream's case: one element over 4 ranks (3 empty chunks), loaded into the layout DTensor
        # gives [Shard(0), Shard(0)] on a 2 x 2 mesh (one element on rank 0, empty elsewhere).
        one = torch.rand(1, dtype=torch.float64).to(self.device)
        nested = EnumerableShardingSpec(
            [ShardMetadata([0], [1], placement(0))]
            + [ShardMetadata([1], [0], placement(r)) for r in (1, 2, 3)]
        )
        self._save_load(one, chunks(0, range(4)), nested, "1 element")
        self._save_load(one, nested, chunks(0, (3, 2, 1, 0)), "1 element, back")

        # 7 x 5 by columns over 4 ranks: the last chunk is empty and starts past the end (offset 6).
        full = torch.arange(35, dtype=torch.int64, device=self.device).view(7, 5) * 3
        path = self._tmp_dir()
        dcp.save({"w": filled(full, chunks(1, range(4)))}, checkpoint_id=path)
        self._assert_metadata_in_bounds(path, "w", [7, 5])
        target = sharded_tensor.zeros(grid_spec(7, 5), 7, 5, dtype=torch.int64)
        self._load({"w": target}, path)
        self._assert_holds(target, full, "trailing empty chunk")
        # ... and loaded into a layout with trailing empty chunks (3 rows over 4 ranks, 6 over 4).
        self._save_load(full, grid_spec(7, 5), chunks(1, (3, 2, 1, 0)), "load into empty chunks")
        short = full[:3]
        self._save_load(short, chunks(1, range(4)), chunks(0, range(4)), "empty chunks both sides")

        # Empty shards anywhere: inside another shard's range, past the end in every dim, several on
        # one rank (two with the same box).
        anywhere = EnumerableShardingSpec(
            [
                ShardMetadata([0, 0], [4, 5], placement(0)),
                ShardMetadata([4, 0], [3, 5], placement(1)),
                ShardMetadata([2, 0], [0, 5], placement(2)),
                ShardMetadata([1, 3], [6, 0], placement(2)),
                ShardMetadata([9, 8], [0, 0], placement(3)),
                ShardMetadata([9, 8], [0, 0], placement(3)),
            ]
        )
        path = self._tmp_dir()
        dcp.save({"w": filled(full, anywhere)}, checkpoint_id=path)
        self._assert_metadata_in_bounds(path, "w", [7, 5])
        for load_spec in (chunks(0, range(4)), anywhere):
            target = sharded_tensor.zeros(load_spec, 7, 5, dtype=torch.int64)
            self._load({"w": target}, path)
            self._assert_holds(target, full, "empty shards anywhere")

        # No elements at all: one chunk records the tensor; loads into sharded and plain tensors.
        for size, dim in (((0, 5), 0), ((4, 0), 1), ((0, 0), 0)):
            empty = torch.zeros(size, dtype=torch.bfloat16, device=self.device)
            path = self._tmp_dir()
            dcp.save({"e": filled(empty, chunks(dim, range(4)))}, checkpoint_id=path)
            self._assert_metadata_in_bounds(path, "e", list(size))
            target = sharded_tensor.zeros(chunks(1 - dim, (2, 3)), *size, dtype=torch.bfloat16)
            self._load({"e": target}, path)
            self._assert_holds(target, empty, f"{size}")
            plain = {"e": torch.ones(size, dtype=torch.bfloat16, device=self.device)}
            self._load(plain, path)
            self.assertEqual(plain["e"].shape, torch.Size(size))

    @with_comms(init_rpc=False)
    def test_checkpointable_api(self):
        # Upstream's plans: 16 x 1, saved in uneven row blocks, loaded in other uneven row blocks.
        full = torch.arange(16, dtype=torch.float, device=self.device).view(16, 1)
        saving = _rows_plan([(0, 4), (4, 3), (7, 4), (11, 5)])
        loading = _rows_plan([(0, 2), (2, 4), (6, 6), (12, 4)])
        path = self._tmp_dir()
        saved = CheckpointableShardedTensor(filled(full, saving))
        dcp.save({"checkpointable_tensor": saved}, checkpoint_id=path)
        target = sharded_tensor.full(loading, (16, 1), -1.0)
        self._load({"checkpointable_tensor": CheckpointableShardedTensor(target)}, path)
        self._assert_holds(target, full, "wrapper -> wrapper")
        # The wrapper's checkpoint loads into a bare ShardedTensor, and a bare one's into a wrapper.
        bare = sharded_tensor.zeros(chunks(1, (0,)), 16, 1)
        self._load({"checkpointable_tensor": bare}, path)
        self._assert_holds(bare, full, "wrapper -> ShardedTensor")
        path = self._tmp_dir()
        dcp.save({"t": filled(full, chunks(0, (3, 1, 2, 0)))}, checkpoint_id=path)
        target = sharded_tensor.zeros(loading, 16, 1)
        self._load({"t": CheckpointableShardedTensor(target)}, path)
        self._assert_holds(target, full, "ShardedTensor -> wrapper")
        # Empty shards behave the same through the wrapper.
        nested = EnumerableShardingSpec(
            [ShardMetadata([0, 0], [16, 1], placement(2))]
            + [ShardMetadata([16, 0], [0, 1], placement(r)) for r in (0, 1, 3)]
        )
        target = sharded_tensor.zeros(nested, 16, 1)
        self._load({"t": CheckpointableShardedTensor(target)}, path)
        self._assert_holds(target, full, "ShardedTensor -> wrapper with empty shards")


def _linear(seed: int, device: torch.device) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(12, 10).to(device)


def _upstream_grid(rows: int, cols: int):
    spec = grid_spec(rows, cols)
    return UpEnumerableShardingSpec(
        [UpShardMetadata(m.shard_offsets, m.shard_sizes, str(m.placement)) for m in spec.shards]
    )


class TestCrossLibraryCheckpoints(ShardedTensorTestBase):
    reader_cls = dcp.FileSystemReader
    _load = TestCheckpointScenarios._load
    _tmp_dir = TestCheckpointScenarios._tmp_dir
    _assert_holds = TestCheckpointScenarios._assert_holds

    def _assert_upstream_holds(self, st, full, msg):
        for shard in st.local_shards():
            self.assertEqual(shard.tensor.dtype, full.dtype, msg)
            self.assertTrue(torch.equal(shard.tensor, box_slice(full, shard.metadata)), msg)

    @with_comms(init_rpc=False)
    def test_dtensor_and_torch_shard(self):
        full = torch.arange(7 * 5, dtype=torch.float64, device=self.device).view(7, 5) / 3
        mesh1 = init_device_mesh(self.device_type, (4,))
        mesh2 = init_device_mesh(self.device_type, (2, 2))
        dtensor_layouts = [
            (mesh1, [DShard(0)]),
            (mesh1, [DShard(1)]),  # 2 + 2 + 1 + 0 columns: DTensor saves an empty chunk
            (mesh1, [Replicate()]),
            (mesh2, [DShard(0), DShard(1)]),
            (mesh2, [Replicate(), DShard(0)]),
            (mesh2, [DShard(1), DShard(1)]),
        ]
        ours = {
            "rows_permuted": chunks(0, (2, 0, 3, 1)),
            "cols": chunks(1, range(4)),  # trailing empty chunk past the end
            "grid": grid_spec(7, 5),
        }
        for mesh, placements in dtensor_layouts:
            # DTensor saves, torch_shard loads.
            path = self._tmp_dir()
            dcp.save({"w": distribute_tensor(full, mesh, placements)}, checkpoint_id=path)
            for name, spec in ours.items():
                msg = f"DTensor {placements} -> torch_shard {name}"
                target = sharded_tensor.zeros(spec, 7, 5, dtype=torch.float64)
                self._load({"w": target}, path)
                self._assert_holds(target, full, msg)
            # torch_shard saves, DTensor loads.
            for name, spec in ours.items():
                msg = f"torch_shard {name} -> DTensor {placements}"
                path = self._tmp_dir()
                dcp.save({"w": filled(full, spec)}, checkpoint_id=path)
                target = dtensor_zeros([7, 5], dtype=torch.float64, device_mesh=mesh, placements=placements)
                self._load({"w": target}, path)
                self.assertTrue(torch.equal(full_tensor(target), full), msg)
                self.assertEqual(target.dtype, torch.float64, msg)

    @with_comms(init_rpc=False)
    def test_upstream_and_torch_shard(self):
        full = torch.arange(7 * 5, dtype=torch.int64, device=self.device).view(7, 5) + 2**40
        theirs = {
            "rows_permuted": UpChunkShardingSpec(dim=0, placements=[placement(r) for r in (3, 1, 0, 2)]),
            "grid": _upstream_grid(7, 5),
        }
        ours = {
            "rows": chunks(0, range(4)),
            "cols": chunks(1, (1, 0, 3, 2)),  # trailing empty chunk past the end
            "grid_transposed": grid_spec(7, 5, order=(0, 2, 1, 3)),
        }
        for up_name, up_spec in theirs.items():
            # Upstream saves, torch_shard loads.
            path = self._tmp_dir()
            saved = up_sharded_tensor.empty(up_spec, 7, 5, dtype=torch.int64)
            for shard in saved.local_shards():
                shard.tensor.copy_(box_slice(full, shard.metadata))
            dcp.save({"w": saved}, checkpoint_id=path)
            for name, spec in ours.items():
                target = sharded_tensor.zeros(spec, 7, 5, dtype=torch.int64)
                self._load({"w": target}, path)
                self._assert_holds(target, full, f"upstream {up_name} -> torch_shard {name}")
            # torch_shard saves, upstream loads.
            for name, spec in ours.items():
                path = self._tmp_dir()
                dcp.save({"w": filled(full, spec)}, checkpoint_id=path)
                target = up_sharded_tensor.zeros(up_spec, 7, 5, dtype=torch.int64)
                self._load({"w": target}, path)
                self._assert_upstream_holds(target, full, f"torch_shard {name} -> upstream {up_name}")

    @with_comms(init_rpc=False)
    def test_module_state_dicts(self):
        """A model's state_dict with a sharded weight and a plain bias, saved by one library and loaded
        by another into a differently initialised model."""
        reference = _linear(1, self.device)
        weight, bias = reference.weight.detach(), reference.bias.detach()
        mesh = init_device_mesh(self.device_type, (4,))

        def ours(seed, spec):
            model = _linear(seed, self.device)
            if isinstance(spec, ChunkShardingSpec):
                shard_parameter(model, "weight", spec)
            else:  # scatter by rows, then move to the enumerable layout
                shard_parameter(model, "weight", chunks(0, range(4)))
                model.weight.reshard(spec)
            return model

        def upstream(seed, spec):
            model = _linear(seed, self.device)
            up_shard_parameter(model, "weight", spec)
            return model

        def dtensor(seed, placements):
            model = _linear(seed, self.device)
            model.weight = nn.Parameter(distribute_tensor(model.weight.detach(), mesh, placements))
            model.bias = nn.Parameter(distribute_tensor(model.bias.detach(), mesh, [Replicate()]))
            return model

        def check(model, msg):
            state = model.state_dict()
            w = state["weight"]
            if isinstance(w, DTensor):
                self.assertTrue(torch.equal(full_tensor(w), weight), msg)
                self.assertTrue(torch.equal(full_tensor(state["bias"]), bias), msg)
                return
            for shard in w.local_shards():
                self.assertTrue(torch.equal(shard.tensor, box_slice(weight, shard.metadata)), msg)
            self.assertTrue(torch.equal(state["bias"], bias), msg)

        up_rows = UpChunkShardingSpec(dim=0, placements=[placement(r) for r in range(4)])
        pairs = [
            ("torch_shard -> DTensor", ours(1, chunks(0, (3, 2, 1, 0))), dtensor(2, [DShard(1)])),
            ("DTensor -> torch_shard", dtensor(1, [DShard(0)]), ours(2, grid_spec(10, 12))),
            ("torch_shard -> upstream", ours(1, grid_spec(10, 12)), upstream(2, up_rows)),
            ("upstream -> torch_shard", upstream(1, up_rows), ours(2, chunks(1, (1, 3, 0, 2)))),
        ]
        for msg, source, target in pairs:
            check(source, f"{msg}: source")
            path = self._tmp_dir()
            dcp.save(source.state_dict(), checkpoint_id=path)
            state = target.state_dict()
            self._load(state, path)
            check(target, msg)


class TestCheckpointScenariosByteRange(TestCheckpointScenarios):
    reader_cls = ByteRangeFileSystemReader


class TestCrossLibraryCheckpointsByteRange(TestCrossLibraryCheckpoints):
    reader_cls = ByteRangeFileSystemReader


# The same scenarios read once across the ranks (every saved chunk read by one rank, handed to the
# others through the exchange): sub-groups, empty shards, DTensor and upstream layouts.
_read_once_reader = functools.partial(ByteRangeFileSystemReader, read_once=True)


class TestCheckpointScenariosReadOnce(TestCheckpointScenarios):
    reader_cls = _read_once_reader


class TestCrossLibraryCheckpointsReadOnce(TestCrossLibraryCheckpoints):
    reader_cls = _read_once_reader


def _bytes_read_by_this_process() -> int:
    """Bytes this process has read through read()-family system calls (``rchar``)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


class TestByteRangeReader(ShardedTensorTestBase):
    _tmp_dir = TestCheckpointScenarios._tmp_dir

    def _load_counting(self, reader_cls, path, spec, full, **reader_kwargs):
        target = sharded_tensor.zeros(spec, *full.shape, dtype=full.dtype)
        dist.barrier()
        before = _bytes_read_by_this_process()
        dcp.load({"w": target, "step": 0}, storage_reader=reader_cls(path, **reader_kwargs))
        read = _bytes_read_by_this_process() - before
        for shard in target.local_shards():
            self.assertTrue(torch.equal(shard.tensor, box_slice(full, shard.metadata)))
        return read

    @with_comms(init_rpc=False)
    def test_reads_only_the_needed_bytes(self):
        torch.manual_seed(0)
        full = torch.rand(512, 512).to(self.device)
        nbytes = full.numel() * full.element_size()
        path = self._tmp_dir()
        dcp.save({"w": filled(full, chunks(0, range(4))), "step": 3}, checkpoint_id=path)
        cols = chunks(1, range(4))
        unchecked = {"verify": False}
        # Warm-up (lazy imports); checked loads warn below, once per checkpoint.
        self._load_counting(dcp.FileSystemReader, path, cols, full)
        self._load_counting(ByteRangeFileSystemReader, path, cols, full, **unchecked)
        # Rows saved, columns loaded: DCP's reader reads all four saved chunks whole, the byte-range
        # reader one quarter of each (plus each archive's header and the metadata exchange).
        whole = self._load_counting(dcp.FileSystemReader, path, cols, full)
        ranged = self._load_counting(ByteRangeFileSystemReader, path, cols, full, **unchecked)
        self.assertGreaterEqual(whole, nbytes)
        self.assertGreaterEqual(ranged, nbytes // 4)
        self.assertLess(ranged, nbytes // 4 + 64 * 1024)
        # Checked, a plain DCP checkpoint's chunks are read whole (their CRC-32 covers whole records),
        # and the reader says so, once per checkpoint, naming the writer that avoids it.
        with self.assertWarnsRegex(UserWarning, "ChecksumFileSystemWriter") as warned:
            checked = self._load_counting(ByteRangeFileSystemReader, path, cols, full)
        self.assertIn(path, str(warned.warning))
        self.assertGreaterEqual(checked, nbytes)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            self._load_counting(ByteRangeFileSystemReader, path, cols, full)
        # Rows into the same rows: both read one chunk, checked or not; a checked load reads a chunk of
        # 32 MiB and more twice, to check it and then into the destination (NOTE [ Whole chunks are
        # checked, then read again into the destination ]: the second read from the page cache).
        rows = chunks(0, range(4))
        for kwargs in (unchecked, {}):
            same_layout = self._load_counting(ByteRangeFileSystemReader, path, rows, full, **kwargs)
            self.assertGreaterEqual(same_layout, nbytes // 4)
            self.assertLess(same_layout, nbytes // 4 + 64 * 1024)
        with mock.patch.object(read_chunk, "_READ_TWICE_FROM", 0):
            twice = self._load_counting(ByteRangeFileSystemReader, path, rows, full)
        self.assertGreaterEqual(twice, 2 * (nbytes // 4))
        self.assertLess(twice, 2 * (nbytes // 4) + 64 * 1024)
        # With block checksums (ChecksumFileSystemWriter) a checked load reads whole tiles of a
        # sixteenth of a row: a 512-column float32 quarter is 4 of the 128-byte tiles of each 2 KiB
        # row, so it reads exactly what the unchecked load reads, no warning.
        path = self._tmp_dir()
        dcp.save({"w": filled(full, chunks(0, range(4))), "step": 3}, storage_writer=ChecksumFileSystemWriter(path))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            tiled = self._load_counting(ByteRangeFileSystemReader, path, cols, full)
        self.assertGreaterEqual(tiled, nbytes // 4)
        self.assertLess(tiled, nbytes // 4 + 64 * 1024)

    @with_comms(init_rpc=False)
    def test_falls_back_for_transformed_and_byte_items(self):
        full = torch.arange(64 * 8, dtype=torch.int64, device=self.device).view(64, 8)
        path = self._tmp_dir()
        writer = dcp.FileSystemWriter(path, _extensions=[Rot13Example()])
        dcp.save({"w": filled(full, chunks(0, range(4))), "note": {"epoch": 5}}, storage_writer=writer)
        target = sharded_tensor.zeros(chunks(1, (3, 2, 1, 0)), 64, 8, dtype=torch.int64)
        state = {"w": target, "note": {"epoch": 0}}
        reader = ByteRangeFileSystemReader(path, _extension_registry=get_test_extension_registry())
        dcp.load(state, storage_reader=reader)
        for shard in target.local_shards():
            self.assertTrue(torch.equal(shard.tensor, box_slice(full, shard.metadata)))
        self.assertEqual(state["note"], {"epoch": 5})

    @with_comms(init_rpc=False)
    def test_converts_dtypes_like_dcp(self):
        # DCP's reader copies saved values into the loading tensor's dtype; so does this one.
        full = torch.arange(16.0, device=self.device).view(4, 4) / 3
        path = self._tmp_dir()
        dcp.save({"w": filled(full, chunks(0, range(4)))}, checkpoint_id=path)
        for reader_cls in (dcp.FileSystemReader, ByteRangeFileSystemReader):
            target = sharded_tensor.zeros(chunks(1, range(4)), 4, 4, dtype=torch.float64)
            dcp.load({"w": target}, storage_reader=reader_cls(path))
            for shard in target.local_shards():
                expected = box_slice(full, shard.metadata).double()
                self.assertTrue(torch.equal(shard.tensor, expected), reader_cls)

if __name__ == "__main__":
    run_tests()
