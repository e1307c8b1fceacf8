"""Property tests of the C++ layout math against brute-force oracles (hypothesis).

* Validation: for random shard lists on small grids (empty shards, shards past the end, gaps,
  overlaps), ``validate_shards`` raises ValueError exactly when painting the shards cell by cell
  says the layout is invalid.
* Values near the int64 limit: offsets, sizes and volumes that overflow int64 raise ValueError naming
  the shard; they never wrap around, crash or pass.
* Chunk math: ``chunk_layout`` / ``chunk_boxes`` follow torch.chunk (upstream ChunkShardingSpec).
* Planning: the elements a rank sends to and receives from each rank when data moves between two
  random layouts equal the brute-force sum of box intersections.

Single process, no process group.
"""

from __future__ import annotations

import itertools
from math import prod

import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import torch_shard  # noqa: F401  (registers torch.ops.torch_shard)

ops = torch.ops.torch_shard
INT64_MAX = 2**63 - 1
PROFILE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _tensors(boxes):
    ndim = len(boxes[0][0]) if boxes else 0
    offsets = torch.tensor([list(o) for o, _ in boxes], dtype=torch.int64).view(len(boxes), ndim)
    sizes = torch.tensor([list(s) for _, s in boxes], dtype=torch.int64).view(len(boxes), ndim)
    return offsets, sizes


def _cells(offsets, sizes):
    return itertools.product(*(range(o, o + s) for o, s in zip(offsets, sizes)))


def oracle_valid(boxes, global_size) -> bool:
    """Paint every non-empty shard cell by cell: valid iff no cell is painted twice and, with a global
    size, every painted cell is inside the tensor and every tensor cell is painted."""
    painted: dict[tuple, int] = {}
    for offsets, sizes in boxes:
        if 0 in sizes:
            continue
        for cell in _cells(offsets, sizes):
            painted[cell] = painted.get(cell, 0) + 1
    if any(count > 1 for count in painted.values()):
        return False
    if global_size is None:
        return True
    inside = all(all(c < g for c, g in zip(cell, global_size)) for cell in painted)
    return inside and len(painted) == prod(global_size)


def box_strategy(ndim: int, extent: int):
    return st.tuples(
        st.tuples(*[st.integers(0, extent + 1)] * ndim), st.tuples(*[st.integers(0, extent)] * ndim)
    )


@st.composite
def shard_lists(draw):
    ndim = draw(st.integers(1, 3))
    extent = draw(st.integers(1, 4))
    global_size = tuple(draw(st.integers(0, extent)) for _ in range(ndim))
    boxes = draw(st.lists(box_strategy(ndim, extent), min_size=1, max_size=6))
    return global_size, boxes


@st.composite
def tilings(draw, size, max_shards=6):
    """A random guillotine tiling of `size` (valid by construction), plus a few empty shards anywhere."""
    boxes = [((0,) * len(size), tuple(size))]
    for _ in range(draw(st.integers(0, max_shards - 1))):
        i = draw(st.integers(0, len(boxes) - 1))
        offsets, sizes = boxes[i]
        splittable = [d for d, s in enumerate(sizes) if s >= 2]
        if not splittable:
            continue
        d = draw(st.sampled_from(splittable))
        cut = draw(st.integers(1, sizes[d] - 1))
        first = (offsets, tuple(cut if k == d else s for k, s in enumerate(sizes)))
        second = (
            tuple(o + cut if k == d else o for k, o in enumerate(offsets)),
            tuple(s - cut if k == d else s for k, s in enumerate(sizes)),
        )
        boxes[i : i + 1] = [first, second]
    for _ in range(draw(st.integers(0, 2))):
        offsets = tuple(draw(st.integers(0, s + 2)) for s in size)
        sizes = tuple(draw(st.integers(0, s)) for s in size)
        d = draw(st.integers(0, len(size) - 1))
        boxes.append((offsets, tuple(0 if k == d else s for k, s in enumerate(sizes))))
    return draw(st.permutations(boxes))


