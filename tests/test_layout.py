"""Tests of torch_shard's C++ layout ops (single process, no process group).

The ops are registered under ``torch.ops.torch_shard`` when ``torch_shard`` is imported:

* ``chunk_layout(dim_size, num_chunks) -> (offsets, lengths)``: ChunkShardingSpec's split of one dim,
  with torch.chunk lengths and upstream's (unclamped) ``split * i`` offsets.
* ``validate_shards(<shards>, global_size_or_None)``: raises ValueError for a bad layout, returns None
  for a good one.
* ``_find_overlap(<shards>) -> []`` or ``[i, j]`` (i < j): a pair of non-empty shards sharing an
  element.

``<shards>`` is N boxes of ndim dims, passed as two (N, ndim) int64 CPU tensors (offsets, sizes).

Shards are half-open boxes ``[offset, offset + size)``. A shard with a zero size on any dim is empty:
it never overlaps anything and is never out of bounds.
"""

import itertools
import math
import random
import unittest

import torch

import torch_shard  # noqa: F401  (registers torch.ops.torch_shard.*)

ops = torch.ops.torch_shard


def _box_args(shards, ndim):
    """[(offsets, sizes), ...] of ``ndim``-dim boxes -> the ops' (offsets, sizes) tensors."""
    n = len(shards)
    offsets = torch.tensor([list(o) for o, _ in shards], dtype=torch.long).reshape(n, ndim)
    sizes = torch.tensor([list(s) for _, s in shards], dtype=torch.long).reshape(n, ndim)
    return [offsets, sizes], {}


def _validate(shards, ndim, global_size):
    args, kwargs = _box_args(shards, ndim)
    return ops.validate_shards(
        *args, global_size=None if global_size is None else list(global_size), **kwargs
    )


def _find_overlap(shards, ndim):
    args, kwargs = _box_args(shards, ndim)
    return list(ops._find_overlap(*args, **kwargs))


# ------------------------------------------------------------------------------------------------
# Brute-force Python reference.


def _is_empty(shard):
    return any(s == 0 for s in shard[1])


def _boxes_overlap(a, b):
    if _is_empty(a) or _is_empty(b):
        return False
    return all(
        ao < bo + bs and bo < ao + as_
        for ao, as_, bo, bs in zip(a[0], a[1], b[0], b[1])
    )


def _ref_overlapping_pairs(shards):
    return {
        (i, j)
        for i, j in itertools.combinations(range(len(shards)), 2)
        if _boxes_overlap(shards[i], shards[j])
    }


def _ref_out_of_bounds(shards, global_size):
    return [
        i
        for i, shard in enumerate(shards)
        if not _is_empty(shard)
        and any(o + s > g for o, s, g in zip(shard[0], shard[1], global_size))
    ]


def _volume(sizes):
    return math.prod(sizes)


def _ref_error(shards, global_size):
    """Substring of the error validate_shards must raise, or None for a valid layout.

    The documented check order is: overlap, then shards outside the tensor, then coverage (total volume).
    Without a global size only the overlap check applies.
    """
    if _ref_overlapping_pairs(shards):
        return "overlap"
    if global_size is None:
        return None
    if _ref_out_of_bounds(shards, global_size):
        return "exceeds tensor dim"
    if sum(_volume(s[1]) for s in shards) != _volume(global_size):
        return "does not match tensor volume"
    return None


# ------------------------------------------------------------------------------------------------
# Random layout generators.


def _guillotine(rng, offsets, sizes, budget):
    """Random recursive guillotine tiling of the box (offsets, sizes): a list of disjoint boxes."""
    splittable = [d for d, s in enumerate(sizes) if s >= 2]
    if not splittable or budget[0] <= 0 or rng.random() < 0.25:
        return [(list(offsets), list(sizes))]
    budget[0] -= 1
    d = rng.choice(splittable)
    cut = rng.randint(1, sizes[d] - 1)
    lo_sizes = list(sizes)
    lo_sizes[d] = cut
    hi_offsets = list(offsets)
    hi_offsets[d] += cut
    hi_sizes = list(sizes)
    hi_sizes[d] -= cut
    return _guillotine(rng, offsets, lo_sizes, budget) + _guillotine(
        rng, hi_offsets, hi_sizes, budget
    )


def _random_empty_shard(rng, global_size):
    ndim = len(global_size)
    offsets = [rng.randint(0, 2 * g + 3) for g in global_size]  # may point past the end
    sizes = [rng.randint(0, g + 3) for g in global_size]
    sizes[rng.randrange(ndim)] = 0
    return (offsets, sizes)


