"""torch_shard.interop: ShardedTensor <-> DTensor and torch_shard <-> upstream ShardedTensor.

Zero-copy cases are checked with ``data_ptr`` (or object identity) equality, values and dtypes
exactly, on uneven sizes and with empty shards. ``torch_shard.compat`` is never installed here; its
effect on from_upstream / to_upstream is simulated by pointing the upstream lookup at torch_shard.
"""

from unittest import mock

import torch
import torch.distributed as dist
from _shared import box_slice, chunks, filled, grid_spec
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
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor
from torch.distributed.tensor import Shard as DShard
from torch.distributed.tensor._shards_wrapper import LocalShardsWrapper
from torch.distributed.tensor.placement_types import _StridedShard

import torch_shard
from torch_shard import interop
from torch_shard.interop import from_dtensor, from_upstream, to_dtensor, to_upstream
from torch_shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
from torch_shard.testing import ShardedTensorTestBase, full_tensor, placement, run_tests, with_comms


def _layout(st):
    return [
        (list(m.shard_offsets), list(m.shard_sizes), str(m.placement)) for m in st.metadata().shards_metadata
    ]


def _nonempty(st):
    return [s for s in st.local_shards() if s.tensor.numel() > 0]


class TestToDTensor(ShardedTensorTestBase):
    def _assert_dtensor(self, dt, full, placements, msg=""):
        self.assertIsInstance(dt, DTensor)
        self.assertEqual(list(dt.placements), list(placements), msg)
        self.assertEqual(dt.shape, full.shape, msg)
        self.assertEqual(dt.dtype, full.dtype, msg)
        self.assertTrue(torch.equal(full_tensor(dt), full), msg)
        # The local tensor is exactly what DTensor itself would hold for this layout.
        expected = distribute_tensor(full, dt.device_mesh, placements)
        self.assertTrue(torch.equal(dt.to_local(), expected.to_local()), msg)

    @with_comms(init_rpc=False)
    def test_zero_copy_1d(self):
        mesh = init_device_mesh(self.device_type, (4,))
        cases = [
            (torch.arange(70, dtype=torch.float32).view(7, 10), 0),  # uneven: 2 + 2 + 2 + 1 rows
            (torch.arange(70, dtype=torch.int64).view(7, 10) + 2**40, 1),  # 3 + 3 + 3 + 1 columns
            (torch.arange(15, dtype=torch.float64).view(3, 5), 0),  # rank 3's chunk is empty (offset 3)
            (torch.arange(15, dtype=torch.bfloat16).view(5, 3), 1),  # ranks 2 and 3 empty, past the end
        ]
        for full, dim in cases:
            full = full.to(self.device)
            msg = f"{list(full.shape)} {full.dtype} dim {dim}"
            st = filled(full, chunks(dim, range(4)))
            shards_before = [s.tensor for s in st.local_shards()]
            dt = to_dtensor(st, mesh, [DShard(dim)])
            self._assert_dtensor(dt, full, [DShard(dim)], msg)
            (shard,) = st.local_shards()
            if shard.tensor.numel() > 0:
                self.assertEqual(dt.to_local().data_ptr(), shard.tensor.data_ptr(), msg)
            self.assertEqual(dt.to_local().shape, shard.tensor.shape, msg)
            # In-place updates through the DTensor land in the ShardedTensor.
            with torch.no_grad():
                dt.to_local().fill_(3)
            self.assertTrue(all(s.tensor is t for s, t in zip(st.local_shards(), shards_before)), msg)
            self.assertTrue(torch.all(shard.tensor == 3), msg)

    @with_comms(init_rpc=False)
    def test_zero_copy_2d(self):
        mesh = init_device_mesh(self.device_type, (2, 2))
        full = torch.arange(7 * 5, dtype=torch.float32, device=self.device).view(7, 5)
        cases = [
            (grid_spec(7, 5), [DShard(0), DShard(1)]),
            (grid_spec(7, 5, order=(0, 2, 1, 3)), [DShard(1), DShard(0)]),
            # A nested split of one dim is 4 chunks when the sizes line up (7 -> 4 + 3 -> 2 + 2 + 2 + 1;
            # not in general: 5 -> 3 + 2 -> 2 + 1 + 1 + 1 where torch.chunk gives 2 + 2 + 1 + 0).
            (chunks(0, range(4)), [DShard(0), DShard(0)]),
        ]
        # ... with an empty trailing chunk: 3 columns -> 2 + 1 -> 1 + 1 + 1 + 0.
        narrow = full[:, :3].contiguous()
        cases = [(*case, full) for case in cases] + [(chunks(1, range(4)), [DShard(1), DShard(1)], narrow)]
        for spec, placements, values in cases:
            msg = f"{spec} as {placements}"
            full = values
            st = filled(full, spec)
            dt = to_dtensor(st, mesh, placements)
            self._assert_dtensor(dt, full, placements, msg)
            for shard in _nonempty(st):
                self.assertEqual(dt.to_local().data_ptr(), shard.tensor.data_ptr(), msg)

    @with_comms(init_rpc=False)
    def test_reshards_a_copy_not_the_input(self):
        full = torch.arange(9 * 6, dtype=torch.int32, device=self.device).view(9, 6)
        mesh1 = init_device_mesh(self.device_type, (4,))
        mesh2 = init_device_mesh(self.device_type, (2, 2))
        cases = [
            (chunks(0, (3, 1, 0, 2)), mesh1, [DShard(0)]),  # permuted placements
            (chunks(0, range(4)), mesh1, [DShard(1)]),  # rows -> columns
            (grid_spec(9, 6), mesh1, [DShard(0)]),
            (chunks(0, range(4)), mesh2, [DShard(0), DShard(1)]),
            (chunks(1, (2, 3)), mesh2, [DShard(1), DShard(0)]),  # two ranks hold nothing
            (chunks(0, range(4)), mesh1, [Replicate()]),
            (grid_spec(9, 6), mesh2, [DShard(0), Replicate()]),
            (chunks(1, range(4)), mesh2, [Replicate(), Replicate()]),
        ]
        for spec, mesh, placements in cases:
            msg = f"{spec} -> {placements}"
            st = filled(full, spec)
            layout, local = _layout(st), [(s.tensor, s.tensor.clone()) for s in st.local_shards()]
            dt = to_dtensor(st, mesh, placements)
            self._assert_dtensor(dt, full, placements, msg)
            # st is untouched: same layout, spec, shard objects and values.
            self.assertEqual(_layout(st), layout, msg)
            self.assertIs(st.sharding_spec(), spec, msg)
            for shard, (tensor, copy) in zip(st.local_shards(), local):
                self.assertIs(shard.tensor, tensor, msg)
                self.assertTrue(torch.equal(tensor, copy), msg)

    @with_comms(init_rpc=False)
    def test_sub_group_mesh(self):
        sub = dist.new_group([1, 3])
        if self.rank not in (1, 3):
            return
        mesh = DeviceMesh.from_group(sub, self.device_type)
        full = torch.arange(5 * 4, dtype=torch.float64, device=self.device).view(5, 4)
        for ranks, zero_copy in (((1, 3), True), ((3, 1), False)):
            st = filled(full, chunks(0, ranks), process_group=sub)
            dt = to_dtensor(st, mesh, [DShard(0)])
            self._assert_dtensor(dt, full, [DShard(0)], f"{ranks}")
            shard_ptr = st.local_shards()[0].tensor.data_ptr()
            self.assertEqual(dt.to_local().data_ptr() == shard_ptr, zero_copy, f"{ranks}")

    @with_comms(init_rpc=False)
    def test_errors(self):
        mesh = init_device_mesh(self.device_type, (4,))
        st = filled(torch.arange(8.0, device=self.device).view(4, 2), chunks(0, range(4)))
        with self.assertRaisesRegex(TypeError, "expected a torch_shard ShardedTensor"):
            to_dtensor(torch.ones(4, 2, device=self.device), mesh, [DShard(0)])
        with self.assertRaisesRegex(ValueError, r"one placement per mesh dim \(1\), but got 2"):
            to_dtensor(st, mesh, [DShard(0), DShard(1)])
        with self.assertRaisesRegex(IndexError, r"Shard\(dim=2\) on mesh dim 0 is out of range for a 2-D"):
            to_dtensor(st, mesh, [DShard(2)])
        with self.assertRaisesRegex(ValueError, "Partial DTensor holds unreduced values"):
            to_dtensor(st, mesh, [Partial()])
        with self.assertRaisesRegex(NotImplementedError, "strided shards interleave"):
            to_dtensor(st, mesh, [_StridedShard(0, split_factor=2)])
        # Negative dims count from the end, as in DTensor.
        dt = to_dtensor(st, mesh, [DShard(-2)])
        self.assertEqual(dt.to_local().data_ptr(), st.local_shards()[0].tensor.data_ptr())