class TestValidationProperties:
    @PROFILE
    @given(shard_lists(), st.booleans())
    def test_matches_painting(self, case, with_size):
        global_size, boxes = case
        expected = oracle_valid(boxes, global_size if with_size else None)
        offsets, sizes = _tensors(boxes)
        try:
            ops.validate_shards(offsets, sizes, list(global_size) if with_size else None)
            valid = True
        except ValueError:
            valid = False
        assert valid == expected, (global_size, boxes, with_size)

    @PROFILE
    @given(st.data())
    def test_valid_tilings_pass(self, data):
        size = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
        boxes = data.draw(tilings(size))
        ops.validate_shards(*_tensors(boxes), size)

    @PROFILE
    @given(
        st.integers(INT64_MAX - 8, INT64_MAX),
        st.integers(1, 16),
        st.integers(0, 3),
    )
    def test_ends_that_overflow_raise(self, offset, size, other):
        # offset + size > INT64_MAX must be refused, naming the shard, never wrap around.
        assume(offset + size > INT64_MAX)
        boxes = [((0, 0), (1, 1)), ((offset, other), (size, 1))]
        offsets, sizes = _tensors(boxes)
        for global_size in (None, [2**62, 4]):
            try:
                ops.validate_shards(offsets, sizes, global_size)
            except ValueError as exc:
                assert "overflows int64" in str(exc) and "#1" in str(exc), str(exc)
            else:
                raise AssertionError(f"accepted {boxes} with size {global_size}")

    @PROFILE
    @given(st.lists(st.integers(2**20, 2**40), min_size=2, max_size=4))
    def test_volumes_that_overflow_raise(self, sizes):
        assume(prod(sizes) > INT64_MAX)
        boxes = [(tuple(0 for _ in sizes), tuple(sizes))]
        try:
            ops.validate_shards(*_tensors(boxes), list(sizes))
        except ValueError as exc:
            assert "int64" in str(exc), str(exc)
        else:
            raise AssertionError(f"accepted a shard of {prod(sizes)} elements")

    def test_issue_examples(self):
        # The two cases the hardening issue reported: a shard at INT64_MAX was accepted, and volumes
        # near 2**62 summed to a negative total.
        offsets, sizes = _tensors([((INT64_MAX, 0), (2, 2)), ((0, 0), (2, 2))])
        try:
            ops.validate_shards(offsets, sizes)
        except ValueError as exc:
            assert "overflows int64" in str(exc)
        else:
            raise AssertionError("accepted an end past INT64_MAX")
        offsets, sizes = _tensors([((0,), (2**62,)), ((2**62,), (2**62,)), ((2**63 - 2**62,), (2**62 - 1,))])
        try:
            ops.validate_shards(offsets, sizes, [2**63 - 1])
        except ValueError as exc:
            assert "-9223372036854775808" not in str(exc), str(exc)
        else:
            raise AssertionError("accepted shards whose volumes do not add up")