def _random_valid_layout(rng, ndim):
    # Mostly non-empty tensors; now and then one with a zero dim (all shards are then empty).
    global_size = [rng.randint(1, 7) for _ in range(ndim)]
    if rng.random() < 0.05:
        global_size[rng.randrange(ndim)] = 0
    shards = _guillotine(rng, [0] * ndim, global_size, [rng.randint(0, 12)])
    for _ in range(rng.choice([0, 0, 1, 2, 3])):
        shards.append(_random_empty_shard(rng, global_size))
    rng.shuffle(shards)
    return global_size, shards


def _mutate(rng, shards):
    """Returns (mutation name, new shard list), or None if the layout offers nothing to mutate."""
    non_empty = [i for i, s in enumerate(shards) if not _is_empty(s)]
    if not non_empty:
        return None
    shards = [(list(o), list(s)) for o, s in shards]
    i = rng.choice(non_empty)
    ndim = len(shards[i][0])
    d = rng.randrange(ndim)
    kind = rng.choice(["shift", "grow", "drop", "duplicate"])
    if kind == "shift":
        delta = rng.choice([-2, -1, 1, 2])
        shards[i][0][d] = max(0, shards[i][0][d] + delta)
    elif kind == "grow":
        shards[i][1][d] += rng.randint(1, 3)
    elif kind == "drop":
        del shards[i]
    else:
        shards.insert(rng.randint(0, len(shards)), (list(shards[i][0]), list(shards[i][1])))
    return kind, shards


# ------------------------------------------------------------------------------------------------


class TestChunkLayout(unittest.TestCase):
    CASES = [
        # dim_size, num_chunks, offsets, lengths
        (10, 4, [0, 3, 6, 9], [3, 3, 3, 1]),
        (9, 4, [0, 3, 6, 9], [3, 3, 3, 0]),
        (2, 4, [0, 1, 2, 3], [1, 1, 0, 0]),
        (5, 4, [0, 2, 4, 6], [2, 2, 1, 0]),
        (0, 3, [0, 0, 0], [0, 0, 0]),
        (11, 1, [0], [11]),
        (11, 11, list(range(11)), [1] * 11),
        (13, 4, [0, 4, 8, 12], [4, 4, 4, 1]),
        (12, 4, [0, 3, 6, 9], [3, 3, 3, 3]),
        (1, 1, [0], [1]),
    ]

    def test_table(self):
        for dim_size, num_chunks, offsets, lengths in self.CASES:
            with self.subTest(dim_size=dim_size, num_chunks=num_chunks):
                got_offsets, got_lengths = ops.chunk_layout(dim_size, num_chunks)
                self.assertEqual(offsets, list(got_offsets))
                self.assertEqual(lengths, list(got_lengths))

    def test_matches_torch_chunk(self):
        for dim_size in range(0, 41):
            for num_chunks in range(1, 13):
                split = (dim_size + num_chunks - 1) // num_chunks
                # torch.chunk returns fewer chunks when rows run out; the op pads with empty ones.
                chunk_lengths = [
                    c.numel() for c in torch.chunk(torch.empty(dim_size), num_chunks)
                ]
                if dim_size == 0:
                    chunk_lengths = []
                expected_lengths = chunk_lengths + [0] * (num_chunks - len(chunk_lengths))
                expected_offsets = [split * i for i in range(num_chunks)]
                offsets, lengths = ops.chunk_layout(dim_size, num_chunks)
                msg = f"dim_size={dim_size} num_chunks={num_chunks}"
                self.assertEqual(expected_lengths, list(lengths), msg)
                self.assertEqual(expected_offsets, list(offsets), msg)
                # Non-empty chunks are contiguous and cover the dim exactly.
                self.assertEqual(dim_size, sum(lengths), msg)
                for o, n in zip(offsets, lengths):
                    if n:
                        self.assertLessEqual(o + n, dim_size, msg)

    def test_chunk_layout_validates(self):
        # Every chunk layout (as the rows of a 2-D tensor) passes validation, including trailing empty
        # chunks whose offset lies past the end of the dim.
        for dim_size in range(0, 20):
            for num_chunks in range(1, 8):
                offsets, lengths = ops.chunk_layout(dim_size, num_chunks)
                shards = [([o, 0], [n, 3]) for o, n in zip(offsets, lengths)]
                self.assertIsNone(_validate(shards, 2, [dim_size, 3]))
                self.assertEqual([], _find_overlap(shards, 2))


