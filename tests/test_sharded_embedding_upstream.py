"""Port of upstream PyTorch test/distributed/_shard/sharded_tensor/ops/test_embedding.py.

Same class and method names, every case and every upstream assertion; imports change from
``torch.distributed._shard.X`` to ``torch_shard.X`` and the torch-internal harness is replaced by
``torch_shard.testing``. ``.to(self.rank)`` / "rank:N/cuda:N" become ``.to(rank_device(rank))`` /
``placement(N)``, so the bodies run with NCCL on 4 GPUs and with gloo on CPU; the GPU-count and
backend decorators are gone. upstream's ``_test_ops_common`` helpers come from
``torch_shard.testing._test_ops_common``.

As upstream: every rank looks up its own input (seeded by rank, same shape on every rank); with
``max_norm`` the local reference is first renormalised with the union of all ranks' inputs, because
the sharded op renormalises (in place, by the full row norm) every row any rank looked up.
"""

import warnings

import torch
import torch.distributed as dist

from torch_shard import shard_parameter
from torch_shard.testing import (
    TEST_WORLD_SIZE,
    ShardedTensorTestBase,
    TestCase,
    cpu_loops,
    rank_device,
    requires_testing_library,
    run_tests,
    with_comms,
)
from torch_shard.testing._test_ops_common import (
    clone_module_parameter,
    generate_chunk_sharding_specs_for_test,
    generate_local_weight_sharding_params_for_test,
)

TEST_GPU_NUM = TEST_WORLD_SIZE




