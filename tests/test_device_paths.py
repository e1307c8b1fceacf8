"""What the GPU/NCCL paths rely on, shown where a CPU can show it.

No GPU runs these tests here, so CUDA correctness comes from construction (see NOTE [ Communication
device ], NOTE [ One host read per exchange ] and NOTE [ What ranks agree on about a placement ] in
csrc/); these tests pin down the parts of that construction a CPU run can observe:

* ranks agree on a placement's owner and device TYPE, never on how a placement is written or on
  another rank's device index (``.cuda()`` writes this rank's device; ``cpu`` and ``cpu:0`` are one
  device);
* the sharded embedding forward never asks the host for a value that lives on the device (no
  ``.item()``, ``.tolist()``, ``nonzero``, ``masked_select``, ``unique``, ``repeat_interleave`` without
  an output size): on a GPU the one host read is the agreement's, inside the lookup op. (C++
  kernels read CPU memory directly only on branches taken for CPU tensors, guarded by ``is_cpu()``;
  those do not dispatch, so they are invisible here, as they are to a GPU.);
* a lookup's agreement carries its device-side status and words: a bad input costs one round more (the
  failing rank's message) and moves no data;
* ``pin_memory`` is a promise about every CPU shard, checked wherever shards are written.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from torch_shard import _shard_tensor, sharded_tensor
from torch_shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec, ShardMetadata
from torch_shard.testing import (
    ShardedTensorTestBase,
    TestCase,
    cpu_loops,
    placement,
    rank_device,
    requires_cuda,
    requires_testing_library,
    run_tests,
    with_comms,
)

WORLD = 4
aten = torch.ops.aten

# ATen ops whose result the host must read from the device (or whose output SIZE depends on device
# data, which the host must read to allocate it): each is a host sync on a GPU.
_HOST_READS = {
    aten._local_scalar_dense.default,  # .item(), int(t), float(t), bool(t)
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.bincount.default,
}


class _CountHostReads(TorchDispatchMode):
    """Counts the ATen ops that read device data on the host (see _HOST_READS), and
    ``Tensor.tolist`` (which does not dispatch on the CPU). ``inside`` lists the same ops called from
    within other ops (a C++ op's own calls, which a dispatch mode does not see), from torch.profiler."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []
        self.inside: list[str] = []
        self.tolist_dtypes: list[torch.dtype] = []  # of the tensors Tensor.tolist was called on
        self._profiler = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS:
            self.seen.append(str(func))
        if func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            self.seen.append(str(func) + " (no output_size)")
        return func(*args, **kwargs)

    def __enter__(self):
        self._tolist = torch.Tensor.tolist
        seen, dtypes = self.seen, self.tolist_dtypes
        original = self._tolist

        def tolist(tensor):
            seen.append("Tensor.tolist")
            dtypes.append(tensor.dtype)
            return original(tensor)

        torch.Tensor.tolist = tolist
        self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self._profiler.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        result = super().__exit__(*exc)
        self._profiler.__exit__(*exc)
        names = {f"aten::{op._schema.name.split('::', 1)[1]}" for op in _HOST_READS}
        self.inside = [
            event.name
            for event in self._profiler.events()
            if event.name in names and not _in_aten_embedding_kernel(event)
        ]
        return result


def _in_aten_embedding_kernel(event) -> bool:
    """Whether a profiler event ran inside one of ATen's embedding kernels: the dense op's own, whose
    CPU implementation (max mode's backward calls nonzero) is not what it runs on a GPU."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(("aten::_embedding_bag", "aten::embedding")):
            return True
        parent = parent.cpu_parent
    return False


def _rows(n: int = WORLD) -> ChunkShardingSpec:
    return ChunkShardingSpec(dim=0, placements=[placement(r) for r in range(n)])


def _cols() -> ChunkShardingSpec:
    return ChunkShardingSpec(dim=1, placements=[placement(r) for r in range(WORLD)])


class TestDevicePaths(ShardedTensorTestBase):
    @with_comms(init_rpc=False)
    def test_placements_written_differently_still_agree(self):
        """The same owner and device type written differently on different ranks ("cpu" / "cpu:0",
        "cuda" / "cuda:<index>") is one layout: scatter, reshard and gather go through, and each rank
        keeps its own spelling. A different owner or device type still raises on every rank."""
        device = rank_device(self.rank)
        full = torch.arange(12 * 8, dtype=torch.float32, device=device).view(12, 8)

        def spelled(r: int, dim: int) -> ChunkShardingSpec:
            # Odd ranks write every placement with an explicit index, even ranks without one.
            names = []
            for owner in range(WORLD):
                where = torch.device(rank_device(owner))
                kind, index = where.type, where.index or 0
                names.append(f"rank:{owner}/{kind}:{index}" if r % 2 else f"rank:{owner}/{kind}")
            return ChunkShardingSpec(dim=dim, placements=names)

        st = _shard_tensor(full, spelled(self.rank, 0))
        self.assertEqual(st.local_tensor(), full.chunk(WORLD)[self.rank])
        fps = [None] * WORLD
        dist.all_gather_object(fps, torch.ops.torch_shard._state(st)[5])
        self.assertEqual(len(set(fps)), 1, "the layout fingerprints of the ranks differ")
        st.reshard(spelled(self.rank, 1))
        self.assertEqual(st.local_tensor(), full.chunk(WORLD, dim=1)[self.rank])
        # A reshard that only respells the placements moves nothing and keeps the shards.
        before = st.local_tensor()
        st.reshard(spelled(self.rank + 1, 1))
        self.assertTrue(st.local_tensor() is before)
        self.assertEqual(str(st.metadata().shards_metadata[0].placement), str(spelled(self.rank + 1, 1).placements[0]))
        out = torch.empty_like(full) if self.rank == 1 else None
        st.gather(1, out)
        if self.rank == 1:
            self.assertEqual(out, full)
        # Owners still count: rank 3 swapping two owners raises on every rank.
        owners = [0, 1, 3, 2] if self.rank == 3 else list(range(WORLD))
        with self.assertRaisesRegex(ValueError, "sharding_spec on rank"):
            st.reshard(ChunkShardingSpec(dim=0, placements=[placement(r) for r in owners]))

    @with_comms(init_rpc=False)
    def test_moved_tensor_names_only_the_device_type_of_other_ranks(self):
        """After a device move (here a forced copy, the path .cuda() takes), this rank's placement names
        its device and the other ranks' name the device type only, so every rank builds the same layout
        and later data ops agree."""
        device = rank_device(self.rank)
        full = torch.arange(16 * 4, dtype=torch.float32, device=device).view(16, 4)
        st = _shard_tensor(full, _rows())
        moved = st.to(device=device, copy=True)
        self.assertFalse(moved is st)
        # A forced copy copies: no local shard shares memory with the original's.
        original = {s.tensor.data_ptr() for s in st.local_shards()}
        self.assertTrue(original)
        self.assertEqual(set(), original & {s.tensor.data_ptr() for s in moved.local_shards()})
        self.assertEqual(moved.local_shards()[0].tensor, st.local_shards()[0].tensor)
        # ... and the same holds for a copy to another dtype and back (two copies), while a plain .to()
        # of nothing new is the tensor itself.
        self.assertTrue(st.to(device=device) is st)
        self.assertTrue(st.to(torch.float32, copy=False) is st)
        again = st.to(torch.float32, copy=True)
        self.assertEqual(set(), original & {s.tensor.data_ptr() for s in again.local_shards()})
        kind = torch.device(device).type
        for r, md in enumerate(moved.metadata().shards_metadata):
            self.assertEqual(md.placement.rank(), r)
            self.assertEqual(md.placement.device().type, kind)
        fps = [None] * WORLD
        dist.all_gather_object(fps, torch.ops.torch_shard._state(moved)[5])
        self.assertEqual(len(set(fps)), 1)
        moved.reshard(_cols())
        out = torch.empty_like(full) if self.rank == 0 else None
        moved.gather(0, out)
        if self.rank == 0:
            self.assertEqual(out, full)

    @with_comms(init_rpc=False)
    def test_sharded_embedding_forward_reads_no_device_memory_on_the_host(self):
        """Row- and column-wise embedding and embedding_bag (sum, mean, max, per-sample weights,
        padding) run their forward without any op that makes the host read device data: on a GPU the
        only host read is the agreement's, inside the one _share_inputs call (or the agreement inside
        the one-call lookup ops, which copies its values to the host: no op listed here)."""
        device = rank_device(self.rank)
        torch.manual_seed(0)
        dense = torch.randn(20, 8, device=device)
        generator = torch.Generator().manual_seed(10 + self.rank)
        ids = torch.randint(0, 20, (6, 3), generator=generator).to(device)
        flat = ids.reshape(-1)
        offsets = torch.tensor([0, 4, 4, 11], device=device)
        psw = torch.rand(flat.numel(), generator=generator).to(device)
        for spec in (_rows(), _cols()):
            weight = sharded_tensor.empty(spec, 20, 8)
            with torch.no_grad():
                weight.local_tensor().copy_(dense[weight.local_shards()[0].metadata.shard_offsets[0] :][
                    : weight.local_tensor().size(0)
                ] if spec.dim == 0 else dense[:, weight.local_shards()[0].metadata.shard_offsets[1] :][
                    :, : weight.local_tensor().size(1)
                ])
            cases = [
                ("embedding", lambda w: F.embedding(ids, w, padding_idx=3)),
                ("bag sum psw", lambda w: F.embedding_bag(flat, w, offsets, mode="sum", per_sample_weights=psw)),
                ("bag mean", lambda w: F.embedding_bag(flat, w, offsets, mode="mean", padding_idx=5)),
                ("bag max 2-D", lambda w: F.embedding_bag(ids, w, mode="max")),
                # A 2-D input's rows are its bags: no offsets to build or check (NOTE [ Requester-side
                # routing in one op ]).
                ("bag sum 2-D psw", lambda w: F.embedding_bag(ids, w, mode="sum", per_sample_weights=psw.view(6, 3))),
                ("bag mean 2-D padding", lambda w: F.embedding_bag(ids, w, mode="mean", padding_idx=5)),
                ("bag max 2-D padding", lambda w: F.embedding_bag(ids, w, mode="max", padding_idx=5)),
                ("bag mean 2-D no bags", lambda w: F.embedding_bag(ids[:0], w, mode="mean")),
                ("bag sum last", lambda w: F.embedding_bag(flat, w, torch.tensor([0, 9, 18], device=device), include_last_offset=True, mode="sum")),
            ]
            # On the CPU the lookups check and bucket their ids with loops (NOTE [ Requester-side
            # routing in one op ]); other devices take the composition, checked here on the CPU too.
            for fused in (True, False):
                with cpu_loops(fused):
                    for name, lookup in cases:
                        with _CountHostReads() as counter:
                            out = lookup(weight)
                        where = f"{name}, dim {spec.dim}, fused {fused}"
                        self.assertEqual(counter.seen, [], f"{where}: host reads of device data")
                        # Inside the C++ ops too, but for the CPU-only loops, which read the CPU ids by
                        # design.
                        if not fused:
                            self.assertEqual(counter.inside, [], f"{where}: host reads inside the ops")
                        self.assertEqual(out, lookup(dense), atol=1e-5, rtol=1e-5, msg=where)

    @with_comms(init_rpc=False)
    def test_sharded_embedding_backward_reads_no_device_memory_on_the_host(self):
        """The lookups' backwards on the composition every non-CPU device takes: no op reads device
        data on the host, inside the C++ ops included (the backward agreement carries no status)."""
        device = rank_device(self.rank)
        generator = torch.Generator().manual_seed(20 + self.rank)
        ids = torch.randint(0, 20, (6, 3), generator=generator).to(device)
        cases = [
            ("embedding", lambda w: F.embedding(ids, w, padding_idx=3)),
            ("bag sum", lambda w: F.embedding_bag(ids, w, mode="sum")),
            ("bag mean", lambda w: F.embedding_bag(ids, w, mode="mean", padding_idx=5)),
            ("bag max", lambda w: F.embedding_bag(ids, w, mode="max", padding_idx=5)),
        ]
        for spec in (_rows(), _cols()):
            weight = sharded_tensor.rand(spec, 20, 8, requires_grad=True)
            with cpu_loops(False):
                for name, lookup in cases:
                    out = lookup(weight)
                    with _CountHostReads() as counter:
                        out.sum().backward()
                    where = f"{name}, dim {spec.dim}"
                    self.assertEqual(counter.seen, [], f"{where}: host reads of device data")
                    self.assertEqual(counter.inside, [], f"{where}: host reads inside the ops")

    @with_comms(init_rpc=False)
    def test_steady_state_data_ops_read_nothing_on_the_host(self):
        """NOTE [ Headers on the host ]: with round 1 split as on CUDA groups that have a CPU backend
        (the test-only switch runs it here), a scatter, gather, reshard or redistribute that the group's
        history knows dispatches no op that reads device data on the host, inside the C++ op included,
        and reads no header table from the communication device's buffers."""
        from torch.distributed.tensor import Shard as DShard
        from torch.distributed.tensor import distribute_tensor, init_device_mesh

        from torch_shard.interop import redistribute

        testing_ops = torch.ops.torch_shard_testing
        n = 512
        full = torch.rand(n, n, generator=torch.Generator().manual_seed(3)).to(rank_device(self.rank))
        part = slice(self.rank * n // WORLD, (self.rank + 1) * n // WORLD)
        st = _shard_tensor(full, _rows())
        out = torch.empty(n, n, device=full.device) if self.rank == 0 else None
        mesh = init_device_mesh(self.device_type, (WORLD,))
        dt_rows, dt_cols = (distribute_tensor(full, mesh, [DShard(d)]) for d in (0, 1))
        ops = [
            ("scatter", lambda: _shard_tensor(full, _rows()).local_tensor(), full[part]),
            ("gather", lambda: st.gather(0, out), None),
            ("reshard to columns", lambda: st.reshard(_cols()).local_tensor(), full[:, part]),
            ("reshard to rows", lambda: st.reshard(_rows()).local_tensor(), full[part]),
            ("redistribute S0 -> S1", lambda: redistribute(dt_rows, mesh, [DShard(1)]).to_local(), full[:, part]),
            ("redistribute S1 -> S0", lambda: redistribute(dt_cols, mesh, [DShard(0)]).to_local(), full[part]),
        ]
        try:
            testing_ops._set_exchange(split=True)
            for lap in range(3):
                for name, call, expected in ops:
                    torch.ops.torch_shard._comm_stats(True)
                    with _CountHostReads() as counter:
                        got = call()
                    if lap == 2:
                        # Layouts are int64 tensors made on the CPU on every machine (never device data):
                        # building a ShardedTensor lists them. The data here is float32.
                        reads = [op for op in counter.seen if op != "Tensor.tolist"]
                        self.assertEqual(reads, [], f"{name}: host reads of device data")
                        self.assertTrue(all(d == torch.int64 for d in counter.tolist_dtypes), name)
                        self.assertEqual(counter.inside, [], f"{name}: host reads inside the ops")
                        self.assertEqual(torch.ops.torch_shard._comm_stats(False)[6], 0, name)
                    if expected is not None:
                        self.assertEqual(got, expected, msg=name)
            if self.rank == 0:
                self.assertEqual(out, full)
        finally:
            testing_ops._set_exchange()

    @with_comms(init_rpc=False)
    def test_a_bad_input_costs_its_message_and_moves_no_data(self):
        """A lookup whose input fails its device-side check on one rank: the status rides the agreement
        (NOTE [ Input checks on the device ]), so every rank raises after round 1 and one more round that
        carries the failing rank's message (NOTE [ Reasons travel ]); no ids, rows or results move. On
        both paths (the CPU's loops and the composition other devices take)."""
        device = rank_device(self.rank)
        weight = sharded_tensor.rand(_rows(), 20, 8)
        for loops in (True, False):
            with cpu_loops(loops):
                ids = torch.tensor([1, 2, 25 if self.rank == 2 else 3], device=device)
                torch.ops.torch_shard._comm_stats(True)
                with self.assertRaises(ValueError) as caught:
                    F.embedding(ids, weight)
                stats = torch.ops.torch_shard._comm_stats(True)
                if self.rank == 2:
                    self.assertEqual(str(caught.exception), "Index out of range in Input 1 25 20")
                else:
                    self.assertRegex(
                        str(caught.exception),
                        r"rank 2 of the process group rejected its arguments \(ValueError: Index out of range in "
                        r"Input 1 25 20\)",
                    )
                if self.gloo_only("round counts of the agreement on gloo"):
                    self.assertEqual(stats[2], 2, f"rounds, loops={loops}")  # round 1 and the reasons' round
                self.assertEqual(stats[0], 0, f"bytes sent, loops={loops}")
                # The group works on, and a good call moves data.
                ids = torch.tensor([1, 2, 3], device=device)
                self.assertEqual(F.embedding(ids, weight).shape, (3, 8))

    @with_comms(init_rpc=False)
    def test_embedding_bad_ids_raise_on_every_rank_from_the_device_check(self):
        """Out-of-range ids on one rank: that rank raises the dense op's message (its checks repeated on
        the host), the others the same class naming it."""
        device = rank_device(self.rank)
        weight = sharded_tensor.rand(_rows(), 20, 8)
        ids = torch.tensor([1, 2, 25 if self.rank == 1 else 3], device=device)
        if self.rank == 1:
            with self.assertRaisesRegex(ValueError, "Index out of range in Input 1 25 20"):
                F.embedding(ids, weight)
        else:
            with self.assertRaisesRegex(ValueError, "rank 1 of the process group rejected"):
                F.embedding(ids, weight)
        offsets = torch.tensor([0, 2, 1] if self.rank == 3 else [0, 1, 2], device=device)
        with self.assertRaisesRegex(RuntimeError, "non-decreasing" if self.rank == 3 else "rank 3 of the process group"):
            F.embedding_bag(torch.tensor([1, 2, 3], device=device), weight, offsets)

    @with_comms(init_rpc=False)
    def test_pin_memory_is_a_promise_about_every_cpu_shard(self):
        """A ShardedTensor that says pin_memory=True holds only pinned CPU shards: building one from
        unpinned shards, or writing an unpinned shard into one, raises instead of leaving is_pinned()
        and the metadata lying."""
        shard = torch.zeros(4, 3)  # not pinned (this machine may have no accelerator to pin with)
        group = dist.group.WORLD.group_name
        with self.assertRaisesRegex(ValueError, "pinned memory"):
            torch.ops.torch_shard._make_sharded(
                [shard], [self.rank], [16, 3], 0, None, None, None,
                [f"rank:{r}/cpu" for r in range(WORLD)], list(range(WORLD)), torch.float32, None, True,
                group, self.rank, WORLD,
            )
        st = sharded_tensor.zeros(ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(WORLD)]), 16, 3)
        self.assertFalse(st.is_pinned())