class TestFromDTensor(ShardedTensorTestBase):
    def _assert_sharded(self, st, full, msg=""):
        """Every element of ``full`` is in exactly one shard, each local shard holds its box."""
        self.assertEqual(st.size(), full.shape, msg)
        self.assertEqual(st.dtype, full.dtype, msg)
        total = sum(s.shard_sizes[0] * s.shard_sizes[1] for s in st.metadata().shards_metadata)
        self.assertEqual(total, full.numel(), msg)
        for shard in st.local_shards():
            self.assertEqual(shard.tensor.dtype, full.dtype, msg)
            self.assertTrue(torch.equal(shard.tensor, box_slice(full, shard.metadata)), msg)
        out = torch.zeros_like(full) if self.rank == 0 else None
        st.gather(0, out)
        if self.rank == 0:
            self.assertTrue(torch.equal(out, full), msg)

    @with_comms(init_rpc=False)
    def test_1d_mesh(self):
        mesh = init_device_mesh(self.device_type, (4,))
        cases = [
            (torch.arange(70, dtype=torch.float32).view(7, 10), [DShard(0)]),
            (torch.arange(70, dtype=torch.int64).view(7, 10) - 2**50, [DShard(1)]),
            (torch.arange(15, dtype=torch.float16).view(3, 5), [DShard(0)]),  # an empty shard
            (torch.arange(6, dtype=torch.float32).view(1, 6), [DShard(0)]),  # three empty shards
            (torch.arange(12, dtype=torch.float32).view(3, 4), [Replicate()]),
        ]
        for full, placements in cases:
            full = full.to(self.device)
            msg = f"{list(full.shape)} {placements}"
            dt = distribute_tensor(full, mesh, placements)
            st = from_dtensor(dt)
            self._assert_sharded(st, full, msg)
            if placements[0].is_shard():
                dim = placements[0].dim
                self.assertEqual(st.sharding_spec(), chunks(dim, range(4)), msg)
                (shard,) = st.local_shards()
                self.assertIs(shard.tensor, dt._local_tensor, msg)
                if shard.tensor.numel() > 0:
                    self.assertEqual(shard.tensor.data_ptr(), dt.to_local().data_ptr(), msg)
            else:
                # Replicate: mesh coordinate 0 keeps the tensor, the others hold nothing.
                self.assertEqual(_layout(st), [([0, 0], [3, 4], placement(0))], msg)
                self.assertEqual(len(st.local_shards()), 1 if self.rank == 0 else 0, msg)
                if self.rank == 0:
                    self.assertEqual(st.local_shards()[0].tensor.data_ptr(), dt.to_local().data_ptr(), msg)

    @with_comms(init_rpc=False)
    def test_2d_mesh(self):
        mesh = init_device_mesh(self.device_type, (2, 2))
        full = torch.arange(7 * 5, dtype=torch.float64, device=self.device).view(7, 5)
        coordinate = mesh.get_coordinate()
        placements_list = [
            [DShard(0), DShard(1)],
            [DShard(1), DShard(0)],
            [DShard(0), DShard(0)],
            [DShard(1), DShard(1)],
            [Replicate(), DShard(0)],
            [DShard(1), Replicate()],
            [Replicate(), Replicate()],
        ]
        for placements in placements_list:
            msg = f"{placements}"
            dt = distribute_tensor(full, mesh, placements)
            st = from_dtensor(dt)
            self._assert_sharded(st, full, msg)
            keeps = all(c == 0 for c, p in zip(coordinate, placements) if p.is_replicate())
            self.assertEqual(len(st.local_shards()), 1 if keeps else 0, msg)
            if keeps:
                self.assertIs(st.local_shards()[0].tensor, dt._local_tensor, msg)
                # The box is the one DTensor computes for this rank.
                local = dt.to_local()
                if local.numel() > 0:
                    self.assertEqual(st.local_shards()[0].tensor.data_ptr(), local.data_ptr(), msg)

    @with_comms(init_rpc=False)
    def test_uneven_from_local(self):
        # Upstream's uneven DTensor: 14 rows as 4 + 4 + 4 + 2.
        mesh = init_device_mesh(self.device_type, (4,))
        rows = 2 if self.rank == 3 else 4
        local = torch.arange(self.rank * 4, self.rank * 4 + rows, dtype=torch.float32, device=self.device).view(rows, 1)
        dt = DTensor.from_local(local, mesh, [DShard(0)], shape=torch.Size([14, 1]), stride=(1, 1))
        st = from_dtensor(dt, run_check=True)
        self._assert_sharded(st, torch.arange(14, dtype=torch.float32, device=self.device).view(14, 1))
        self.assertIs(st.local_shards()[0].tensor, dt._local_tensor)
        self.assertEqual(st.local_shards()[0].tensor.data_ptr(), local.data_ptr())

    @with_comms(init_rpc=False)
    def test_non_contiguous_local_is_copied(self):
        mesh = init_device_mesh(self.device_type, (4,))
        local = torch.arange(8, dtype=torch.float32, device=self.device).view(2, 4).t() + 10 * self.rank  # 4 x 2, strided
        dt = DTensor.from_local(local, mesh, [DShard(0)], shape=torch.Size([16, 2]), stride=(2, 1))
        st = from_dtensor(dt)
        (shard,) = st.local_shards()
        self.assertTrue(shard.tensor.is_contiguous())
        self.assertTrue(torch.equal(shard.tensor, local))

    @with_comms(init_rpc=False)
    def test_local_shards_wrapper(self):
        # Upstream's LocalShardsWrapper plan: uneven row blocks at arbitrary offsets.
        plan = [(0, 4), (4, 3), (7, 4), (11, 5)]
        offset, length = plan[self.rank]
        local = torch.arange(offset, offset + length, dtype=torch.float32, device=self.device).view(length, 1)
        wrapper = LocalShardsWrapper(local_shards=[local], local_offsets=[(offset, 0)])
        mesh = init_device_mesh(self.device_type, (4,))
        dt = DTensor.from_local(wrapper, mesh, [DShard(0)], shape=torch.Size([16, 1]), stride=(1, 1))
        st = from_dtensor(dt)
        self._assert_sharded(st, torch.arange(16, dtype=torch.float32, device=self.device).view(16, 1))
        # from_local wraps a view of the wrapper; its shards are views of ``local``.
        self.assertIs(st.local_shards()[0].tensor, dt._local_tensor.local_shards()[0])
        self.assertEqual(st.local_shards()[0].tensor.data_ptr(), local.data_ptr())
        self.assertEqual(_layout(st), [([o, 0], [n, 1], placement(r)) for r, (o, n) in enumerate(plan)])

    @with_comms(init_rpc=False)
    def test_n_d_mesh_over_a_subset_needs_a_group(self):
        mesh = DeviceMesh(self.device_type, [[0, 1], [2, 3]])
        dt = distribute_tensor(torch.arange(16.0, device=self.device).view(4, 4), mesh, [DShard(0), DShard(1)])
        st = from_dtensor(dt, process_group=dist.group.WORLD)
        self.assertEqual(st.local_shards()[0].tensor.data_ptr(), dt.to_local().data_ptr())
        sub = dist.new_group([0, 2])
        if self.rank in (0, 2):
            mesh = DeviceMesh(self.device_type, [[0], [2]])
            dt = distribute_tensor(torch.arange(16.0, device=self.device).view(4, 4), mesh, [DShard(0), DShard(1)])
            with self.assertRaisesRegex(ValueError, r"2-D mesh over ranks \[0, 2\] needs process_group="):
                from_dtensor(dt)
            st = from_dtensor(dt, process_group=sub)
            self.assertEqual(_layout(st), [([0, 0], [2, 4], placement(0)), ([2, 0], [2, 4], placement(2))])
            self.assertIs(st.local_shards()[0].tensor, dt._local_tensor)

    @with_comms(init_rpc=False)
    def test_errors(self):
        mesh = init_device_mesh(self.device_type, (4,))
        with self.assertRaisesRegex(TypeError, "expected a DTensor"):
            from_dtensor(torch.ones(2))
        partial = DTensor.from_local(torch.ones(2, 2, device=self.device), mesh, [Partial()])
        with self.assertRaisesRegex(ValueError, r"expected Shard or Replicate placements, but got P\(sum\)"):
            from_dtensor(partial)
        strided = DTensor.from_local(
            torch.ones(2, 2, device=self.device), mesh, [_StridedShard(0, split_factor=2)], shape=(8, 2), stride=(2, 1)
        )
        with self.assertRaisesRegex(NotImplementedError, "strided shards"):
            from_dtensor(strided)
        # Rank 2's local tensor does not match its box: with run_check every rank raises.
        rows = 3 if self.rank == 2 else 2
        bad = DTensor.from_local(torch.ones(rows, 2, device=self.device), mesh, [DShard(0)], shape=(8, 2), stride=(2, 1))
        if self.rank == 2:
            with self.assertRaisesRegex(ValueError, r"expected a local tensor of size \[2, 2\] on rank 2"):
                from_dtensor(bad, run_check=True)
        else:
            with self.assertRaisesRegex(ValueError, "rank 2 of the process group rejected its arguments"):
                from_dtensor(bad, run_check=True)
        # Without run_check only rank 2 raises; the others get their (valid) shards.
        if self.rank == 2:
            with self.assertRaisesRegex(ValueError, "expected a local tensor of size"):
                from_dtensor(bad)
        else:
            self.assertEqual(from_dtensor(bad).local_shards()[0].tensor.shape, torch.Size([2, 2]))
        # The group still works.
        dist.barrier()

    @with_comms(init_rpc=False)
    def test_round_trips(self):
        mesh = init_device_mesh(self.device_type, (2, 2))
        full = torch.arange(6 * 9, dtype=torch.int64, device=self.device).view(6, 9)
        dt = distribute_tensor(full, mesh, [DShard(1), DShard(0)])
        st = from_dtensor(dt)
        back = to_dtensor(st, mesh, [DShard(1), DShard(0)])
        self.assertEqual(back.to_local().data_ptr(), dt.to_local().data_ptr())
        st2 = from_dtensor(back)
        self.assertEqual(_layout(st2), _layout(st))
        self.assertEqual(st2.local_shards()[0].tensor.data_ptr(), st.local_shards()[0].tensor.data_ptr())
        # The C++ impl holds the same memory as the Python view of the shards.
        (impl_shard,) = torch.ops.torch_shard._local_shards(st2)
        self.assertEqual(impl_shard.data_ptr(), dt.to_local().data_ptr())
        # One storage under all four objects.
        st2.local_shards()[0].tensor.add_(1)
        self.assertTrue(torch.equal(full_tensor(dt), full + 1))


