"""unittest.TestCase with an assertEqual that understands tensors and sequences."""

from __future__ import annotations

import unittest
from collections.abc import Mapping

import torch


class TestCase(unittest.TestCase):
    """``assertEqual`` compares tensors by value (``torch.testing.assert_close``), and lists, tuples and
    ``torch.Size`` element-wise, so ``assertEqual((3, 20), t.size())`` and ``assertEqual(t, expected)``
    read as they do in PyTorch's own tests."""

    def assertEqual(self, first, second, msg=None, *, atol=None, rtol=None, exact_dtype=True, exact_device=False):  # noqa: N802
        if isinstance(first, torch.Tensor) or isinstance(second, torch.Tensor):
            actual = first if isinstance(first, torch.Tensor) else torch.as_tensor(first)
            expected = second if isinstance(second, torch.Tensor) else torch.as_tensor(second)
            if not (isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor)):
                exact_dtype = False
            try:
                torch.testing.assert_close(
                    actual,
                    expected,
                    rtol=rtol,
                    atol=atol,
                    equal_nan=True,
                    check_device=exact_device,
                    check_dtype=exact_dtype,
                )
            except AssertionError as exc:
                raise self.failureException(f"{exc}" + (f" : {msg}" if msg else "")) from None
            return
        sequence = (list, tuple, torch.Size)
        if isinstance(first, sequence) and isinstance(second, sequence):
            super().assertEqual(len(first), len(second), msg or f"{first} != {second} (lengths differ)")
            for a, b in zip(first, second):
                self.assertEqual(a, b, msg or f"{first} != {second}", atol=atol, rtol=rtol, exact_dtype=exact_dtype)
            return
        if isinstance(first, Mapping) and isinstance(second, Mapping):
            super().assertEqual(set(first.keys()), set(second.keys()), msg)
            for key in first:
                self.assertEqual(first[key], second[key], msg, atol=atol, rtol=rtol, exact_dtype=exact_dtype)
            return
        super().assertEqual(first, second, msg)
