"""Port of upstream PyTorch test/distributed/_shard/sharded_tensor/test_sharded_tensor_reshard.py.

test_sharded_tensor_reshard is upstream's, with imports from ``torch_shard`` and ``.cuda(rank)`` as
``.to(rank_device(rank))`` (the GPU/NCCL decorators are gone: it runs on gloo/CPU too).

test_sharded_tensor_reshard_errors: upstream asserts NotImplementedError for (a) an
EnumerableShardingSpec target and (b) a tensor whose local shard list holds one shard twice. The port
keeps both assertions as upstream wrote them (upstream's enumerable spec does not cover its 24x12
tensor, and a shard listed twice is invalid: torch_shard raises UnsupportedReshardError, a ValueError
and a NotImplementedError with upstream's message), and adds what torch_shard supports instead:
enumerable targets that tile the tensor and several different local shards per rank, resharded
correctly.

Not upstream: general permutations of placements on the same dim (upstream's "reshuffle" is only
correct for pairwise swaps; a 4-cycle aborts gloo), and placements on a subset of the ranks.
"""

from itertools import product

import torch
import torch.distributed as dist

from torch_shard import _shard_tensor, sharded_tensor
from torch_shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec, ShardMetadata
from torch_shard.testing import ShardedTensorTestBase, placement, rank_device, run_tests, with_comms
from torch_shard.testing._test_st_common import _chunk_sharding_specs_list_for_test