class TestUpstream(ShardedTensorTestBase):
    def _assert_same(self, ours, theirs, msg=""):
        self.assertEqual(len(ours.local_shards()), len(theirs.local_shards()), msg)
        for a, b in zip(ours.local_shards(), theirs.local_shards()):
            self.assertIs(a.tensor, b.tensor, msg)
            self.assertEqual(list(a.metadata.shard_sizes), list(b.metadata.shard_sizes), msg)
        self.assertEqual(ours.size(), theirs.size(), msg)
        ours_props, theirs_props = ours.metadata().tensor_properties, theirs.metadata().tensor_properties
        for field in ("dtype", "layout", "requires_grad", "memory_format", "pin_memory"):
            self.assertEqual(getattr(ours_props, field), getattr(theirs_props, field), msg)
        self.assertIs(ours._process_group, theirs._process_group, msg)

    def _gathered(self, st, full):
        out = torch.zeros_like(full) if self.rank == 0 else None
        st.gather(0, out)
        return out

    @with_comms(init_rpc=False)
    def test_from_upstream(self):
        up_rows = UpChunkShardingSpec(dim=0, placements=[placement(r) for r in (2, 0, 3, 1)])
        up_grid = UpEnumerableShardingSpec(
            [
                UpShardMetadata([0, 0], [4, 3], placement(0)),
                UpShardMetadata([0, 3], [4, 2], placement(1)),
                UpShardMetadata([4, 0], [3, 3], placement(2)),
                UpShardMetadata([4, 3], [3, 2], placement(3)),
            ]
        )
        full = torch.arange(35, dtype=torch.float32, device=self.device).view(7, 5)
        for up_spec in (up_rows, up_grid):
            msg = type(up_spec).__name__
            theirs = up_sharded_tensor.empty(up_spec, 7, 5)
            for shard in theirs.local_shards():
                shard.tensor.copy_(box_slice(full, shard.metadata))
            ours = from_upstream(theirs)
            self.assertIsInstance(ours, torch_shard.sharded_tensor.ShardedTensor)
            self._assert_same(ours, theirs, msg)
            self.assertEqual(_layout(ours), _layout(theirs), msg)
            self.assertEqual(type(ours.sharding_spec()).__name__, msg)
            out = self._gathered(ours, full)
            if self.rank == 0:
                self.assertTrue(torch.equal(out, full), msg)
            # Resharding the converted tensor leaves upstream's shards alone.
            before = [s.tensor.clone() for s in theirs.local_shards()]
            ours.reshard(chunks(1, range(4)))
            for shard, copy in zip(theirs.local_shards(), before):
                self.assertTrue(torch.equal(shard.tensor, copy), msg)

    @with_comms(init_rpc=False)
    def test_to_upstream(self):
        full = torch.arange(7 * 5, dtype=torch.int64, device=self.device).view(7, 5) + 2**40
        cases = {
            "rows": chunks(0, (1, 0, 3, 2)),
            "grid": grid_spec(7, 5),
            # The last chunk is empty at offset 6 (past the end): upstream keeps it at offset 5.
            "cols_trailing_empty": chunks(1, range(4)),
            "empty_inside": EnumerableShardingSpec(
                [
                    ShardMetadata([0, 0], [7, 3], placement(0)),
                    ShardMetadata([0, 3], [7, 2], placement(1)),
                    ShardMetadata([2, 1], [0, 2], placement(2)),
                    ShardMetadata([3, 2], [4, 0], placement(3)),
                ]
            ),
        }
        for name, spec in cases.items():
            ours = filled(full, spec)
            theirs = to_upstream(ours)
            self.assertIsInstance(theirs, up_sharded_tensor.ShardedTensor, name)
            self._assert_same(ours, theirs, name)
            for (o1, s1, p1), (o2, s2, p2) in zip(_layout(ours), _layout(theirs)):
                self.assertEqual((s1, p1), (s2, p2), name)
                if all(s > 0 for s in s1):
                    self.assertEqual(o1, o2, name)
                else:
                    self.assertTrue(all(o + s <= n for o, s, n in zip(o2, s2, full.shape)), name)
            # Upstream's own gather works on the converted tensor (int64 needs dtype= upstream), where
            # its dist.gather can run: gloo gathers no CUDA tensors (the one-gpu mode).
            if not (self.backend == "gloo" and full.is_cuda):
                out = torch.zeros_like(full) if self.rank == 0 else None
                theirs.gather(0, out, dtype=torch.int64)
                if self.rank == 0:
                    self.assertTrue(torch.equal(out, full), name)
            # And back: the same local tensors again.
            again = from_upstream(theirs)
            for a, b in zip(again.local_shards(), ours.local_shards()):
                self.assertIs(a.tensor, b.tensor, name)

    @with_comms(init_rpc=False)
    def test_types_and_identity(self):
        ours = filled(torch.arange(8.0, device=self.device).view(4, 2), chunks(0, range(4)))
        self.assertIs(from_upstream(ours), ours)
        with self.assertRaisesRegex(TypeError, "expected a torch.distributed._shard ShardedTensor"):
            from_upstream(torch.ones(2))
        with self.assertRaisesRegex(TypeError, "expected a torch_shard ShardedTensor"):
            to_upstream(torch.ones(2))
        theirs = to_upstream(ours)
        with self.assertRaisesRegex(TypeError, "expected a torch_shard ShardedTensor"):
            to_upstream(theirs)
        # With torch_shard.compat installed, upstream's modules are torch_shard's: both are the identity.
        aliased = (torch_shard.sharded_tensor, torch_shard.metadata, torch_shard.sharding_spec)
        with mock.patch.object(interop._upstream, "_upstream_modules", lambda: aliased):
            self.assertIs(to_upstream(ours), ours)
            self.assertIs(from_upstream(ours), ours)


if __name__ == "__main__":
    run_tests()