class TestShardedEmbedding(ShardedTensorTestBase):
    def _run_sharded_embedding(
        self,
        spec,
        input_size,
        num_embeddings,
        embedding_dim,
        max_norm=None,
        norm_type=2.0,
        padding_idx=None,
    ):
        device = rank_device(self.rank)
        # Use same seed.
        torch.manual_seed(0)
        local_embedding = torch.nn.Embedding(
            num_embeddings,
            embedding_dim,
            max_norm=max_norm,
            norm_type=norm_type,
            padding_idx=padding_idx,
        ).to(device)

        sharded_embedding = torch.nn.Embedding(
            num_embeddings,
            embedding_dim,
            max_norm=max_norm,
            norm_type=norm_type,
            padding_idx=padding_idx,
        )

        # Copy the weights from local embedding
        sharded_embedding.weight = clone_module_parameter(local_embedding, "weight")

        # Shard the parameter.
        shard_parameter(sharded_embedding, "weight", spec)

        # Run sharded computation
        torch.manual_seed(self.rank)  # inputs different on each rank
        inp = torch.randint(0, num_embeddings, tuple(input_size)).to(device)
        sharded_output = sharded_embedding(inp)

        # If max_norm is set, we need to ensure that the renorm has been applied across
        # inputs from all ranks.
        if max_norm is not None:
            gathered_inputs = [torch.zeros_like(inp) for _ in range(TEST_GPU_NUM)]
            dist.all_gather(gathered_inputs, inp)
            unique_inp = torch.unique(torch.cat(gathered_inputs))
            local_embedding(unique_inp)

        # Run local computation
        local_output = local_embedding(inp)

        # Compare local weight and shared one to ensure the renorm
        # as expected.
        if max_norm is not None:
            sharded_dim = spec.dim
            sharded_weight = sharded_embedding.weight.local_shards()[0].tensor
            (start_pos, chunk_size) = generate_local_weight_sharding_params_for_test(
                local_embedding.weight, sharded_dim, TEST_GPU_NUM, spec, self.rank
            )
            local_weight_narrowed = local_embedding.weight.narrow(
                sharded_dim, start_pos, chunk_size
            )
            self.assertEqual(local_weight_narrowed, sharded_weight)

        # Verify
        self.assertEqual(local_output, sharded_output)

        # Validate for torch.nn.functional.embedding version.
        local_output = torch.nn.functional.embedding(
            inp,
            local_embedding.weight,
            max_norm=max_norm,
            norm_type=norm_type,
            padding_idx=padding_idx,
        )
        sharded_output = torch.nn.functional.embedding(
            inp,
            sharded_embedding.weight,
            max_norm=max_norm,
            norm_type=norm_type,
            padding_idx=padding_idx,
        )

        self.assertEqual(local_output, sharded_output)

    @with_comms(init_rpc=False)
    def test_sharded_embedding_colwise(self):
        for spec in generate_chunk_sharding_specs_for_test(1):
            self._run_sharded_embedding(spec, [5, 4], 17, 12)
            self._run_sharded_embedding(spec, [6, 7, 6], 21, 11)
            self._run_sharded_embedding(spec, [8, 6, 5, 4], 23, 13)
            self._run_sharded_embedding(spec, [8, 6, 5, 4, 7], 23, 16)
            self._run_sharded_embedding(spec, [4], 15, 14)
            self._run_sharded_embedding(spec, [34], 15, 14, padding_idx=10)
            self._run_sharded_embedding(spec, [8, 6, 5, 4], 23, 13, padding_idx=12)
            self._run_sharded_embedding(
                spec,
                [4, 5, 6],
                23,
                13,
                max_norm=2.5,
            )
            self._run_sharded_embedding(
                spec,
                [12, 7, 16],
                23,
                13,
                max_norm=2.5,
            )
            self._run_sharded_embedding(
                spec,
                [8, 16, 20],
                12,
                12,
                max_norm=1.25,
                norm_type=1.0,
            )
            self._run_sharded_embedding(spec, [30], 15, 14, max_norm=2.0)

    @with_comms(init_rpc=False)
    def test_sharded_embedding_rowwise(self):
        for spec in generate_chunk_sharding_specs_for_test(0):
            # Test even split.
            self._run_sharded_embedding(spec, [5, 12], 16, 22)
            self._run_sharded_embedding(spec, [5, 4], 32, 12)
            self._run_sharded_embedding(spec, [6, 7, 6], 64, 11)
            self._run_sharded_embedding(
                spec,
                [5, 12],
                16,
                22,
                max_norm=2.5,
            )
            self._run_sharded_embedding(spec, [6, 7, 6], 64, 11, padding_idx=30)
            self._run_sharded_embedding(
                spec,
                [6, 5, 3],
                26,
                11,
                max_norm=2.0,
            )

            # Test uneven split.
            self._run_sharded_embedding(spec, [8, 6, 5, 4], 19, 11)
            self._run_sharded_embedding(spec, [6, 7, 6], 21, 11)
            self._run_sharded_embedding(spec, [4], 21, 11)
            self._run_sharded_embedding(spec, [8, 6, 5, 4], 21, 11, padding_idx=10)
            self._run_sharded_embedding(
                spec,
                [6, 5, 8],
                28,
                5,
                max_norm=2.0,
            )
            self._run_sharded_embedding(spec, [4], 14, 11, max_norm=2.5)


@requires_testing_library
class TestOwnerTable(TestCase):
    def test_owners_follow_placements_in_any_order_without_warnings(self):
        # Row ranges in placement order (not sorted by start), an empty range; the boundaries handed to
        # bucketize must be contiguous (torch warns and copies otherwise), on every device (the ATen
        # composition of the row-wise bucketing, NOTE [ Requester-side routing in one op ], run on the
        # CPU), and the CPU's loops agree.
        ids = torch.tensor([0, 5, 9, 3, 7])
        for loops in (False, True):
            with warnings.catch_warnings(), cpu_loops(loops):
                warnings.simplefilter("error")
                _, perm, words, _ = torch.ops.torch_shard_testing._bucket_ids(ids, None, [8, 0, 4, 10], [2, 4, 4, 0], 10)
                # Owners [1, 2, 0, 1, 2]: rank 0 holds id 9, rank 1 ids 0 and 3, rank 2 ids 5 and 7.
                self.assertEqual(words.tolist(), [1, 2, 2, 0])
                self.assertEqual(perm.tolist(), [2, 0, 3, 1, 4])
                _, perm, words, _ = torch.ops.torch_shard_testing._bucket_ids(ids, None, [0], [10], 10)
                self.assertEqual((words.tolist(), perm.tolist()), ([5], [0, 1, 2, 3, 4]))


if __name__ == "__main__":
    run_tests()
