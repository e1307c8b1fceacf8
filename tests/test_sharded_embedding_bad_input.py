"""Sharded embedding / embedding_bag reject bad inputs before any exchange, on every rank.

Every rank passes its own input, and offsets and ids are shipped to every owner of the weight, so one
rank's bad input would reach every rank's kernel. Each case here gives the bad input to ONE rank (the
others pass good inputs) and checks that the bad rank raises the dense op's exception (type and
message, where torch has one; upstream's sharded-op messages where upstream checks), and that every
other rank raises the same class naming that rank instead of waiting for it. After all the cases the
group is still in step: a valid call on every rank equals the dense op.
"""

import itertools

import torch
import torch.nn.functional as F

from torch_shard import _shard_tensor
from torch_shard.sharding_spec import ChunkShardingSpec
from torch_shard.testing import ShardedTensorTestBase, cpu_loops, placement, rank_device, run_tests, with_comms

BAD_RANK = 1
NUM_EMBEDDINGS, EMBEDDING_DIM = 10, 4


def _long(*values, device="cpu"):
    return torch.tensor(values, dtype=torch.int64, device=device)


def _float_ids_message(op: str, device) -> str:
    """The dense op's message for float ids on ``device``: CUDA names the type torch.cuda.FloatTensor,
    and its embedding_bag kernel may check under its own name (embedding_bag_cuda)."""
    if torch.device(device).type == "cpu":
        type_name, checked_by = r"torch\.FloatTensor", op
    else:
        type_name, checked_by = rf"torch\.{torch.device(device).type}\.FloatTensor", rf"{op}(_\w+)?"
    return (
        r"Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, "
        rf"Int; but got {type_name} instead \(while checking arguments for {checked_by}\)"
    )


def _on_cpu(device, pattern):
    """``pattern`` where the dense op checks on ``device``: the CPU kernels check offsets (values) and
    per-sample-weight dtypes on the host; the CUDA kernels do not read offsets on the host and word
    their checks their own way, so there the sharded op's error is not compared with the dense op's."""
    return pattern if torch.device(device).type == "cpu" else None