class TestValidateShards(unittest.TestCase):
    def assertInvalid(self, substring, shards, ndim, global_size):
        with self.assertRaisesRegex(ValueError, substring):
            _validate(shards, ndim, global_size)

    def test_valid_layouts(self):
        # Row-wise, grid and uneven layouts from upstream's test_enumerable_sharding_spec.
        self.assertIsNone(_validate([([0, 0], [5, 5]), ([5, 0], [5, 5])], 2, [10, 5]))
        grid = [([0, 0], [3, 3]), ([0, 3], [3, 3]), ([3, 0], [3, 3]), ([3, 3], [3, 3])]
        self.assertIsNone(_validate(grid, 2, [6, 6]))
        uneven = [([0, 0], [2, 4]), ([0, 4], [4, 2]), ([2, 0], [4, 4]), ([4, 4], [2, 2])]
        self.assertIsNone(_validate(uneven, 2, [6, 6]))
        # Without a global size only overlap is checked: a gap is fine.
        self.assertIsNone(_validate([([0, 0], [5, 5]), ([5, 5], [5, 5])], 2, None))
        self.assertIsNone(_validate([([0, 0], [5, 5]), ([5, 0], [5, 5])], 2, None))
        # An empty tensor with no shards at all.
        self.assertIsNone(_validate([], 2, [0, 4]))
        # No shards and no global size: nothing to check.
        self.assertIsNone(_validate([], 2, None))

    def test_error_messages(self):
        # Overlap (upstream's test_check_overlapping cases, 2-D and 3-D).
        self.assertInvalid("overlap", [([0, 0], [5, 5]), ([4, 0], [5, 5])], 2, None)
        self.assertInvalid("overlap", [([0, 0], [5, 5]), ([0, 4], [5, 5])], 2, None)
        self.assertInvalid("overlap", [([0, 0], [3, 3]), ([2, 0], [3, 3])], 2, [5, 3])
        self.assertInvalid(
            "overlap", [([5, 0, 5], [5, 5, 5]), ([5, 4, 5], [5, 5, 5])], 3, None
        )
        self.assertInvalid(
            "overlap", [([5, 0, 5], [5, 5, 5]), ([5, 4, 9], [5, 5, 5])], 3, None
        )
        self.assertIsNone(
            _validate([([5, 0, 5], [5, 5, 5]), ([5, 5, 5], [5, 5, 5])], 3, None)
        )
        self.assertInvalid("Shards.*overlap", [([0], [4]), ([0], [4])], 1, [4])
        # Outside the tensor.
        self.assertInvalid(
            "exceeds tensor dim", [([0, 0], [5, 5]), ([5, 0], [5, 5])], 2, [10, 3]
        )
        # Gap.
        gap = [([0, 0], [5, 5]), ([5, 5], [5, 5])]
        self.assertInvalid("does not match tensor volume", gap, 2, [10, 10])
        self.assertInvalid("do not cover the entire tensor", gap, 2, [10, 10])
        self.assertInvalid("does not match tensor volume", [], 2, [3, 4])
        # Rank mismatch between the shards and the tensor.
        self.assertInvalid(
            "Rank of tensor is.*but shards rank",
            [([0, 0], [5, 5]), ([5, 0], [5, 5])],
            2,
            [10, 10, 10],
        )

    def test_inconsistent_ranks(self):
        # The flat op takes one ndim for all shards; mixed ranks reach the check through the Python
        # validator.
        from torch_shard.sharding_spec import ShardMetadata
        from torch_shard.sharding_spec._internals import (
            validate_non_overlapping_shards_metadata,
        )

        shards = [
            ShardMetadata(shard_offsets=[0, 0], shard_sizes=[1, 1], placement="cpu"),
            ShardMetadata(shard_offsets=[0, 0, 0], shard_sizes=[1, 1, 1], placement="cpu"),
        ]
        with self.assertRaisesRegex(ValueError, "Found inconsistent ranks for shards"):
            validate_non_overlapping_shards_metadata(shards)

    def test_empty_shards(self):
        # Empty shards never overlap, wherever they sit, and are never out of bounds.
        inside = [([0, 0], [4, 4]), ([1, 1], [0, 2]), ([2, 2], [2, 0])]
        self.assertIsNone(_validate(inside, 2, [4, 4]))
        self.assertEqual([], _find_overlap(inside, 2))
        identical_empty = [([0, 0], [4, 4]), ([9, 9], [0, 3]), ([9, 9], [0, 3])]
        self.assertIsNone(_validate(identical_empty, 2, [4, 4]))
        self.assertEqual([], _find_overlap(identical_empty, 2))
        past_end = [([0, 0], [2, 20]), ([3, 0], [0, 20]), ([100, 100], [0, 0])]
        self.assertIsNone(_validate(past_end, 2, [2, 20]))
        # An all-empty layout of an empty tensor.
        self.assertIsNone(_validate([([0, 0], [0, 5]), ([0, 0], [0, 5])], 2, [0, 5]))

    def test_find_overlap(self):
        self.assertEqual([], _find_overlap([], 2))
        self.assertEqual([], _find_overlap([([0, 0], [5, 5])], 2))
        self.assertEqual([0, 1], _find_overlap([([0, 0], [3, 3]), ([2, 0], [3, 3])], 2))
        # Order of the pair is (lower index, higher index) whatever the geometry.
        self.assertEqual(
            [0, 2], _find_overlap([([4, 4], [2, 2]), ([0, 0], [2, 2]), ([3, 3], [2, 2])], 2)
        )
        self.assertEqual([], _find_overlap([([0], [3]), ([3], [3]), ([6], [0])], 1))
        self.assertEqual([1, 2], _find_overlap([([0], [3]), ([3], [3]), ([5], [1])], 1))

    def test_zero_dim(self):
        # A scalar: one shard with offsets [] and sizes [] is a valid layout of global size [];
        # two such shards overlap. The flat op cannot express this case (with ndim 0 its flat arrays
        # are empty whatever the number of shards), so it is checked through the Python validators.
        from torch_shard.sharding_spec import ShardMetadata
        from torch_shard.sharding_spec._internals import (
            check_tensor,
            validate_non_overlapping_shards_metadata,
        )

        scalar = ShardMetadata(shard_offsets=[], shard_sizes=[], placement="rank:0/cpu")
        validate_non_overlapping_shards_metadata([scalar])
        check_tensor([scalar], torch.Size([]))
        other = ShardMetadata(shard_offsets=[], shard_sizes=[], placement="rank:1/cpu")
        with self.assertRaisesRegex(ValueError, "overlap"):
            validate_non_overlapping_shards_metadata([scalar, other])

    def test_zero_dim_ops(self):
        # Global size [], shards with offsets [] and sizes []: one is valid, two overlap.
        scalar = ([], [])
        self.assertIsNone(_validate([scalar], 0, []))
        self.assertIsNone(_validate([scalar], 0, None))
        self.assertEqual([], _find_overlap([scalar], 0))
        self.assertEqual([0, 1], _find_overlap([scalar, scalar], 0))
        with self.assertRaisesRegex(ValueError, "overlap"):
            _validate([scalar, scalar], 0, [])
        with self.assertRaisesRegex(ValueError, "overlap"):
            _validate([scalar, scalar], 0, None)
        # No shard at all leaves the scalar uncovered.
        with self.assertRaisesRegex(ValueError, "does not match tensor volume"):
            _validate([], 0, [])

    def test_randomized_against_reference(self):
        rng = random.Random(20240601)
        counts = {"valid": 0, "shift": 0, "grow": 0, "drop": 0, "duplicate": 0, "invalid": 0}
        for n in range(400):
            ndim = 1 + n % 4
            global_size, shards = _random_valid_layout(rng, ndim)
            layouts = [("valid", shards)]
            for _ in range(2):
                mutated = _mutate(rng, shards)
                if mutated is not None:
                    layouts.append(mutated)
            for kind, layout in layouts:
                counts[kind] += 1
                self._check_layout(kind, layout, ndim, global_size)
                if _ref_error(layout, global_size) is not None:
                    counts["invalid"] += 1
        # The generator exercised both outcomes and every mutation.
        self.assertGreater(counts["valid"], 300)
        self.assertGreater(counts["invalid"], 200)
        for kind in ("shift", "grow", "drop", "duplicate"):
            self.assertGreater(counts[kind], 50, kind)

    def _check_layout(self, kind, shards, ndim, global_size):
        msg = f"{kind}: global_size={global_size} shards={shards}"
        if kind == "valid":
            self.assertIsNone(_ref_error(shards, global_size), msg)  # generator sanity

        pairs = _ref_overlapping_pairs(shards)
        found = _find_overlap(shards, ndim)
        if pairs:
            self.assertEqual(2, len(found), msg)
            i, j = found
            self.assertLess(i, j, msg)
            self.assertIn((i, j), pairs, msg)
            self.assertTrue(_boxes_overlap(shards[i], shards[j]), msg)
        else:
            self.assertEqual([], found, msg)

        for size in (global_size, None):
            expected = _ref_error(shards, size)
            if expected is None:
                self.assertIsNone(_validate(shards, ndim, size), f"{msg} (size={size})")
            else:
                with self.assertRaisesRegex(ValueError, expected, msg=f"{msg} (size={size})"):
                    _validate(shards, ndim, size)


if __name__ == "__main__":
    unittest.main()