@requires_testing_library
class TestCommDevice(TestCase):
    """Which device torch_shard's collectives use (NOTE [ Communication device ]), on a group with a
    CUDA backend other than gloo. No NCCL here: the group is built by hand with torch's fake backend
    registered for CUDA, which is all the choice looks at (it never talks to the backend)."""

    def setUp(self) -> None:
        from torch._C._distributed_c10d import FakeProcessGroup, ProcessGroup, _register_process_group

        self.group_name = f"torch_shard_comm_device_{id(self)}"
        pg = ProcessGroup(dist.HashStore(), 0, 1)
        fake = FakeProcessGroup._create_internal(0, 1)
        pg._register_backend(torch.device("cpu"), ProcessGroup.BackendType.CUSTOM, fake)
        pg._register_backend(torch.device("cuda"), ProcessGroup.BackendType.CUSTOM, fake)
        self.pg = pg
        _register_process_group(self.group_name, pg)

    def tearDown(self) -> None:
        from torch._C._distributed_c10d import _unregister_process_group

        _unregister_process_group(self.group_name)

    def _comm_device(self, tensors: str = "") -> str:
        return torch.ops.torch_shard_testing._comm_device(self.group_name, tensors)

    def test_bound_device_wins_over_the_tensors_device(self):
        # NCCL refuses tensors on any device but the one its group is bound to: a rank whose shards sit
        # on cuda:0 while the group is bound to cuda:1 stages through cuda:1 (it used to pick cuda:0 and
        # raise inside round 1 while its peers waited).
        self.pg.bound_device_id = torch.device("cuda:1")
        self.assertEqual(self._comm_device("cuda:0"), "cuda:1")
        self.assertEqual(self._comm_device("cpu"), "cuda:1")
        self.assertEqual(self._comm_device(), "cuda:1")

    def test_unbound_group_uses_the_tensors_device(self):
        self.assertEqual(self._comm_device("cuda:2"), "cuda:2")

    def test_gloo_group_communicates_on_the_cpu(self):
        # A group whose only backend is gloo (for CPU and CUDA tensors alike) stages through host memory.
        from torch._C._distributed_c10d import ProcessGroup

        name = f"{self.group_name}_gloo"
        pg = ProcessGroup(dist.HashStore(), 0, 1)
        gloo = dist.ProcessGroupGloo(dist.HashStore(), 0, 1)
        pg._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, gloo)
        pg._register_backend(torch.device("cuda"), ProcessGroup.BackendType.GLOO, gloo)
        from torch._C._distributed_c10d import _register_process_group, _unregister_process_group

        _register_process_group(name, pg)
        try:
            self.assertEqual(torch.ops.torch_shard_testing._comm_device(name, "cuda:1"), "cpu")
        finally:
            _unregister_process_group(name)


