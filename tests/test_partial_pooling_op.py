"""The C++ kernel behind row-wise sharded embedding_bag, single process, against a Python reference.

``torch.ops.torch_shard._embedding_bag_partial`` pools, per bag, the rows a weight shard owns; its
fused CPU loops and the ATen composition other devices use (``cpu_loops(False)``, also run on CUDA when
the machine has a GPU) must agree with each other and with a straightforward reference, forward and
backward. The precondition tests are about the CPU op (its raw-pointer loops) and run on the CPU.
"""

import random

import torch

import torch_shard  # noqa: F401  (registers the ops)
from torch_shard.testing import TestCase, cpu_loops, run_tests

_ops = torch.ops.torch_shard


def _reference(weight, ids, offsets, psw, row_start, mode, padding_idx):
    """Per bag: sum (weighted) or max over the owned, non-padding ids; 0 / -inf when there are none."""
    bags, dim, rows = offsets.numel(), weight.size(1), weight.size(0)
    ends = offsets.tolist()[1:] + [ids.numel()]
    outs = []
    for b in range(bags):
        picked = []
        for i in range(int(offsets[b]), ends[b]):
            row = int(ids[i]) - row_start
            if 0 <= row < rows and int(ids[i]) != padding_idx:
                value = weight[row]
                if psw is not None and mode == "sum":
                    value = value * psw[i]
                picked.append(value)
        if not picked:
            fill = 0.0 if mode == "sum" else float("-inf")
            outs.append(torch.full((dim,), fill, dtype=weight.dtype, device=weight.device))
        elif mode == "sum":
            outs.append(torch.stack(picked).sum(0))
        else:
            outs.append(torch.stack(picked).amax(0))
    return torch.stack(outs) if outs else torch.zeros(0, dim, dtype=weight.dtype, device=weight.device)


