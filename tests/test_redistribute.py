"""torch_shard.interop.redistribute against DTensor.redistribute: the same local tensors, the same
gradients, one exchange, exactly the bytes that change owner, and errors on every rank.

Every pair of Shard/Replicate placements on a 1-D mesh of 4 ranks and a 2 x 2 mesh, on even and
uneven sizes (empty chunks included), in float and integer dtypes; DTensor's own redistribute is the
reference (``full_tensor`` through the CPU in the one-gpu mode: torch_shard.testing.full_tensor).
"""

import itertools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor
from torch.distributed.tensor import Shard as DShard
from torch.distributed.tensor.placement_types import _StridedShard

from torch_shard.interop import redistribute
from torch_shard.testing import ShardedTensorTestBase, full_tensor, run_tests, with_comms

_TORCH = tuple(int(n) for n in torch.__version__.split("+")[0].split(".")[:2])


def _placements_1d():
    return [[DShard(0)], [DShard(1)], [Replicate()]]


def _placements_2d():
    one = [DShard(0), DShard(1), Replicate()]
    return [list(p) for p in itertools.product(one, one)]


def _comm_stats():
    return torch.ops.torch_shard._comm_stats(True)


class TestRedistribute(ShardedTensorTestBase):
    def _full(self, shape, dtype=torch.float32):
        gen = torch.Generator().manual_seed(sum(shape))
        if dtype.is_floating_point:
            return torch.randn(*shape, generator=gen, dtype=dtype).to(self.device)
        return torch.randint(-(2**40), 2**40, shape, generator=gen, dtype=dtype).to(self.device)

    def _check_all_pairs(self, mesh, layouts, shapes, dtype=torch.float32):
        for shape in shapes:
            full = self._full(shape, dtype)
            for src, dst in itertools.product(layouts, layouts):
                msg = f"{list(shape)} {dtype} {src} -> {dst}"
                dt = distribute_tensor(full, mesh, src)
                ours = redistribute(dt, mesh, dst)
                theirs = dt.redistribute(mesh, dst)
                self.assertIsInstance(ours, DTensor, msg)
                self.assertEqual(list(ours.placements), dst, msg)
                self.assertEqual(ours.shape, full.shape, msg)
                self.assertTrue(torch.equal(ours.to_local(), theirs.to_local()), msg)
                self.assertTrue(torch.equal(full_tensor(ours), full), msg)
                # The source is untouched.
                self.assertTrue(torch.equal(dt.to_local(), distribute_tensor(full, mesh, src).to_local()), msg)

    @with_comms(init_rpc=False)
    def test_every_pair_on_a_1d_mesh(self):
        mesh = init_device_mesh(self.device_type, (4,))
        # 8 x 6 even; 7 x 10 uneven (2, 2, 2, 1 rows); 3 x 5 with an empty chunk; 2 x 3 (two empty).
        self._check_all_pairs(mesh, _placements_1d(), [(8, 6), (7, 10), (3, 5), (2, 3)])
        self._check_all_pairs(mesh, _placements_1d(), [(7, 5)], dtype=torch.int64)

    @with_comms(init_rpc=False)
    def test_every_pair_on_a_2d_mesh(self):
        mesh = init_device_mesh(self.device_type, (2, 2))
        self._check_all_pairs(mesh, _placements_2d(), [(8, 4), (5, 7), (1, 3)])

    @with_comms(init_rpc=False)
    def test_three_dims(self):
        mesh = init_device_mesh(self.device_type, (2, 2))
        layouts = [[DShard(0), DShard(2)], [DShard(2), DShard(1)], [Replicate(), DShard(2)], [DShard(1), DShard(1)]]
        self._check_all_pairs(mesh, layouts, [(3, 4, 5)])

    @with_comms(init_rpc=False)
    def test_one_exchange_and_only_the_bytes_that_change_owner(self):
        mesh = init_device_mesh(self.device_type, (4,))
        full = self._full((64, 32))
        element = full.element_size()
        # Shard(0) -> Shard(1): each rank keeps a 16 x 8 block and sends three of its four blocks.
        # Replicate -> Shard(d): nothing moves and nothing is said (every rank holds its target already).
        # Shard(0) -> Replicate: each rank sends its 16 x 32 rows to the three others.
        cases = [
            ([DShard(0)], [DShard(1)], 3 * 16 * 8, 1),
            ([Replicate()], [DShard(1)], 0, 0),
            ([DShard(0)], [Replicate()], 3 * 16 * 32, 1),
            ([Replicate()], [Replicate()], 0, 0),
        ]
        for src, dst, elements, rounds_expected in cases:
            dt = distribute_tensor(full, mesh, src)
            _comm_stats()
            redistribute(dt, mesh, dst)
            sent, received, rounds = _comm_stats()[:3]
            msg = f"{src} -> {dst}"
            self.assertEqual(sent, elements * element, msg)
            self.assertEqual(received, elements * element, msg)
            self.assertEqual(rounds, rounds_expected, msg)
        # On a 2 x 2 mesh, [Shard(0), Shard(1)] -> [Shard(1), Shard(0)] in one exchange too.
        mesh2 = init_device_mesh(self.device_type, (2, 2))
        dt = distribute_tensor(full, mesh2, [DShard(0), DShard(1)])
        _comm_stats()
        redistribute(dt, mesh2, [DShard(1), DShard(0)])
        self.assertEqual(_comm_stats()[2], 1)

    @with_comms(init_rpc=False)
    def test_gradients_match_dtensor(self):
        mesh = init_device_mesh(self.device_type, (2, 2))
        full = self._full((6, 5), torch.float64)
        weight = self._full((6, 5), torch.float64) + 1
        layouts = [[DShard(0), DShard(1)], [Replicate(), DShard(0)], [DShard(1), Replicate()], [Replicate(), Replicate()]]
        for src, dst in itertools.product(layouts, layouts):
            msg = f"{src} -> {dst}"
            grads = []
            for move in (redistribute, lambda d, m, p: d.redistribute(m, p)):
                leaf = distribute_tensor(full, mesh, src).detach().requires_grad_(True)
                out = move(leaf, mesh, dst)
                (out * distribute_tensor(weight, mesh, dst)).sum().backward()
                grads.append(leaf.grad)
            ours, theirs = grads
            self.assertEqual(list(ours.placements), list(theirs.placements), msg)
            self.assertTrue(torch.allclose(full_tensor(ours), full_tensor(theirs)), msg)
            self.assertTrue(torch.allclose(full_tensor(ours), weight), msg)

    @with_comms(init_rpc=False)
    def test_second_order_gradients_match_dtensor(self):
        # The backward is itself a move (the reverse one), so a gradient of a gradient flows through
        # it: d/dx sum(d/dx sum(w * y^2)) with y = x moved, against DTensor's redistribute. Includes a
        # narrowing forward (Replicate -> Shard), whose backward still communicates.
        mesh = init_device_mesh(self.device_type, (2, 2))
        full = self._full((6, 5), torch.float64)
        weight = self._full((6, 5), torch.float64) + 1
        cases = [([DShard(0), DShard(1)], [DShard(1), Replicate()]), ([Replicate(), Replicate()], [DShard(0), DShard(1)])]
        for src, dst in cases:
            msg = f"{src} -> {dst}"
            grads = []
            for move in (redistribute, lambda d, m, p: d.redistribute(m, p)):
                leaf = distribute_tensor(full, mesh, src).detach().requires_grad_(True)
                out = move(leaf, mesh, dst)
                loss = (distribute_tensor(weight, mesh, dst) * out * out).sum()
                (first,) = torch.autograd.grad(loss, leaf, create_graph=True)
                self.assertTrue(torch.allclose(full_tensor(first), 2 * weight * full), msg)
                (first * first).sum().backward()
                grads.append(leaf.grad)
            ours, theirs = grads
            self.assertIsNotNone(ours, msg)
            self.assertTrue(torch.allclose(full_tensor(ours), 8 * weight * weight * full), msg)
            if theirs is None:
                # DTensor's own redistribute has no double backward in torch 2.11 (the first gradient
                # has no grad_fn there); from 2.13 on it has, and the two are compared.
                self.assertLess(_TORCH, (2, 13), msg)
                continue
            self.assertEqual(list(ours.placements), list(theirs.placements), msg)
            self.assertTrue(torch.allclose(full_tensor(ours), full_tensor(theirs)), msg)

    @with_comms(init_rpc=False)
    def test_strided_shards(self):
        # FSDP2 + TP's right-to-left sharding: [_StridedShard(0, sf=2), Shard(0)] on a 2 x 2 mesh, each
        # local tensor two interleaved pieces of dim 0 on a 1-D mesh; to and from every other layout,
        # against distribute_tensor's own local tensors, gradients through the pieces too.
        mesh2 = init_device_mesh(self.device_type, (2, 2))
        mesh1 = init_device_mesh(self.device_type, (4,))
        layouts = {
            mesh2: [
                [_StridedShard(0, split_factor=2), DShard(0)],
                [DShard(0), DShard(1)],
                [Replicate(), Replicate()],
                [DShard(1), Replicate()],
                [_StridedShard(1, split_factor=2), DShard(1)],
            ],
            mesh1: [[_StridedShard(0, split_factor=2)], [DShard(0)], [DShard(1)], [Replicate()]],
        }
        full = self._full((8, 12), torch.float64)
        for mesh, cases in layouts.items():
            for src, dst in itertools.product(cases, cases):
                msg = f"{src} -> {dst}"
                leaf = distribute_tensor(full, mesh, src).detach().requires_grad_(True)
                out = redistribute(leaf, mesh, dst)
                self.assertEqual(list(out.placements), dst, msg)
                self.assertTrue(torch.equal(out.to_local(), distribute_tensor(full, mesh, dst).to_local()), msg)
                # d/dleaf of each rank's sum(out_local * full_local) is `full` in the source layout, on
                # every rank (a replicated target's gradient taken from one replica). Checked on the
                # local tensors: torch 2.11's DTensor cannot compute on a 1-D _StridedShard tensor.
                (out.to_local() * distribute_tensor(full, mesh, dst).to_local()).sum().backward()
                self.assertEqual(list(leaf.grad.placements), src, msg)
                self.assertTrue(torch.equal(leaf.grad.to_local(), distribute_tensor(full, mesh, src).to_local()), msg)

    @with_comms(init_rpc=False)
    def test_under_torch_compile(self):
        # NOTE [ redistribute under torch.compile ]: dynamo breaks the graph once, at the call, runs it
        # eagerly and compiles the code around it; values and gradients as in eager mode; fullgraph=True
        # raises before any rank communicates.
        import torch._dynamo
        import torch._dynamo.utils

        from torch_shard._support._compile import REDISTRIBUTE_GRAPH_BREAK_REASON as GRAPH_BREAK_REASON

        mesh = init_device_mesh(self.device_type, (2, 2))
        full = self._full((6, 5), torch.float64)
        weight = distribute_tensor(self._full((6, 5), torch.float64) + 1, mesh, [DShard(1), Replicate()])

        def step(d):
            return (redistribute(d * 2, mesh, [DShard(1), Replicate()]) * weight).sum()

        counters = torch._dynamo.utils.counters
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(step, backend="aot_eager")
        grads = []
        for run in (compiled, step, compiled):
            leaf = distribute_tensor(full, mesh, [DShard(0), DShard(1)]).detach().requires_grad_(True)
            loss = run(leaf)
            loss.backward()
            self.assertTrue(torch.allclose(full_tensor(loss), (2 * full * full_tensor(weight)).sum()))
            grads.append(full_tensor(leaf.grad))
        for got in grads:
            self.assertTrue(torch.allclose(got, 2 * full_tensor(weight)))
        reasons = [str(reason) for reason in counters["graph_break"]]
        # Every break is ours: at the call in step (dynamo cannot break inside the inlined
        # redistribute), and in redistribute's own frame, which dynamo then tries on its own and finds
        # nothing to compile. The code around the call compiles into two graphs (d * 2; the product and
        # the sum), compiled once.
        reasons = [str(reason) for reason in counters["graph_break"]]
        self.assertTrue(reasons, "no graph break")
        for reason in reasons:
            self.assertIn(GRAPH_BREAK_REASON, reason)
        self.assertEqual(counters["stats"]["unique_graphs"], 2)
        torch._dynamo.reset()
        dt = distribute_tensor(full, mesh, [DShard(0), DShard(1)])
        with self.assertRaises(torch._dynamo.exc.Unsupported) as caught:
            torch.compile(step, backend="eager", fullgraph=True)(dt)
        self.assertIn(GRAPH_BREAK_REASON, str(caught.exception))
        # No rank entered the exchange (that would have hung the others): the group still works.
        self.assertTrue(torch.equal(full_tensor(redistribute(dt, mesh, [DShard(1), Replicate()])), full))

    @with_comms(init_rpc=False)
    def test_same_placements_return_the_argument(self):
        mesh = init_device_mesh(self.device_type, (4,))
        dt = distribute_tensor(self._full((8, 4)), mesh, [DShard(0)])
        self.assertIs(redistribute(dt, mesh, [DShard(0)]), dt)
        self.assertIs(redistribute(dt), dt)
        self.assertIs(redistribute(dt, None, [DShard(-2)]), dt)

    @with_comms(init_rpc=False)
    def test_a_partial_gradient_comes_back_in_the_source_placements(self):
        # y = redistribute(x) feeds a matmul with a column-sharded weight, so y's gradient arrives
        # Partial; the leaf's gradient must be in x's placements (reduced), as DTensor gives it, also
        # when the placements do not change (where the forward moves nothing).
        mesh = init_device_mesh(self.device_type, (4,))
        full = self._full((4, 6), torch.float64)
        weight = distribute_tensor(self._full((6, 8), torch.float64), mesh, [DShard(1)])
        for src, dst in (([Replicate()], [Replicate()]), ([Replicate()], [DShard(0)]), ([DShard(0)], [Replicate()])):
            grads = []
            for move in (redistribute, lambda d, m, p: d.redistribute(m, p)):
                leaf = distribute_tensor(full, mesh, src).detach().requires_grad_(True)
                out = move(leaf, mesh, dst)
                if dst == [DShard(0)]:
                    out = out.redistribute(mesh, [Replicate()])
                (out @ weight).sum().backward()
                grads.append(leaf.grad)
            ours, theirs = grads
            msg = f"{src} -> {dst}"
            self.assertEqual(list(ours.placements), src, msg)
            self.assertEqual(list(ours.placements), list(theirs.placements), msg)
            self.assertTrue(torch.allclose(ours.to_local(), theirs.to_local()), msg)
        # Without autograd, the same placements still give the argument itself.
        leaf = distribute_tensor(full, mesh, [Replicate()]).requires_grad_(True)
        with torch.no_grad():
            self.assertIs(redistribute(leaf, mesh, [Replicate()]), leaf)

    @with_comms(init_rpc=False)
    def test_partial_sources_are_reduced_first(self):
        mesh = init_device_mesh(self.device_type, (4,))
        local = torch.full((4, 3), float(self.rank + 1), device=self.device)
        partial = DTensor.from_local(local, mesh, [Partial()], run_check=False)
        expected = torch.full((4, 3), 10.0, device=self.device)  # 1 + 2 + 3 + 4
        for dst in ([DShard(0)], [DShard(1)], [Replicate()]):
            out = redistribute(partial, mesh, dst)
            self.assertEqual(list(out.placements), dst)
            self.assertTrue(torch.equal(full_tensor(out), expected), dst)
        with self.assertRaisesRegex(ValueError, "a Partial target placement"):
            redistribute(distribute_tensor(expected, mesh, [Replicate()]), mesh, [Partial()])

    @with_comms(init_rpc=False)
    def test_bad_arguments_raise_on_every_rank(self):
        mesh = init_device_mesh(self.device_type, (4,))
        dt = distribute_tensor(self._full((8, 4)), mesh, [DShard(0)])
        # The wrong number of placements, on one rank only: every rank raises, none waits.
        bad = [DShard(1), Replicate()] if self.rank == 2 else [DShard(1)]
        with self.assertRaisesRegex(ValueError, "one placement per mesh dim|rank 2 of the process group"):
            redistribute(dt, mesh, bad)
        # A dim out of range on one rank.
        bad = [DShard(5)] if self.rank == 1 else [DShard(1)]
        with self.assertRaisesRegex(IndexError, "out of range|rank 1 of the process group"):
            redistribute(dt, mesh, bad)
        # Different targets on different ranks: the agreement sees it before any data moves.
        target = [Replicate()] if self.rank == 3 else [DShard(1)]
        with self.assertRaisesRegex(ValueError, "target placements on rank"):
            redistribute(dt, mesh, target)
        # A rank whose DTensor has another global shape: the agreement sees it before any data moves.
        rows = 12 if self.rank == 1 else 8
        other_shape = DTensor.from_local(
            torch.zeros(rows // 4, 4, device=self.device), mesh, [DShard(0)], run_check=False, shape=(rows, 4),
            stride=(4, 1),
        )
        with self.assertRaisesRegex(ValueError, "does not match the tensor on rank"):
            redistribute(other_shape, mesh, [DShard(1)])
        # A rank whose local tensor does not match its shard (a DTensor built wrong).
        local = dt.to_local() if self.rank != 0 else torch.zeros(3, 4, device=self.device)
        wrong = DTensor.from_local(local, mesh, [DShard(0)], run_check=False, shape=dt.shape, stride=dt.stride())
        with self.assertRaisesRegex(ValueError, "has size \\[3, 4\\]|rank 0 of the process group"):
            redistribute(wrong, mesh, [DShard(1)])
        # Another mesh, on every rank.
        other = init_device_mesh(self.device_type, (2, 2))
        with self.assertRaisesRegex(NotImplementedError, "another device mesh"):
            redistribute(dt, other, [DShard(0), DShard(1)])
        with self.assertRaisesRegex(TypeError, "expected a DTensor"):
            redistribute(torch.zeros(2), mesh, [DShard(0)])
        # The group still works after all of that.
        self.assertTrue(torch.equal(full_tensor(redistribute(dt, mesh, [DShard(1)])), full_tensor(dt)))

    @with_comms(init_rpc=False)
    def test_a_sub_group_mesh(self):
        # A 1-D mesh over ranks 1 and 3 (its own group): the other ranks take no part.
        group = dist.new_group([1, 3])
        full = self._full((5, 4))
        if self.rank in (1, 3):
            mesh = DeviceMesh.from_group(group, self.device_type)
            dt = distribute_tensor(full, mesh, [DShard(0)])
            out = redistribute(dt, mesh, [DShard(1)])
            self.assertTrue(torch.equal(out.to_local(), dt.redistribute(mesh, [DShard(1)]).to_local()))


if __name__ == "__main__":
    run_tests()
