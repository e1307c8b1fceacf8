"""Seeded property tests for ShardedTensor.reshard / gather / _shard_tensor (not upstream).

Random pairs of layouts (A, B) over small 1-D to 4-D tensors: every rank draws the same layouts from
``random.Random(SEED)`` and builds the same full tensor, so each rank can check its own shards against
the matching slices of that tensor. A layout is either

* a ChunkShardingSpec: random dim (sometimes negative), 1..8 placements drawn with repetition from
  the 4 ranks (so several shards per rank, ranks with none, empty trailing chunks), or
* an EnumerableShardingSpec: a random guillotine tiling of the global box (recursive splits), plus a
  few EMPTY shards anywhere in the box, listed in random order, owned by random ranks (sometimes only
  a subset of the ranks).

Expected layouts are computed here, independently of the library (upstream ChunkShardingSpec's rule: split =
ceil(dim / n), chunk i at offset split*i with length clamp(dim - split*i, 0, split)); after a reshard
the metadata must be the target's shards stably sorted by owner rank (upstream's order).

The byte-count test checks ``torch.ops.torch_shard._comm_stats`` against the changed-owner volume
computed from the two metadata lists: a rank sends exactly the elements it owns before and another
rank owns after, and receives the converse.
"""

from __future__ import annotations

import math
import random

import torch
import torch.distributed as dist

from torch_shard import _shard_tensor, sharded_tensor
from torch_shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec, ShardMetadata
from torch_shard.testing import ShardedTensorTestBase, placement, rank_device, run_tests, with_comms

WORLD = 4
SEED = 20240611
NUM_PAIRS = 50
NUM_BYTE_PAIRS = 30
MAX_NUMEL = 400
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool]


# ----------------------------------------------------------------------------------------------
# Layout generation (pure Python, driven only by the shared rng: identical on every rank)
# ----------------------------------------------------------------------------------------------


class Layout:
    """A sharding spec together with its shards computed independently: [(offsets, sizes, rank)] in
    spec order."""

    def __init__(self, kind: str, spec, shards: list[tuple[list[int], list[int], int]], desc: str):
        self.kind = kind
        self.spec = spec
        self.shards = shards
        self.desc = desc

    def rank_sorted(self):
        return sorted(self.shards, key=lambda s: s[2])  # stable

    def __repr__(self) -> str:
        return self.desc


def random_size(rng: random.Random) -> list[int]:
    while True:
        ndim = rng.randint(1, 4)
        size = [rng.randint(0 if rng.random() < 0.05 else 1, 9) for _ in range(ndim)]
        if rng.random() < 0.08:
            size[rng.randrange(ndim)] = 0
        if math.prod(size) <= MAX_NUMEL:
            return size