class TestEmbeddingInputValidation(ShardedTensorTestBase):
    def _weights(self):
        """(sharded dim, dense weight, sharded weight), row- and column-wise, placements out of rank order."""
        torch.manual_seed(0)
        dense = torch.randn(NUM_EMBEDDINGS, EMBEDDING_DIM, device=rank_device(self.rank))
        for dim in (0, 1):
            spec = ChunkShardingSpec(dim=dim, placements=[placement(r) for r in (2, 0, 3, 1)])
            yield dim, dense, _shard_tensor(dense.clone(), spec)

    def _check_case(self, fn, weight, dense, good, bad, cls, pattern, dense_pattern, peer_cls=None):
        """Rank BAD_RANK calls ``fn(*bad[0], weight, **bad[1])``, the others the good arguments."""
        if self.rank == BAD_RANK:
            with self.assertRaisesRegex(cls, pattern):
                fn(*bad[0], weight, **bad[1])
            if dense_pattern is not None:  # the same exception as the dense op
                with self.assertRaisesRegex(cls, dense_pattern):
                    fn(*bad[0], dense, **bad[1])
        else:
            # The peers name the bad rank AND say what is wrong there: its exception's class and message
            # (NOTE [ Reasons travel ] in csrc/comm/reasons.cpp).
            with self.assertRaisesRegex(
                peer_cls or cls, f"rank {BAD_RANK} of the process group rejected its arguments \\({cls.__name__}: "
            ) as caught:
                fn(*good[0], weight, **good[1])
            self.assertRegex(str(caught.exception), pattern)

    def _embedding_bag_cases(self, device):
        ids = _long(1, 2, 3, device=device)
        good = ((ids,), {"offsets": _long(0, 1, device=device), "mode": "sum"})

        def bag(input, **kwargs):
            kwargs.setdefault("offsets", _long(0, 1, device=device))
            kwargs.setdefault("mode", "sum")
            return ((input,), kwargs)

        past_end = r"offsets\[-1\] can not be greater than input's length 3 but got offsets\[-1\] of 7"
        psw = torch.ones(3, device=device)
        meta_ids = ids.to("meta")
        return good, [
            # (bad arguments, class, pattern, pattern the dense op raises with or None)
            # The example: the fused CPU max kernel read past the end of ids.
            (bag(ids, offsets=_long(0, 7, device=device), mode="max"), RuntimeError, past_end, _on_cpu(device, past_end)),
            (bag(ids, offsets=_long(0, 7, device=device)), RuntimeError, past_end, _on_cpu(device, past_end)),
            (bag(ids, offsets=_long(0, 7, device=device), mode="mean"), RuntimeError, past_end, _on_cpu(device, past_end)),
            # Dense max accepts decreasing offsets (and sum fails with an internal assertion).
            (
                bag(ids, offsets=_long(0, 2, 1, device=device), mode="max"),
                RuntimeError,
                r"offsets has to be non-decreasing, but offsets\[2\] = 1 is less than offsets\[1\] = 2",
                None,
            ),
            (
                bag(ids, offsets=_long(0, 3, 2, 3, device=device)),
                RuntimeError,
                r"offsets\[2\] = 2 is less than offsets\[1\] = 3",
                None,
            ),
            (
                bag(ids, offsets=_long(1, 2, device=device)),
                RuntimeError,
                r"offsets\[0\] has to be 0, i.e., the first sequence in the mini-batch has to start from "
                r"position 0. However, got 1",
                _on_cpu(device, r"offsets\[0\] has to be 0"),
            ),
            (
                bag(ids, offsets=_long(-1, 2, device=device)),
                RuntimeError,
                r"offsets\[0\] has to be 0.*got -1",
                None,
            ),
            (
                bag(ids, offsets=_long(device=device), include_last_offset=True),
                RuntimeError,
                "include_last_offset: number of offset should be at least 1",
                _on_cpu(device, "include_last_offset: number of offset should be at least 1"),
            ),
            # Upstream's sharded op requires the last offset to be the input length.
            (
                bag(ids, offsets=_long(0, 2, device=device), include_last_offset=True),
                ValueError,
                'offsets need to have the input size in the end when the flag "include_last_offset" is on!',
                None,
            ),
            (
                bag(ids, offsets=_long(0, 1, device=device).view(1, 2)),
                ValueError,
                "offsets has to be a 1D Tensor",
                "offsets has to be a 1D Tensor",
            ),
            (
                bag(ids, offsets=torch.tensor([0.0, 1.0], device=device)),
                RuntimeError,
                "Expected tensor for argument #1 'offsets' to have one of the following scalar types: Long, Int",
                None,
            ),
            (bag(ids, offsets=[0, 1]), TypeError, "offsets need to be torch.Tensor", None),
            (bag(ids, offsets=None), ValueError, "offsets is required for 1D input", None),
            (
                bag(ids.float()),
                RuntimeError,
                _float_ids_message("embedding_bag", device),
                _float_ids_message("embedding_bag", device),
            ),
            # Inputs on another device than this rank's shard (the dense op does not check "meta").
            (bag(meta_ids), RuntimeError, "Expected all tensors to be on the same device.*input is on meta", None),
            (
                bag(ids, offsets=_long(0, 1, device="meta")),
                RuntimeError,
                "Expected all tensors to be on the same device.*offsets is on meta",
                None,
            ),
            (
                bag(ids, per_sample_weights=psw.to("meta")),
                RuntimeError,
                "Expected all tensors to be on the same device.*per_sample_weights is on meta",
                None,
            ),
            (
                bag(ids, per_sample_weights=torch.ones(2, device=device)),
                ValueError,
                r"per_sample_weights size torch.Size\(\[2\]\) not equal to input size torch.Size\(\[3\]\)",
                "must have the same shape as the input",
            ),
            (
                bag(ids, per_sample_weights=psw.double()),
                RuntimeError,
                "Expected tensor for argument #1 'weight' to have the same type as tensor for argument #1 "
                "'per_sample_weights'",
                _on_cpu(
                    device,
                    "Expected tensor for argument #1 'weight' to have the same type as tensor for argument #1 "
                    "'per_sample_weights'",
                ),
            ),
            (
                bag(ids, per_sample_weights=psw, mode="mean"),
                NotImplementedError,
                r"per_sample_weights is only supported for mode='sum' \(got mode='mean'\)",
                r"per_sample_weights is only supported for mode='sum' \(got mode='mean'\)",
            ),
            (bag(ids, per_sample_weights=[1.0] * 3), TypeError, "per_sample_weights need to be torch.Tensor", None),
            (
                bag(_long(1, 10, 3, device=device)),
                ValueError,
                "Index out of range in Input 1 10 10",
                None,
            ),
            (bag(_long(-1, 2, 3, device=device)), ValueError, "Index out of range in Input -1 3", None),
            (
                bag(ids, padding_idx=10),
                RuntimeError,
                "padding_idx must be within the number of embeddings, -10 through 9, but got 10",
                "padding_idx must be within the number of embeddings, -10 through 9, but got 10",
            ),
            (
                bag(ids, padding_idx=-11),
                RuntimeError,
                "padding_idx must be within the number of embeddings, -10 through 9, but got -11",
                "padding_idx must be within the number of embeddings, -10 through 9, but got -11",
            ),
            (
                bag(torch.tensor(1, device=device)),
                ValueError,
                "input has to be 1D or 2D Tensor, but got Tensor of dimension 0",
                "input has to be 1D or 2D Tensor, but got Tensor of dimension 0",
            ),
            (bag(ids.view(1, 1, 3), offsets=None), ValueError, "Input more than 2 dims not supported", None),
            (bag(ids.view(1, 3)), ValueError, "Input dimension needs to be exactly 1 dim", None),
            # Bags of no ids in a 2-D input: the dense op's offsets would step by 0.
            (bag(ids[:0].view(2, 0), offsets=None), RuntimeError, "step must be nonzero", "step must be nonzero"),
            (bag(ids, mode="foo"), ValueError, "mode 'foo' is not supported", None),
            # The dense op rejects None too ("mode has to be one of sum, mean or max").
            (bag(ids, mode=None), ValueError, "mode 'None' is not supported", None),
        ]

    @with_comms(init_rpc=False)
    def test_embedding_bag_bad_input_raises_on_every_rank(self):
        device = rank_device(self.rank)
        for dim, dense, weight in self._weights():
            good, cases = self._embedding_bag_cases(device)
            # On both paths: the CPU's loops and the ATen composition every other device takes.
            for (bad, cls, pattern, dense_pattern), fused in itertools.product(cases, (True, False)):
                with self.subTest(dim=dim, pattern=pattern, fused=fused), cpu_loops(fused):
                    self._check_case(F.embedding_bag, weight, dense, good, bad, cls, pattern, dense_pattern)
            # Still in step: a valid call on every rank equals the dense op.
            ids = torch.randint(0, NUM_EMBEDDINGS, (7,), generator=torch.Generator().manual_seed(self.rank))
            offsets = _long(0, 2, 2, 5)  # both moved to this rank's device below
            for mode in ("sum", "mean", "max"):
                self.assertEqual(
                    F.embedding_bag(ids.to(device), weight, offsets.to(device), mode=mode),
                    F.embedding_bag(ids.to(device), dense, offsets.to(device), mode=mode),
                )

    @with_comms(init_rpc=False)
    def test_embedding_bad_input_raises_on_every_rank(self):
        device = rank_device(self.rank)
        ids = _long(1, 2, 3, 4, device=device).view(2, 2)
        good = ((ids,), {})
        cases = [
            (
                ((ids.float(),), {}),
                RuntimeError,
                _float_ids_message("embedding", device),
                _float_ids_message("embedding", device),
                None,
            ),
            (
                ((ids.to("meta"),), {}),
                RuntimeError,
                "Expected all tensors to be on the same device.*input is on meta",
                None,
                None,
            ),
            # The dense op asserts; the other ranks raise RuntimeError (an AssertionError is no class
            # the agreement carries).
            (
                ((ids,), {"padding_idx": 10}),
                AssertionError,
                "Padding_idx must be within num_embeddings",
                "Padding_idx must be within num_embeddings",
                RuntimeError,
            ),
            (
                ((ids,), {"padding_idx": -11}),
                AssertionError,
                "Padding_idx must be within num_embeddings",
                "Padding_idx must be within num_embeddings",
                RuntimeError,
            ),
            (((ids + 7,), {}), ValueError, "Index out of range in Input 8 11 10", None, None),
            (((ids,), {"max_norm": -1.0}), ValueError, '"max_norm" must be larger than zero!', None, None),
            (((ids,), {"sparse": True}), RuntimeError, 'flag on "sparse" not supported!', None, None),
        ]
        for dim, dense, weight in self._weights():
            for (bad, cls, pattern, dense_pattern, peer_cls), fused in itertools.product(cases, (True, False)):
                with self.subTest(dim=dim, pattern=pattern, fused=fused), cpu_loops(fused):
                    self._check_case(F.embedding, weight, dense, good, bad, cls, pattern, dense_pattern, peer_cls)
            mine = torch.randint(0, NUM_EMBEDDINGS, (3, 2), generator=torch.Generator().manual_seed(self.rank))
            self.assertEqual(F.embedding(mine.to(device), weight), F.embedding(mine.to(device), dense))

    @with_comms(init_rpc=False)
    def test_lookup_arguments_that_differ_across_ranks_raise_on_every_rank(self):
        """Each rank computes the other ranks' lookups with its own mode, padding_idx and max_norm
        (norm_type with it): ranks that differ raise ValueError on every rank before any data moves or
        any row is renormalised (otherwise results differ silently, and max_norm on some ranks only
        adds a collective there). The same arguments written differently agree."""
        device = rank_device(self.rank)
        ids = _long(1, 2, 3, 4, device=device)
        offsets = _long(0, 2, device=device)
        # (op, arguments on every other rank, arguments on BAD_RANK)
        differing = [
            (F.embedding_bag, {"offsets": offsets, "mode": "sum"}, {"offsets": offsets, "mode": "max"}),
            (F.embedding_bag, {"offsets": offsets, "mode": "sum"}, {"offsets": offsets, "mode": "sum", "padding_idx": 2}),
            (F.embedding_bag, {"offsets": offsets}, {"offsets": offsets, "max_norm": 1.0}),
            (
                F.embedding_bag,
                {"offsets": offsets, "max_norm": 1.0},
                {"offsets": offsets, "max_norm": 1.0, "norm_type": 1.0},
            ),
            (F.embedding, {}, {"padding_idx": 3}),
            (F.embedding, {}, {"max_norm": 2.0}),
            (F.embedding, {"max_norm": 2.0}, {"max_norm": 0.5}),
        ]
        # Equal on every rank, however written: padding_idx -1 is row 9, norm_type without max_norm
        # means nothing, mode "mean" is the default.
        agreeing = [
            (F.embedding_bag, {"offsets": offsets, "padding_idx": 9}, {"offsets": offsets, "padding_idx": -1}),
            (F.embedding_bag, {"offsets": offsets}, {"offsets": offsets, "norm_type": 1.0, "mode": "mean"}),
            (F.embedding, {"padding_idx": 9}, {"padding_idx": -1}),
            (F.embedding, {}, {"norm_type": 3.0}),
        ]
        other = 0 if self.rank == BAD_RANK else BAD_RANK
        for dim, dense, weight in self._weights():
            shard = weight.local_shards()[0].tensor
            before = shard.clone()
            for fn, good, bad in differing:
                with self.subTest(dim=dim, op=fn.__name__, bad=sorted(bad)):
                    with self.assertRaisesRegex(
                        ValueError,
                        f"the arguments on rank {self.rank} do not match with the arguments on rank {other} "
                        r"\(mode, padding_idx, max_norm or norm_type",
                    ):
                        fn(ids, weight, **(bad if self.rank == BAD_RANK else good))
                    self.assertEqual(shard, before)
            for fn, good, bad in agreeing:
                with self.subTest(dim=dim, op=fn.__name__, agreeing=sorted(bad)):
                    kwargs = bad if self.rank == BAD_RANK else good
                    self.assertEqual(fn(ids, weight, **kwargs), fn(ids, dense, **kwargs))

    @with_comms(init_rpc=False)
    def test_embedding_bag_edge_inputs_match_dense(self):
        """Valid inputs at the edges: no bags (on some ranks or all), trailing empty bags, int32 ids and
        offsets, include_last_offset with no ids."""
        device = rank_device(self.rank)
        for dim, dense, weight in self._weights():
            for mode in ("sum", "mean", "max"):
                msg = f"dim {dim} mode {mode}"
                # No bags on any rank, but ids (the dense CPU max kernel crashes on this one).
                out = F.embedding_bag(_long(1, 2, device=device), weight, _long(device=device), mode=mode)
                self.assertEqual(out, torch.zeros(0, EMBEDDING_DIM, device=device), msg)
                # No bags on rank 0 only: its ids belong to no bag and must not land in another
                # rank's bags.
                if self.rank == 0:
                    ids, offsets = _long(5, 6, 7, device=device), _long(device=device)
                else:
                    ids, offsets = _long(1, 2, self.rank, 9, device=device), _long(0, 1, 4, 4, device=device)
                out = F.embedding_bag(ids, weight, offsets, mode=mode)
                expected = (
                    torch.zeros(0, EMBEDDING_DIM, device=device)
                    if offsets.numel() == 0
                    else F.embedding_bag(ids, dense, offsets, mode=mode)
                )
                self.assertEqual(out, expected, msg)
                # int32 ids and offsets; include_last_offset with no ids at all.
                ids32, off32 = _long(3, 1, 4, 1, 5, device=device).int(), _long(0, 2, 5, device=device).int()
                self.assertEqual(
                    F.embedding_bag(ids32, weight, off32, mode=mode, include_last_offset=True),
                    F.embedding_bag(ids32, dense, off32, mode=mode, include_last_offset=True),
                    msg,
                )
                self.assertEqual(
                    F.embedding_bag(_long(device=device), weight, _long(0, device=device), mode=mode, include_last_offset=True),
                    torch.zeros(0, EMBEDDING_DIM, device=device),
                    msg,
                )


if __name__ == "__main__":
    run_tests()