class TestPinnedOnGpuMachines(ShardedTensorTestBase):
    @requires_cuda(1)
    @with_comms(init_rpc=False, backend="gloo")
    def test_reshard_and_to_keep_pinned_consistent(self):
        """A pinned ShardedTensor stays pinned through a reshard onto CPU placements (new shards are
        allocated pinned) and through every copy made on the CPU (.to() another dtype, clone(),
        type_as(), deepcopy, pickling); on CUDA placements it is not pinned (there is no CPU shard to
        pin), and a non-blocking copy back to the CPU follows the promise, not PyTorch's pinning of the
        destination."""
        spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(WORLD)])
        st = sharded_tensor.zeros(spec, 16, 8, pin_memory=True)
        self.assertTrue(st.is_pinned())
        st.reshard(ChunkShardingSpec(dim=1, placements=[f"rank:{r}/cpu" for r in range(WORLD)]))
        self.assertTrue(st.is_pinned())
        self.assertTrue(all(s.tensor.is_pinned() for s in st.local_shards()))
        half = st.to(torch.float16)
        self.assertTrue(half.is_pinned())
        self.assertTrue(half.metadata().tensor_properties.pin_memory)
        for copied in (st.clone(), st.type_as(torch.zeros(1, dtype=torch.float64)), copy.deepcopy(st)):
            self.assertTrue(copied.is_pinned())
            self.assertTrue(all(s.tensor.is_pinned() for s in copied.local_shards()))
            self.assertEqual(copied.local_shards()[0].tensor.double(), st.local_shards()[0].tensor.double())
        grid = EnumerableShardingSpec(
            [ShardMetadata([0, 0], [16, 4], "rank:0/cpu"), ShardMetadata([0, 4], [16, 4], "rank:1/cpu")]
        )
        st.reshard(grid)
        self.assertTrue(st.is_pinned())
        # Onto the GPU: not pinned; back with non_blocking=True: pageable shards, metadata unpinned.
        on_gpu = st.cuda()
        self.assertFalse(on_gpu.is_pinned())
        back = on_gpu.to("cpu", non_blocking=True)
        torch.cuda.synchronize()
        self.assertFalse(back.is_pinned())
        self.assertEqual(back.local_shards()[0].tensor if back.local_shards() else None,
                         st.local_shards()[0].tensor if st.local_shards() else None)
        # A reshard onto CUDA placements only: nothing is pinned any more, and is_pinned() says so.
        st.reshard(ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cuda:0" for r in range(WORLD)]))
        self.assertFalse(st.is_pinned())


if __name__ == "__main__":
    run_tests()