def chunk_shards(size: list[int], dim: int, ranks: list[int]):
    nd = len(size)
    d = dim % nd
    length = size[d]
    n = len(ranks)
    split = -(-length // n)
    out = []
    for i, r in enumerate(ranks):
        chunk = max(min(length, split * (i + 1)) - split * i, 0)
        offsets = [0] * nd
        offsets[d] = split * i
        sizes = list(size)
        sizes[d] = chunk
        out.append((offsets, sizes, r))
    return out


def random_chunk_layout(rng: random.Random, size: list[int]) -> Layout:
    nd = len(size)
    dim = rng.randrange(nd)
    if rng.random() < 0.2:
        dim -= nd
    ranks = [rng.randrange(WORLD) for _ in range(rng.randint(1, 8))]
    spec = ChunkShardingSpec(dim=dim, placements=[placement(r) for r in ranks])
    return Layout("chunk", spec, chunk_shards(size, dim, ranks), f"Chunk(dim={dim}, ranks={ranks})")


def guillotine(rng: random.Random, offsets: list[int], sizes: list[int], budget: list[int]):
    splittable = [d for d in range(len(sizes)) if sizes[d] >= 2]
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
    return guillotine(rng, offsets, lo_sizes, budget) + guillotine(rng, hi_offsets, hi_sizes, budget)


def random_enumerable_layout(rng: random.Random, size: list[int]) -> Layout:
    nd = len(size)
    boxes = guillotine(rng, [0] * nd, list(size), [rng.randint(0, 9)])
    for _ in range(rng.choice([0, 0, 1, 2, 3])):
        # An empty shard anywhere inside the box (an empty shard overlaps nothing).
        offsets, sizes = [], []
        for d in range(nd):
            o = rng.randint(0, size[d])
            offsets.append(o)
            sizes.append(rng.randint(0, size[d] - o))
        sizes[rng.randrange(nd)] = 0
        boxes.append((offsets, sizes))
    rng.shuffle(boxes)
    if rng.random() < 0.35:
        pool = rng.sample(range(WORLD), rng.randint(1, WORLD - 1))
    else:
        pool = list(range(WORLD))
    shards = [(o, s, rng.choice(pool)) for o, s in boxes]
    spec = EnumerableShardingSpec(
        [
            ShardMetadata(shard_offsets=list(o), shard_sizes=list(s), placement=placement(r))
            for o, s, r in shards
        ]
    )
    return Layout("enum", spec, shards, f"Enumerable({[(o, s, r) for o, s, r in shards]})")


def random_layout(rng: random.Random, size: list[int]) -> Layout:
    if rng.random() < 0.5:
        return random_chunk_layout(rng, size)
    return random_enumerable_layout(rng, size)


def full_tensor(seed: int, size: list[int], dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.rand(size, generator=gen).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, size, generator=gen).to(torch.bool)
    return torch.randint(-(2**40), 2**40, size, generator=gen).to(dtype)


def intersect_volume(a_off, a_size, b_off, b_size) -> int:
    vol = 1
    for ao, asz, bo, bsz in zip(a_off, a_size, b_off, b_size):
        lo = max(ao, bo)
        hi = min(ao + asz, bo + bsz)
        if hi <= lo:
            return 0
        vol *= hi - lo
    return vol


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


# ----------------------------------------------------------------------------------------------


class TestReshardProperties(ShardedTensorTestBase):
    def _window(self, full: torch.Tensor, offsets, sizes) -> torch.Tensor:
        window = full
        for d, (o, s) in enumerate(zip(offsets, sizes)):
            window = window.narrow(d, min(o, full.size(d)), s)
        return window

    def _build_source(self, layout: Layout, full: torch.Tensor, src_rank: int):
        if layout.kind == "chunk":
            st = _shard_tensor(full.to(rank_device(self.rank)), layout.spec, src_rank=src_rank)
        else:
            st = sharded_tensor.empty(layout.spec, *full.size(), dtype=full.dtype)
            for shard in st.local_shards():
                md = shard.metadata
                shard.tensor.copy_(self._window(full, md.shard_offsets, md.shard_sizes))
        return st

    def _check(self, st, full: torch.Tensor, expected, msg: str) -> None:
        """Global metadata == ``expected`` [(offsets, sizes, rank)] in that order; local shards are this
        rank's entries in that order and hold the matching slices of ``full``."""
        self.assertEqual(torch.Size(full.size()), st.size(), msg)
        self.assertEqual(full.dtype, st.dtype, msg)
        shards_md = st.metadata().shards_metadata
        got = [(list(m.shard_offsets), list(m.shard_sizes), str(m.placement)) for m in shards_md]
        want = [(list(o), list(s), placement(r)) for o, s, r in expected]
        self.assertEqual(want, got, f"{msg}: metadata")
        mine = [e for e in expected if e[2] == self.rank]
        local = st.local_shards()
        self.assertEqual(len(mine), len(local), f"{msg}: number of local shards")
        for (o, s, _), shard in zip(mine, local):
            self.assertEqual(list(o), list(shard.metadata.shard_offsets), msg)
            self.assertEqual(list(s), list(shard.metadata.shard_sizes), msg)
            self.assertEqual(placement(self.rank), str(shard.metadata.placement), msg)
            self.assertEqual(torch.device(rank_device(self.rank)), shard.tensor.device, msg)
            self.assertEqual(full.dtype, shard.tensor.dtype, msg)
            self.assertEqual(torch.Size(s), shard.tensor.size(), msg)
            self.assertEqual(
                self._window(full, o, s), shard.tensor.cpu(), f"{msg}: local data", atol=0, rtol=0
            )

    @staticmethod
    def _boxes(st):
        """[(offsets, sizes, owner rank)] of every shard, in metadata order."""
        return [
            (list(m.shard_offsets), list(m.shard_sizes), m.placement.rank())
            for m in st.metadata().shards_metadata
        ]

    def _check_gather(self, st, full: torch.Tensor, dst: int, msg: str) -> None:
        if self.rank == dst:
            # Start from values that differ everywhere, so an element gather forgot shows.
            out = (~full if full.dtype == torch.bool else full + 1).to(rank_device(dst))
        else:
            out = None
        st.gather(dst, out)
        if self.rank == dst:
            self.assertEqual(full, out.cpu(), f"{msg}: gather", atol=0, rtol=0)
        else:
            self.assertIsNone(out, msg)

    @with_comms(init_rpc=False)
    def test_random_layout_pairs(self):
        rng = random.Random(SEED)
        for i in range(NUM_PAIRS):
            size = random_size(rng)
            dtype = rng.choice(DTYPES)
            a = random_layout(rng, size)
            b = random_layout(rng, size)
            c = random_layout(rng, size)
            src_rank = rng.randrange(WORLD)
            dst_b, dst_c = rng.randrange(WORLD), rng.randrange(WORLD)
            msg = f"pair {i}: size={size} dtype={dtype} A={a} B={b} C={c}"
            full = full_tensor(SEED + i, size, dtype)

            st = self._build_source(a, full, src_rank)
            self._check(st, full, a.shards, f"{msg} (source)")

            self.assertIs(st, st.reshard(b.spec), msg)
            self.assertEqual(b.spec, st.sharding_spec(), msg)
            self._check(st, full, b.rank_sorted(), f"{msg} (A->B)")
            self._check_gather(st, full, dst_b, f"{msg} (A->B)")

            # A second hop from a resharded tensor (its metadata is already in rank order).
            st.reshard(c.spec)
            self._check(st, full, c.rank_sorted(), f"{msg} (B->C)")
            self._check_gather(st, full, dst_c, f"{msg} (B->C)")
        dist.barrier()

    @with_comms(init_rpc=False)
    def test_comm_bytes_match_changed_owner_volume(self):
        rng = random.Random(SEED + 1)
        comm_stats = torch.ops.torch_shard._comm_stats
        for i in range(NUM_BYTE_PAIRS):
            size = random_size(rng)
            dtype = rng.choice(DTYPES)
            a = random_layout(rng, size)
            b = random_layout(rng, size)
            msg = f"pair {i}: size={size} dtype={dtype} A={a} B={b}"
            full = full_tensor(SEED + 1000 + i, size, dtype)
            st = self._build_source(a, full, src_rank=0)
            before = self._boxes(st)

            comm_stats(True)
            st.reshard(b.spec)
            sent, received, collectives = comm_stats(False)[:3]

            after = self._boxes(st)
            self.assertEqual([(o, s, r) for o, s, r in b.rank_sorted()], after, msg)
            itemsize = element_size(dtype)
            want_sent = sum(
                intersect_volume(so, ss, to, ts)
                for so, ss, sr in before
                if sr == self.rank
                for to, ts, tr in after
                if tr != self.rank
            ) * itemsize
            want_received = sum(
                intersect_volume(so, ss, to, ts)
                for so, ss, sr in before
                if sr != self.rank
                for to, ts, tr in after
                if tr == self.rank
            ) * itemsize
            self.assertEqual(want_sent, sent, f"{msg}: bytes sent to other ranks")
            self.assertEqual(want_received, received, f"{msg}: bytes received from other ranks")
            self.assertGreaterEqual(collectives, 1, msg)
            self._check(st, full, b.rank_sorted(), msg)

        # Sanity of the counter itself: a pure rank rotation of a 1-D int64 tensor moves every element.
        full = torch.arange(40, dtype=torch.int64, device=self.device)
        source = ChunkShardingSpec(dim=0, placements=[placement(r) for r in range(WORLD)])
        target = ChunkShardingSpec(dim=0, placements=[placement((r + 1) % WORLD) for r in range(WORLD)])
        st = _shard_tensor(full, source)
        comm_stats(True)
        st.reshard(target)
        sent, received = comm_stats(False)[:2]
        self.assertEqual(10 * 8, sent)
        self.assertEqual(10 * 8, received)
        # Resharding to the layout it already has moves nothing.
        comm_stats(True)
        st.reshard(target)
        sent, received = comm_stats(False)[:2]
        self.assertEqual((0, 0), (sent, received))
        dist.barrier()


if __name__ == "__main__":
    run_tests()
