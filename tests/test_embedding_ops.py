"""The C++ kernel behind row-wise sharded embedding_bag, single process, against a Python reference.

``torch.ops.torch_shard._embedding_bag_partial`` pools, per bag, the rows a weight shard owns; its
fused CPU loops and the ATen composition other devices use (``fused=False``) must agree with each
other and with a straightforward reference, forward and backward.
"""

import random

import torch

import torch_shard  # noqa: F401  (registers the ops)
from torch_shard.testing import TestCase, run_tests

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
            outs.append(torch.full((dim,), fill, dtype=weight.dtype))
        elif mode == "sum":
            outs.append(torch.stack(picked).sum(0))
        else:
            outs.append(torch.stack(picked).amax(0))
    return torch.stack(outs) if outs else torch.zeros(0, dim, dtype=weight.dtype)


class TestEmbeddingBagPartial(TestCase):
    def _case(self, rng, mode, weighted, dtype):
        rows, dim, vocab = rng.randint(1, 9), rng.randint(1, 6), 30
        row_start = rng.randint(0, vocab - rows)
        n = rng.randint(0, 25)
        ids = torch.tensor([rng.randrange(vocab) for _ in range(n)], dtype=torch.int64)
        cuts = sorted(rng.randint(0, n) for _ in range(rng.randint(1, 6)))
        offsets = torch.tensor([0] + cuts, dtype=torch.int64)  # may contain empty bags
        psw = torch.rand(n, dtype=dtype) if weighted else None
        padding_idx = rng.choice([-1, row_start, row_start + rows // 2])
        weight = torch.randn(rows, dim, dtype=dtype)
        return weight, ids, offsets, psw, row_start, padding_idx

    def test_forward_and_backward_match_reference(self):
        rng = random.Random(0)
        for trial in range(120):
            mode = "max" if trial % 3 == 0 else "sum"
            dtype = torch.float64 if trial % 2 else torch.float32
            weight, ids, offsets, psw, row_start, pad = self._case(rng, mode, trial % 4 == 1, dtype)
            expected = _reference(weight, ids, offsets, psw, row_start, mode, pad)
            for fused in (True, False):
                pooled, argmax = _ops._embedding_bag_partial(weight, ids, offsets, psw, row_start, mode, pad, fused)
                self.assertEqual(pooled, expected, f"trial {trial} fused={fused}")
                # Backward: the kernel's gradient equals autograd through the reference.
                grad = torch.randn_like(pooled)
                ref_weight = weight.clone().requires_grad_(True)
                ref = _reference(ref_weight, ids, offsets, psw, row_start, mode, pad)
                finite = torch.isfinite(ref)
                loss = (ref[finite] * grad[finite]).sum()
                if loss.requires_grad:  # else no bag used an owned row: the gradient is zero
                    loss.backward()
                expected_grad = ref_weight.grad if ref_weight.grad is not None else torch.zeros_like(weight)
                got = _ops._embedding_bag_partial_backward(
                    grad, ids, offsets, psw, argmax, row_start, weight.size(0), mode, pad
                )
                self.assertEqual(got, expected_grad, f"trial {trial} fused={fused} backward")

    def test_bfloat16_accumulates_in_float(self):
        weight = torch.full((1, 4), 0.01, dtype=torch.bfloat16)
        ids = torch.zeros(300, dtype=torch.int64)
        offsets = torch.tensor([0])
        pooled, _ = _ops._embedding_bag_partial(weight, ids, offsets, None, 0, "sum", -1)
        self.assertEqual(pooled.float(), torch.full((1, 4), 3.0), atol=0.02, rtol=0)

    def test_bad_mode(self):
        with self.assertRaisesRegex(ValueError, "mode must be 'sum' or 'max'"):
            _ops._embedding_bag_partial(torch.zeros(2, 2), torch.zeros(1, dtype=torch.int64), torch.tensor([0]), None, 0, "mean", -1)


if __name__ == "__main__":
    run_tests()
