"""``torch_shard.visualize_sharding`` (single process, no process group).

The picture comes from the global metadata alone, so a ShardedTensorBase built from a spec (which
needs no group) or a bare ShardedTensorMetadata shows exactly what any rank of a real run shows.
The demo (tests/test_demo.py) covers a real 4-rank run, where the picture is printed once.
"""

import contextlib
import io
import unittest

import torch

from torch_shard import visualize_sharding
from torch_shard.metadata import ShardMetadata
from torch_shard.sharded_tensor import ShardedTensorBase
from torch_shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties
from torch_shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec

PLACEMENTS = [f"rank:{r}/cpu" for r in range(4)]


def chunked(dim: int, *size: int, placements=PLACEMENTS) -> ShardedTensorBase:
    return ShardedTensorBase(ChunkShardingSpec(dim=dim, placements=placements), *size)


def metadata(size, shards, dtype=torch.float32) -> ShardedTensorMetadata:
    """A layout as ShardedTensorMetadata: ``shards`` are (offsets, sizes, rank)."""
    mds = [ShardMetadata(list(o), list(s), f"rank:{r}/cpu") for o, s, r in shards]
    return ShardedTensorMetadata(mds, torch.Size(size), TensorProperties(dtype=dtype))


def picture(tensor, header: str = "") -> str:
    """The text, printed nowhere."""
    return visualize_sharding(tensor, header, rank=None)


class TestVisualizeSharding(unittest.TestCase):
    def test_rows_uneven(self):
        self.assertEqual(
            picture(chunked(0, 10, 6), "rows"),
            "rows\n"
            "ShardedTensor [10, 6] float32: 4 shards, ChunkShardingSpec(dim=0)\n"
            "+----------+----------+\n"
            "|          | cols 0-5 |\n"
            "+----------+----------+\n"
            "| rows 0-2 | rank 0   |\n"
            "| rows 3-5 | rank 1   |\n"
            "| rows 6-8 | rank 2   |\n"
            "| row 9    | rank 3   |\n"
            "+----------+----------+",
        )

    def test_columns_with_a_trailing_empty_shard(self):
        # 6 columns in 4 chunks of 2: the last chunk is empty, and the note says whose it is.
        self.assertEqual(
            picture(chunked(1, 10, 6)),
            "ShardedTensor [10, 6] float32: 4 shards, ChunkShardingSpec(dim=1)\n"
            "+----------+----------+----------+----------+\n"
            "|          | cols 0-1 | cols 2-3 | cols 4-5 |\n"
            "+----------+----------+----------+----------+\n"
            "| rows 0-9 | rank 0   | rank 1   | rank 2   |\n"
            "+----------+----------+----------+----------+\n"
            "empty shards: rank 3 at [0, 6]",
        )

    def test_one_dim(self):
        placements = list(reversed(PLACEMENTS))
        self.assertEqual(
            picture(chunked(0, 10, placements=placements)),
            "ShardedTensor [10] float32: 4 shards, ChunkShardingSpec(dim=0)\n"
            "+--------+--------+--------+--------+\n"
            "| 0-2    | 3-5    | 6-8    | 9      |\n"
            "+--------+--------+--------+--------+\n"
            "| rank 3 | rank 2 | rank 1 | rank 0 |\n"
            "+--------+--------+--------+--------+",
        )

    def test_enumerable_unaligned_with_several_shards_per_rank_and_an_empty_shard(self):
        # Two row bands cut at different columns; rank 0 owns two shards that touch at column 2,
        # which the shard indices tell apart.
        spec = EnumerableShardingSpec(
            [
                ShardMetadata([0, 0], [4, 3], "rank:0/cpu"),
                ShardMetadata([0, 3], [4, 3], "rank:1/cpu"),
                ShardMetadata([4, 0], [6, 2], "rank:2/cpu"),
                ShardMetadata([4, 2], [6, 4], "rank:0/cpu"),
                ShardMetadata([10, 0], [0, 6], "rank:3/cpu"),
            ]
        )
        self.assertEqual(
            picture(ShardedTensorBase(spec, 10, 6, dtype=torch.float64)),
            "ShardedTensor [10, 6] float64: 5 shards, EnumerableShardingSpec\n"
            "+----------+-----------+-----------+-----------+\n"
            "|          | cols 0-1  | col 2     | cols 3-5  |\n"
            "+----------+-----------+-----------+-----------+\n"
            "| rows 0-3 | rank 0 #0 | rank 0 #0 | rank 1    |\n"
            "| rows 4-9 | rank 2    | rank 0 #3 | rank 0 #3 |\n"
            "+----------+-----------+-----------+-----------+\n"
            "empty shards: rank 3 at [10, 0]\n"
            "rank 0 owns 2 shards: #0, #3",
        )

    def test_grid_from_metadata(self):
        shards = [([0, 0], [2, 3], 1), ([0, 3], [2, 3], 0), ([2, 0], [3, 3], 3), ([2, 3], [3, 3], 2)]
        self.assertEqual(
            picture(metadata([5, 6], shards, dtype=torch.int64)),
            "ShardedTensor [5, 6] int64: 4 shards\n"
            "+----------+----------+----------+\n"
            "|          | cols 0-2 | cols 3-5 |\n"
            "+----------+----------+----------+\n"
            "| rows 0-1 | rank 1   | rank 0   |\n"
            "| rows 2-4 | rank 3   | rank 2   |\n"
            "+----------+----------+----------+",
        )

    def test_three_dims_one_table_per_leading_block(self):
        shards = [([0, 0, 0], [1, 2, 4], 0), ([0, 2, 0], [1, 2, 4], 1), ([1, 0, 0], [2, 4, 4], 2)]
        self.assertEqual(
            picture(metadata([3, 4, 4], shards)),
            "ShardedTensor [3, 4, 4] float32: 3 shards\n"
            "[0, :, :]\n"
            "+----------+----------+\n"
            "|          | cols 0-3 |\n"
            "+----------+----------+\n"
            "| rows 0-1 | rank 0   |\n"
            "| rows 2-3 | rank 1   |\n"
            "+----------+----------+\n"
            "[1-2, :, :]\n"
            "+----------+----------+\n"
            "|          | cols 0-3 |\n"
            "+----------+----------+\n"
            "| rows 0-1 | rank 2   |\n"
            "| rows 2-3 | rank 2   |\n"
            "+----------+----------+",
        )

    def test_no_elements(self):
        self.assertEqual(
            picture(chunked(0, 0, 3, placements=PLACEMENTS[:2])),
            "ShardedTensor [0, 3] float32: 2 shards, ChunkShardingSpec(dim=0)\n"
            "(no elements)\n"
            "empty shards: rank 0 at [0, 0], rank 1 at [0, 0]",
        )

    def test_prints_once_on_the_chosen_rank(self):
        # Without a process group this process is rank 0: it prints for rank=0 only.
        st = chunked(0, 4, 4)
        for rank, printed in ((0, True), (1, False), (None, False)):
            with self.subTest(rank=rank):
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    text = visualize_sharding(st, rank=rank)
                self.assertEqual(out.getvalue(), text + "\n" if printed else "")
                self.assertIn("| row 0 | rank 0 ", text)

    def test_errors(self):
        with self.assertRaisesRegex(TypeError, r"^torch_shard\.visualize_sharding: expected a ShardedTensor"):
            visualize_sharding(torch.zeros(2, 2))
        with self.assertRaisesRegex(ValueError, "0-dim tensor"):
            visualize_sharding(metadata([], [([], [], 0)]))


if __name__ == "__main__":
    unittest.main()