class TestReshard(ShardedTensorTestBase):
    def _run_sharded_tensor_reshard(self, sharding_spec, reshard_spec, input_size):
        torch.manual_seed(0)
        local_tensor = torch.rand(*input_size).to(rank_device(self.rank))
        st = _shard_tensor(local_tensor, sharding_spec)
        st_compare = _shard_tensor(local_tensor, reshard_spec)
        st.reshard(reshard_spec)
        self.assertEqual(1, len(st.local_shards()))
        self.assertEqual(1, len(st_compare.local_shards()))
        st_compare._metadata.shards_metadata.sort(
            key=lambda metadata: metadata.placement.rank()
        )
        self.assertEqual(st._metadata, st_compare._metadata)
        self.assertEqual(st.local_tensor(), st_compare.local_tensor())
        self.assertEqual(
            st.local_shards()[0].metadata, st_compare.local_shards()[0].metadata
        )

    @with_comms(init_rpc=False)
    def test_sharded_tensor_reshard(self):
        dims = [0, 1]
        for sharding_dim, reshard_dim in product(dims, dims):
            specs = _chunk_sharding_specs_list_for_test(
                [sharding_dim, reshard_dim], seed=5
            )
            spec, reshard_spec = specs[0], specs[1]
            self._run_sharded_tensor_reshard(spec, reshard_spec, [13, 21])
            self._run_sharded_tensor_reshard(spec, reshard_spec, [14, 23])
            self._run_sharded_tensor_reshard(spec, reshard_spec, [15, 26])
            self._run_sharded_tensor_reshard(spec, reshard_spec, [12, 24])

    # ---- helpers for the checks against a full tensor (not upstream) ----

    def _full(self, *size, seed=0):
        # Every rank builds the same full tensor.
        gen = torch.Generator().manual_seed(seed)
        return torch.rand(*size, generator=gen).to(rank_device(self.rank))

    def _expected_metadata(self, spec, size, dtype=torch.float):
        """The target spec's shards in rank order (stable), as reshard stores them."""
        properties = sharded_tensor.TensorProperties(dtype=dtype)
        shards = spec.build_metadata(torch.Size(size), properties).shards_metadata
        return sorted(shards, key=lambda md: md.placement.rank())

    def _assert_matches_full(self, st, full, spec, dst=0):
        """Local shards are the slices of ``full`` at their metadata; global metadata is the spec's
        shards in rank order; the local shards are this rank's entries, in that order; gather to
        ``dst`` reproduces ``full``."""
        expected = self._expected_metadata(spec, full.size(), full.dtype)
        shards_md = st.metadata().shards_metadata
        self.assertEqual(len(expected), len(shards_md))
        for exp, got in zip(expected, shards_md):
            self.assertEqual(exp.shard_offsets, got.shard_offsets)
            self.assertEqual(exp.shard_sizes, got.shard_sizes)
            self.assertEqual(str(exp.placement), str(got.placement))
        self.assertEqual(torch.Size(full.size()), st.size())
        self.assertEqual(spec, st.sharding_spec())

        mine = [md for md in expected if md.placement.rank() == self.rank]
        local_shards = st.local_shards()
        self.assertEqual(len(mine), len(local_shards))
        for md, shard in zip(mine, local_shards):
            self.assertEqual(md.shard_offsets, shard.metadata.shard_offsets)
            self.assertEqual(md.shard_sizes, shard.metadata.shard_sizes)
            self.assertEqual(str(md.placement), str(shard.metadata.placement))
            self.assertEqual(torch.device(rank_device(self.rank)), shard.tensor.device)
            self.assertEqual(full.dtype, shard.tensor.dtype)
            self.assertEqual(torch.Size(md.shard_sizes), shard.tensor.size())
            window = full
            for d, (off, length) in enumerate(zip(md.shard_offsets, md.shard_sizes)):
                window = window.narrow(d, min(off, full.size(d)), length)
            self.assertEqual(window, shard.tensor, atol=0, rtol=0)

        out = torch.zeros_like(full) if self.rank == dst else None
        st.gather(dst, out)
        if self.rank == dst:
            self.assertEqual(full, out, atol=0, rtol=0)
        else:
            self.assertIsNone(out)

    @with_comms(init_rpc=False)
    def test_sharded_tensor_reshard_errors(self):
        specs = _chunk_sharding_specs_list_for_test([0, 1], seed=6)
        spec, reshard_spec = specs[0], specs[1]

        # (a) Upstream: NotImplementedError "Only ChunkShardingSpec supported for reshard." Here an
        # EnumerableShardingSpec target covering the 24x12 tensor: an uneven grid in which rank 0 owns
        # two shards and rank 3 owns only an empty one.
        enumerable_sharding_spec = EnumerableShardingSpec(
            [
                ShardMetadata(shard_offsets=[0, 0], shard_sizes=[10, 7], placement=placement(0)),
                ShardMetadata(shard_offsets=[0, 7], shard_sizes=[10, 5], placement=placement(1)),
                ShardMetadata(shard_offsets=[10, 0], shard_sizes=[14, 3], placement=placement(2)),
                ShardMetadata(shard_offsets=[3, 4], shard_sizes=[0, 5], placement=placement(3)),
                ShardMetadata(shard_offsets=[10, 3], shard_sizes=[14, 9], placement=placement(0)),
            ]
        )
        full = self._full(24, 12, seed=6)
        st = _shard_tensor(full, spec)
        self.assertIs(st, st.reshard(enumerable_sharding_spec))
        self._assert_matches_full(st, full, enumerable_sharding_spec, dst=2)
        expected_local = {0: [[10, 7], [14, 9]], 1: [[10, 5]], 2: [[14, 3]], 3: [[0, 5]]}[self.rank]
        self.assertEqual(expected_local, [list(s.tensor.size()) for s in st.local_shards()])
        # ... and back to a chunk layout.
        st.reshard(reshard_spec)
        self._assert_matches_full(st, full, reshard_spec, dst=1)
        self.assertEqual(1, len(st.local_shards()))

        # (b) Upstream: NotImplementedError "Only single local shard supported for reshard." Here a
        # tensor with several local shards per rank (10 placements, as in test_local_tensor_error),
        # resharded to a one-shard-per-rank spec and to another several-shards-per-rank spec.
        multi_spec = ChunkShardingSpec(
            dim=0,
            placements=[placement(r) for r in [0, 0, 1, 1, 1, 2, 2, 2, 3, 3]],
        )
        multi_spec_cols = ChunkShardingSpec(
            dim=1,
            placements=[placement(r) for r in [3, 2, 1, 0, 3, 2, 1, 0]],
        )
        full = self._full(24, 12, seed=7)
        st = _shard_tensor(full, multi_spec)
        self.assertEqual({0: 2, 1: 3, 2: 3, 3: 2}[self.rank], len(st.local_shards()))
        st.reshard(reshard_spec)
        self._assert_matches_full(st, full, reshard_spec, dst=3)
        self.assertEqual(1, len(st.local_shards()))

        st = _shard_tensor(full, multi_spec)
        st.reshard(multi_spec_cols)
        self._assert_matches_full(st, full, multi_spec_cols, dst=0)
        self.assertEqual(2, len(st.local_shards()))
        st.reshard(multi_spec)
        self._assert_matches_full(st, full, multi_spec, dst=1)

        # Upstream's own assertions, unchanged: its 2-shard enumerable spec leaves most of the 24x12
        # tensor uncovered, and a local shard list holding one shard twice is invalid.
        upstream_enumerable = EnumerableShardingSpec(
            [
                ShardMetadata(shard_offsets=[0, 0], shard_sizes=[5, 5], placement=placement(0)),
                ShardMetadata(shard_offsets=[5, 0], shard_sizes=[5, 5], placement=placement(1)),
            ]
        )
        st = sharded_tensor.rand(spec, 24, 12)
        with self.assertRaisesRegex(NotImplementedError, "Only ChunkShardingSpec supported for reshard."):
            st.reshard(upstream_enumerable)
        with self.assertRaisesRegex(ValueError, "does not match tensor volume"):
            st.reshard(upstream_enumerable)
        st._local_shards = [st.local_shards()[0], st.local_shards()[0]]
        with self.assertRaisesRegex(NotImplementedError, "Only single local shard supported for reshard."):
            st.reshard(reshard_spec)

        # A sharded_tensor.rand source, as upstream: contents are rank-local random data, so compare
        # the round trip instead of a full tensor.
        st = sharded_tensor.rand(multi_spec, 24, 12)
        before = [s.tensor.clone() for s in st.local_shards()]
        st.reshard(enumerable_sharding_spec).reshard(multi_spec_cols).reshard(multi_spec)
        self.assertEqual(before, [s.tensor for s in st.local_shards()])

    @with_comms(init_rpc=False)
    def test_sharded_tensor_reshard_permutations(self):
        """Not upstream: same-dim reshards whose old->new owner map is a 3-cycle or a 4-cycle
        (upstream's reshuffle sends and receives with the same peer, so it is only correct for
        pairwise swaps; with gloo a 4-cycle aborts the process)."""
        identity = [0, 1, 2, 3]
        cycles = [
            [1, 2, 0, 3],  # 3-cycle 0->1->2->0, rank 3 fixed
            [2, 0, 1, 3],  # the inverse 3-cycle
            [1, 2, 3, 0],  # 4-cycle
            [3, 0, 1, 2],  # the inverse 4-cycle
            [2, 3, 1, 0],  # another 4-cycle
        ]
        for dim, size in [(0, [13, 21]), (1, [15, 26]), (0, [3, 5]), (1, [7, 2])]:
            for cycle in cycles:
                source = ChunkShardingSpec(dim=dim, placements=[placement(r) for r in identity])
                target = ChunkShardingSpec(dim=dim, placements=[placement(r) for r in cycle])
                # Upstream's comparison against a fresh _shard_tensor of the target spec ...
                self._run_sharded_tensor_reshard(source, target, size)
                # ... and against the full tensor, chained: cycle, then back to the source.
                full = self._full(*size, seed=11)
                st = _shard_tensor(full, source)
                st.reshard(target)
                self._assert_matches_full(st, full, target, dst=cycle[0])
                st.reshard(source)
                self._assert_matches_full(st, full, source, dst=cycle[1])

    @with_comms(init_rpc=False)
    def test_sharded_tensor_reshard_subset_of_ranks(self):
        """Not upstream: the source lives on ranks {0, 2} only, the target on ranks {1, 3} only
        (every rank still takes part; ranks without shards send or receive nothing)."""
        full = self._full(10, 9, seed=3)
        source_specs = [
            ChunkShardingSpec(dim=0, placements=[placement(0), placement(2)]),
            ChunkShardingSpec(dim=1, placements=[placement(2), placement(0), placement(2)]),
        ]
        target_specs = [
            ChunkShardingSpec(dim=1, placements=[placement(3), placement(1)]),
            ChunkShardingSpec(dim=0, placements=[placement(1), placement(3), placement(1)]),
            EnumerableShardingSpec(
                [
                    ShardMetadata(shard_offsets=[0, 0], shard_sizes=[4, 9], placement=placement(3)),
                    ShardMetadata(shard_offsets=[4, 0], shard_sizes=[6, 2], placement=placement(1)),
                    ShardMetadata(shard_offsets=[4, 2], shard_sizes=[6, 7], placement=placement(3)),
                ]
            ),
        ]
        for source, target in product(source_specs, target_specs):
            st = _shard_tensor(full, source)
            self.assertEqual(self.rank in (1, 3), len(st.local_shards()) == 0)
            st.reshard(target)
            self._assert_matches_full(st, full, target, dst=0)
            self.assertEqual(self.rank in (0, 2), len(st.local_shards()) == 0)
            # and back again
            st.reshard(source)
            self._assert_matches_full(st, full, source, dst=3)
        dist.barrier()


if __name__ == "__main__":
    run_tests()