class TestChunkProperties:
    @PROFILE
    @given(st.integers(0, 200), st.integers(1, 40))
    def test_chunk_layout_follows_torch_chunk(self, dim_size, chunks):
        offsets, lengths = ops.chunk_layout(dim_size, chunks)
        split = -(-dim_size // chunks)
        assert offsets == [split * i for i in range(chunks)]
        assert lengths == [max(0, min(split, dim_size - split * i)) for i in range(chunks)]
        # The non-empty chunks are exactly torch.chunk's.
        expected = [len(c) for c in torch.arange(dim_size).chunk(chunks)] if dim_size else []
        assert [n for n in lengths if n] == [n for n in expected if n]

    @PROFILE
    @given(st.lists(st.integers(0, 9), min_size=1, max_size=4), st.data())
    def test_chunk_boxes_tile_the_tensor(self, size, data):
        dim = data.draw(st.integers(-len(size), len(size) - 1))
        chunks = data.draw(st.integers(1, 6))
        offsets, sizes = ops.chunk_boxes(size, dim, chunks)
        assert offsets.shape == (chunks, len(size))
        ops.validate_shards(offsets, sizes, size)

    def test_chunk_offsets_never_overflow(self):
        offsets, lengths = ops.chunk_layout(INT64_MAX, 3)
        assert sum(lengths) == INT64_MAX and offsets[-1] < INT64_MAX


class TestPlanningProperties:
    @PROFILE
    @given(st.data())
    def test_transfer_counts_match_intersections(self, data):
        size = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
        world = data.draw(st.integers(1, 4))
        src = data.draw(tilings(size))
        dst = data.draw(tilings(size))
        src_owners = data.draw(st.lists(st.integers(0, world - 1), min_size=len(src), max_size=len(src)))
        dst_owners = data.draw(st.lists(st.integers(0, world - 1), min_size=len(dst), max_size=len(dst)))

        def overlap(a, b):
            return prod(max(0, min(ao + asz, bo + bsz) - max(ao, bo)) for ao, asz, bo, bsz in zip(*a, *b))

        for me in range(world):
            send, recv = ops._transfer_counts(
                size, *_tensors(src), src_owners, *_tensors(dst), dst_owners, me, world
            )
            want_send = [0] * world
            want_recv = [0] * world
            for s, so in zip(src, src_owners):
                for d, do in zip(dst, dst_owners):
                    v = overlap(s, d)
                    if so == me:
                        want_send[do] += v
                    if do == me:
                        want_recv[so] += v
            assert list(send) == want_send, (me, src, src_owners, dst, dst_owners)
            assert list(recv) == want_recv, (me, src, src_owners, dst, dst_owners)
        # Conservation: what everyone sends is what everyone receives, and it is the whole tensor.
        total = sum(sum(ops._transfer_counts(size, *_tensors(src), src_owners, *_tensors(dst), dst_owners, m, world)[0]) for m in range(world))
        assert total == prod(size)

    @PROFILE
    @given(st.data())
    def test_replicated_boxes_are_supplied_once_per_target(self, data):
        # NOTE [ Replicated source shards ]: a box held by several ranks reaches each target shard from
        # one of them, the target's own rank where it holds a copy, else replica (target index mod n).
        size = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
        world = data.draw(st.integers(1, 4))

        def replicated(tiling):
            boxes, owners = [], []
            for box in tiling:
                holders = data.draw(st.lists(st.integers(0, world - 1), min_size=1, max_size=3))
                boxes += [box] * len(holders)
                owners += holders
            return boxes, owners

        src, src_owners = replicated(data.draw(tilings(size)))
        dst, dst_owners = replicated(data.draw(tilings(size)))

        def overlap(a, b):
            return prod(max(0, min(ao + asz, bo + bsz) - max(ao, bo)) for ao, asz, bo, bsz in zip(*a, *b))

        def key(i):
            return (list(src[i][0]), list(src[i][1]), src_owners[i], i)

        groups = {}
        for i, box in enumerate(src):
            if prod(box[1]) > 0:
                groups.setdefault((tuple(box[0]), tuple(box[1])), []).append(i)
        want_send = [[0] * world for _ in range(world)]
        for d, (dbox, downer) in enumerate(zip(dst, dst_owners)):
            for members in groups.values():
                members = sorted(members, key=key)
                own = [i for i in members if src_owners[i] == downer]
                supplier = own[0] if own else members[d % len(members)]
                want_send[src_owners[supplier]][downer] += overlap(src[supplier], dbox)
        for me in range(world):
            send, recv = ops._transfer_counts(size, *_tensors(src), src_owners, *_tensors(dst), dst_owners, me, world)
            assert list(send) == want_send[me], (me, src, src_owners, dst, dst_owners)
            assert list(recv) == [want_send[r][me] for r in range(world)], (me, src, src_owners, dst, dst_owners)
        # Every target shard receives its whole box exactly once.
        total = sum(sum(ops._transfer_counts(size, *_tensors(src), src_owners, *_tensors(dst), dst_owners, m, world)[1]) for m in range(world))
        assert total == sum(prod(box[1]) for box in dst)

    def test_layouts_that_overlap_without_being_replicas_are_refused(self):
        # Two different boxes that overlap are no replicas: refused, as in any layout.
        src = _tensors([((0,), (3,)), ((2,), (2,))])
        whole = _tensors([((0,), (4,))])
        try:
            ops._transfer_counts([4], *src, [0, 1], *whole, [0], 0, 2)
        except ValueError as exc:
            assert "overlap" in str(exc), str(exc)
        else:
            raise AssertionError("accepted overlapping boxes")