class TestEmbeddingBagPartial(TestCase):
    def _case(self, rng, mode, weighted, dtype):
        rows, dim, vocab = rng.randint(1, 9), rng.randint(1, 6), 30
        row_start = rng.randint(0, vocab - rows)
        n = rng.randint(0, 25)
        ids = torch.tensor([rng.randrange(vocab) for _ in range(n)], dtype=torch.int64)
        cuts = sorted(rng.randint(0, n) for _ in range(rng.randint(0, 6)))
        # May contain empty bags; sometimes no bag at all, or ids before the first bag (no bag's).
        first = [] if not cuts else ([0] if rng.random() < 0.8 else [])
        offsets = torch.tensor(first + cuts, dtype=torch.int64)
        psw = torch.rand(n, dtype=dtype) if weighted else None
        padding_idx = rng.choice([-1, row_start, row_start + rows // 2])
        weight = torch.randn(rows, dim, dtype=dtype)
        return weight, ids, offsets, psw, row_start, padding_idx

    def test_forward_and_backward_match_reference(self):
        # The fused loops are CPU code; the ATen composition (cpu_loops(False)) is also what a CUDA weight
        # runs, so on a machine with a GPU it is checked there too.
        paths = [("cpu", True), ("cpu", False)] + ([("cuda", False)] if torch.cuda.is_available() else [])
        rng = random.Random(0)
        for trial in range(120):
            mode = "max" if trial % 3 == 0 else "sum"
            dtype = torch.float64 if trial % 2 else torch.float32
            case = self._case(rng, mode, trial % 4 == 1, dtype)
            for device, fused in paths:
                weight, ids, offsets, psw = (None if t is None else t.to(device) for t in case[:4])
                row_start, pad = case[4:]
                msg = f"trial {trial} {device} fused={fused}"
                expected = _reference(weight, ids, offsets, psw, row_start, mode, pad)
                with cpu_loops(fused):
                    pooled, argmax = _ops._embedding_bag_partial(weight, ids, offsets, psw, row_start, mode, pad)
                self.assertEqual(pooled, expected, msg)
                # Backward: the kernel's gradient equals autograd through the reference.
                grad = torch.randn_like(pooled)
                ref_weight = weight.clone().requires_grad_(True)
                ref = _reference(ref_weight, ids, offsets, psw, row_start, mode, pad)
                finite = torch.isfinite(ref)
                loss = (ref[finite] * grad[finite]).sum()
                if loss.requires_grad:  # else no bag used an owned row: the gradient is zero
                    loss.backward()
                expected_grad = ref_weight.grad if ref_weight.grad is not None else torch.zeros_like(weight)
                with cpu_loops(fused):
                    got = _ops._embedding_bag_partial_backward(
                        grad, ids, offsets, psw, argmax, row_start, weight.size(0), mode, pad, None
                    )
                self.assertEqual(got, expected_grad, f"{msg} backward")

    def test_bfloat16_accumulates_in_float(self):
        weight = torch.full((1, 4), 0.01, dtype=torch.bfloat16)
        ids = torch.zeros(300, dtype=torch.int64)
        offsets = torch.tensor([0])
        pooled, _ = _ops._embedding_bag_partial(weight, ids, offsets, None, 0, "sum", -1)
        self.assertEqual(pooled.float(), torch.full((1, 4), 3.0), atol=0.02, rtol=0)

    def test_max_ties_go_to_the_first_id_of_the_bag_on_every_path(self):
        # NOTE [ Max ties ]: a zero table ties everywhere; the dense op (CPU and CUDA) gives each
        # element's gradient to the first id of the bag holding the maximum, and so do both paths.
        paths = [("cpu", True), ("cpu", False)] + ([("cuda", False)] if torch.cuda.is_available() else [])
        ids, offsets = _ids(7, 2, 5, 2, 9, 3), _ids(0, 3, 3)
        for device, fused in paths:
            weight = torch.zeros(10, 3, device=device)
            weight[2, 1] = -1.0  # in bag 2 (ids 2, 9, 3), column 1's first maximum is id 9's
            with cpu_loops(fused):
                pooled, argmax = _ops._embedding_bag_partial(weight, ids.to(device), offsets.to(device), None, 0, "max", -1)
            self.assertEqual(argmax.cpu(), torch.tensor([[0, 0, 0], [-1, -1, -1], [3, 4, 3]]), f"{device} {fused}")
            grad = torch.arange(1.0, 10.0, device=device).view(3, 3)
            with cpu_loops(fused):
                got = _ops._embedding_bag_partial_backward(
                    grad, ids.to(device), offsets.to(device), None, argmax, 0, 10, "max", -1, None
                )
            dense_weight = weight.clone().requires_grad_(True)
            torch.nn.functional.embedding_bag(
                ids.to(device), dense_weight, offsets.to(device), mode="max"
            ).backward(grad)
            self.assertEqual(got, dense_weight.grad, f"{device} {fused}")

    def test_bad_mode(self):
        with self.assertRaisesRegex(ValueError, "mode must be 'sum' or 'max'"):
            _ops._embedding_bag_partial(torch.zeros(2, 2), torch.zeros(1, dtype=torch.int64), torch.tensor([0]), None, 0, "mean", -1)
        with self.assertRaisesRegex(ValueError, "mode must be 'sum' or 'max'"):
            _ops._embedding_bag_partial_backward(
                torch.zeros(1, 2), torch.zeros(1, dtype=torch.int64), torch.tensor([0]), None, torch.zeros(0, dtype=torch.int64), 0, 2, "mean", -1
            )


def _ids(*values):
    return torch.tensor(values, dtype=torch.int64)


class TestEmbeddingBagPartialPreconditions(TestCase):
    """The kernels are public ops: whatever a direct call passes, they raise instead of reading or
    writing outside a tensor (the fused max loop indexes raw pointers with the offsets)."""

    def _forward_both(self, *args):
        def call(fused, mode):
            with cpu_loops(fused):
                return _ops._embedding_bag_partial(*args[:5], mode, args[5])

        for fused in (True, False):
            for mode in ("sum", "max"):
                yield fused, mode, lambda fused=fused, mode=mode: call(fused, mode)

    def test_bad_offsets_raise_in_every_path(self):
        weight = torch.randn(4, 3)
        ids = _ids(0, 1, 2)
        cases = [
            # The example: 3 ids, offsets [0, 7] (sum mode used to fail in repeat_interleave,
            # the fused max loop read past the end of ids).
            (_ids(0, 7), r"offsets must be within \[0, 3\] \(the number of ids\), but offsets\[1\] = 7"),
            (_ids(0, 2, 1), r"offsets must be non-decreasing, but offsets\[2\] = 1 is less than offsets\[1\] = 2"),
            (_ids(-1, 2), r"offsets must be within \[0, 3\].*offsets\[0\] = -1"),
            (_ids(4), r"offsets\[0\] = 4"),
        ]
        for offsets, pattern in cases:
            for fused, mode, call in self._forward_both(weight, ids, offsets, None, 0, -1):
                with self.subTest(offsets=offsets.tolist(), fused=fused, mode=mode):
                    with self.assertRaisesRegex(RuntimeError, pattern):
                        call()
            for mode in ("sum", "max"):
                with self.subTest(offsets=offsets.tolist(), mode=mode, backward=True):
                    argmax = torch.full((offsets.numel(), 3), -1, dtype=torch.int64)
                    with self.assertRaisesRegex(RuntimeError, pattern):
                        _ops._embedding_bag_partial_backward(
                            torch.ones(offsets.numel(), 3), ids, offsets, None, argmax, 0, 4, mode, -1
                        )

    def test_bad_shapes_types_and_ranges(self):
        weight = torch.randn(4, 3)
        ids, offsets = _ids(0, 1, 2), _ids(0, 1)
        call = _ops._embedding_bag_partial
        with self.assertRaisesRegex(ValueError, "per_sample_weights must be 1-D with one weight per id"):
            call(weight, ids, offsets, torch.ones(2), 0, "sum", -1)
        with self.assertRaisesRegex(ValueError, "per_sample_weights must be 1-D"):
            call(weight, ids, offsets, torch.ones(3, 1), 0, "sum", -1)
        with self.assertRaisesRegex(TypeError, "ids and offsets must be int64"):
            call(weight, ids.int(), offsets, None, 0, "sum", -1)
        with self.assertRaisesRegex(ValueError, "ids and offsets must be 1-D"):
            call(weight, ids.view(1, 3), offsets, None, 0, "sum", -1)
        with self.assertRaisesRegex(ValueError, "weight must be 2-D"):
            call(torch.randn(4), ids, offsets, None, 0, "sum", -1)
        with self.assertRaisesRegex(TypeError, "weight must be a floating point tensor"):
            call(weight.long(), ids, offsets, None, 0, "max", -1)
        with self.assertRaisesRegex(ValueError, "row_start and rows must be non-negative"):
            call(weight, ids, offsets, None, -1, "sum", -1)
        with self.assertRaisesRegex(ValueError, "row_start \\+ rows overflows int64"):
            call(weight, ids, offsets, None, 2**63 - 2, "max", -1)
        with self.assertRaisesRegex(RuntimeError, "same device.*cpu and meta"):
            call(weight, ids.to("meta"), offsets, None, 0, "max", -1)
        with self.assertRaisesRegex(RuntimeError, "same device.*cpu and meta"):
            call(weight, ids, offsets, torch.ones(3, device="meta"), 0, "sum", -1)

    def test_bad_backward_arguments(self):
        ids, offsets = _ids(0, 1, 2), _ids(0, 1)
        grad = torch.ones(2, 3)
        argmax = torch.zeros(2, 3, dtype=torch.int64)
        back = _ops._embedding_bag_partial_backward
        with self.assertRaisesRegex(ValueError, "argmax must have the shape of grad"):
            back(grad, ids, offsets, None, torch.zeros(2, 2, dtype=torch.int64), 0, 4, "max", -1)
        with self.assertRaisesRegex(TypeError, "argmax must be int64"):
            back(grad, ids, offsets, None, argmax.int(), 0, 4, "max", -1)
        # A winner's position outside the ids, or naming an id outside the shard, would read or write
        # outside a tensor (argmax holds positions in ids: NOTE [ Max ties ]).
        with self.assertRaisesRegex(
            ValueError, r"argmax holds positions in \[0, 3\]; expected -1 \(none\) or a position in ids, in \[0, 3\)"
        ):
            back(grad, ids, offsets, None, torch.tensor([[0, 3, 0], [0, 0, 0]]), 0, 4, "max", -1)
        with self.assertRaisesRegex(ValueError, "argmax holds positions in \\[-2"):
            back(grad, ids, offsets, None, torch.full((2, 3), -2), 0, 4, "max", -1)
        with self.assertRaisesRegex(ValueError, r"argmax names a position whose id is outside the shard's rows \[1, 3\)"):
            back(grad, ids, offsets, None, argmax, 1, 2, "max", -1)  # the fused CPU loop
        with self.assertRaisesRegex(ValueError, r"argmax names a position whose id is outside the shard's rows \[1, 3\)"):
            with cpu_loops(False):  # the ATen composition
                back(grad, ids, offsets, None, argmax, 1, 2, "max", -1)
        with self.assertRaisesRegex(ValueError, "grad must have one row per bag"):
            back(torch.ones(3, 3), ids, offsets, None, argmax, 0, 4, "sum", -1)
        with self.assertRaisesRegex(ValueError, "row_start and rows must be non-negative"):
            back(grad, ids, offsets, None, argmax, 0, -1, "sum", -1)
        with self.assertRaisesRegex(ValueError, "rows \\* dim overflows int64"):
            back(grad, ids, offsets, None, argmax, 0, 2**62, "sum", -1)

    def test_edges_that_are_valid(self):
        weight = torch.randn(4, 3, dtype=torch.float64)
        # No bags at all, with ids: nothing to pool (the dense CPU max kernel crashes on this).
        for fused in (True, False):
            for mode in ("sum", "max"):
                with cpu_loops(fused):
                    pooled, argmax = _ops._embedding_bag_partial(weight, _ids(0, 1), _ids(), None, 0, mode, -1)
                    self.assertEqual(pooled.shape, (0, 3))
                    grad = _ops._embedding_bag_partial_backward(
                        pooled, _ids(0, 1), _ids(), None, argmax if mode == "max" else _ids(), 0, 4, mode, -1
                    )
                self.assertEqual(grad, torch.zeros(4, 3, dtype=torch.float64))
        # Offsets equal to the number of ids: trailing empty bags.
        for fused in (True, False):
            with cpu_loops(fused):
                pooled, _ = _ops._embedding_bag_partial(weight, _ids(1, 2), _ids(0, 2, 2), None, 0, "max", -1)
            self.assertEqual(pooled[0], weight[1:3].amax(0))
            self.assertTrue(torch.isinf(pooled[1:]).all())


class TestLookupOpsOnOneRank(TestCase):
    """torch_shard._rowwise_lookup / _colwise_lookup called directly on a one-rank gloo group (made and
    registered by hand, so no default group is needed in this process): results and gradients against
    the dense op, and no output aliasing an input, which a one-rank group would otherwise hand back (its
    own per-sample weights, offsets or ids, reshaped) and which the dispatcher forbids."""

    def setUp(self):
        import torch.distributed as dist
        from torch._C._distributed_c10d import ProcessGroup, _register_process_group

        super().setUp()
        self.group = f"torch_shard_one_rank_{id(self)}"
        # Held here: the registry keeps only a weak reference.
        self.pg = ProcessGroup(dist.HashStore(), 0, 1)
        self.gloo = dist.ProcessGroupGloo(dist.HashStore(), 0, 1)
        self.pg._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, self.gloo)
        _register_process_group(self.group, self.pg)

    def tearDown(self):
        from torch._C._distributed_c10d import _unregister_process_group

        _unregister_process_group(self.group)
        super().tearDown()

    def _check(self, which, mode, loops):
        gen = torch.Generator().manual_seed(3)
        rows, dim = 11, 4
        weight = torch.randn(rows, dim, generator=gen, dtype=torch.float64)
        ids = torch.randint(0, rows, (9,), generator=gen)
        offsets = torch.tensor([0, 3, 3, 7])
        psw = torch.rand(9, generator=gen, dtype=torch.float64) if mode == "sum" else None
        # block_starts, block_sizes, num_embeddings, padding_idx, mode, include_last_offset, needs_grad,
        # fingerprint, arguments
        common = (rows, 2, mode, False, True, 0, [])
        with cpu_loops(loops):
            if which == "rows":
                out, saved = _ops._rowwise_lookup(weight, ids, offsets, psw, [0], [rows], *common, self.group)
                grad_weight = _ops._rowwise_lookup_backward(torch.ones_like(out), saved, 2, mode, self.group)
            else:
                out, saved = _ops._colwise_lookup(weight, ids, offsets, psw, [0], [dim], *common, self.group)
                grad_weight = _ops._colwise_lookup_backward(torch.ones_like(out), saved, 2, mode, self.group)
        dense = weight.clone().requires_grad_(True)
        expected = torch.nn.functional.embedding_bag(ids, dense, offsets, mode=mode, per_sample_weights=psw, padding_idx=2)
        expected.sum().backward()
        where = f"{which} {mode} loops={loops}"
        self.assertEqual(out, expected, msg=where)
        self.assertEqual(grad_weight, dense.grad, msg=where)
        inputs = [t for t in (weight, ids, offsets, psw) if t is not None]
        for t in [out, grad_weight, *saved]:
            if t.numel():
                for given in inputs:
                    self.assertNotEqual(t.untyped_storage().data_ptr(), given.untyped_storage().data_ptr(), where)

    def test_results_gradients_and_no_aliases(self):
        for which in ("rows", "columns"):
            for mode in ("sum", "mean", "max"):
                for loops in (True, False):
                    self._check(which, mode, loops)


if __name__ == "__main__":
    run_tests()
