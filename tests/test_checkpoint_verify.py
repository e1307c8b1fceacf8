"""Checked checkpoint loads (issue 27): a flipped byte is caught on every rank, nothing is half-loaded.

TestVerifiedLoads (4 ranks): a byte of tensor data flipped in the first, a middle or the last saved
chunk of a tensor (float32, bf16, int64), loaded into the saved layout (whole chunks: the writer's
XXH3-64 digest, or the zip CRC-32 for a plain FileSystemWriter checkpoint) and into columns (every chunk
read in part: tile digests from ChecksumFileSystemWriter, or the whole record for a plain
FileSystemWriter checkpoint). Each load raises CheckpointCorruptionError on every
rank and leaves every destination as it was; the same load with verify=False succeeds and returns the
flipped value, which proves the flip hits data the load uses. async_save with ShardedTensors, the
offline verifier and its command line are tested too.

test_box_reads_*: single process, the block-checked box reads against slicing, on random boxes.
"""

import contextlib
import io
import os
import random
import subprocess
import sys
from unittest import mock

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import xxhash
from _shared import box_slice, chunks, filled, shared_tmp_dir
from torch.distributed.checkpoint.api import CheckpointException

from torch_shard import sharded_tensor
from torch_shard.checkpoint import (
    ByteRangeFileSystemReader,
    CheckpointCorruptionError,
    ChecksumFileSystemWriter,
    _checksums,
    load,
    verify_checkpoint,
)
from torch_shard.checkpoint._archive import BytesSource, read_archive
from torch_shard.checkpoint._checksums import ItemChecksums, tensor_tile_digests
from torch_shard.checkpoint._saved_item import ItemPlace, read_box_by_tiles
from torch_shard.testing import ShardedTensorTestBase, run_tests, with_comms

ROWS, COLS = 64, 640  # 4 saved row chunks of 16 x 640; a column load reads a part of each


def _values(dtype):
    torch.manual_seed(0)
    if dtype == torch.int64:
        return torch.arange(ROWS * COLS, dtype=torch.int64).view(ROWS, COLS) * 7919 + 2**40
    return torch.randn(ROWS, COLS).to(dtype)


def _flip(path, fqn, chunk_row, element):
    """Flip one bit of one data byte of ``element`` (a flat index) in the chunk starting at row
    ``chunk_row``; returns (file, byte offset)."""
    md = dcp.FileSystemReader(path).read_metadata()
    [(index, info)] = [(i, s) for i, s in md.storage_data.items() if i.fqn == fqn and i.offset[0] == chunk_row]
    file = os.path.join(path, info.relative_path)
    with open(file, "r+b") as f:
        f.seek(info.offset)
        archive = read_archive(BytesSource(f.read(info.length), info.offset))
        at = info.offset + archive.data.data_offset + element * archive.meta.element_size() + 1
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x04]))
    return info.relative_path, at



def _whole_up_to(limit):
    """The reader's read-whole threshold for the block (``None``: as it is)."""
    if limit is None:
        return contextlib.nullcontext()
    return mock.patch.object(_checksums, "READ_WHOLE_UP_TO", limit)

class TestVerifiedLoads(ShardedTensorTestBase):
    def _tmp_dir(self) -> str:
        return shared_tmp_dir(self, "torch_shard_verify_")

    def _assert_untouched(self, target, fill, msg):
        for shard in target.local_shards():
            self.assertTrue(bool((shard.tensor == fill).all()), f"{msg}: destination changed")

    @with_comms(init_rpc=False)
    def test_flipped_byte_raises_on_every_rank(self):
        chunk_size = (ROWS // 4) * COLS
        cases = [  # (dtype, saved chunk (its first row), element of the chunk)
            (torch.float32, 0, 0),  # first chunk, first element
            (torch.float32, 32, chunk_size // 2 + 3),  # a middle chunk
            (torch.float32, 48, chunk_size - 1),  # last chunk, last element
            (torch.bfloat16, 16, 1234),
            (torch.int64, 48, 5000),
        ]
        for writer_cls in (ChecksumFileSystemWriter, dcp.FileSystemWriter):
            for dtype, chunk_row, element in cases:
                full = _values(dtype)
                path = self._tmp_dir()
                with _whole_up_to(0):  # tile digests even for these small chunks, for the tiled loads
                    dcp.save({"model.w": filled(full, chunks(0)), "step": 3}, storage_writer=writer_cls(path))
                dist.barrier()
                if self.rank == 0:
                    where = _flip(path, "model.w", chunk_row, element)
                where = [where if self.rank == 0 else None]
                dist.broadcast_object_list(where, src=0)
                file, at = where[0]
                row, col = chunk_row + element // COLS, element % COLS
                # The saved layout (whole chunks), columns (a part of each: these small chunks are read
                # whole), and columns read by tiles as a big chunk's are.
                for load_dim, whole_up_to in ((0, None), (1, None), (1, 0)):
                    msg = (f"{writer_cls.__name__} {dtype} chunk {chunk_row} element {element} load dim {load_dim} "
                           f"read whole up to {whole_up_to}")
                    fill = -7
                    target = sharded_tensor.full(chunks(load_dim), (ROWS, COLS), fill, dtype=dtype)
                    with self.assertRaises(CheckpointCorruptionError, msg=msg) as caught, _whole_up_to(whole_up_to):
                        load({"model.w": target, "step": 0}, path)
                    self._assert_untouched(target, fill, msg)
                    # Every rank that read the flipped byte reports it (the chunk whole, or its tile).
                    found = caught.exception.corruptions
                    self.assertGreaterEqual(len(found), 1, msg)
                    for c in found:
                        self.assertEqual((c.fqn, c.file, c.chunk_offsets), ("model.w", file, (chunk_row, 0)), msg)
                        self.assertNotEqual(c.expected, c.found, msg)
                        self.assertLessEqual(c.offset, at, msg)
                    self.assertIn("'model.w'", str(caught.exception))
                    # Through dcp.load itself: DCP's CheckpointException, ours inside for every rank.
                    with self.assertRaises(CheckpointException, msg=msg) as wrapped:
                        dcp.load({"model.w": target}, storage_reader=ByteRangeFileSystemReader(path))
                    self.assertEqual(sorted(wrapped.exception.failures), [0, 1, 2, 3], msg)
                    for exc, _ in wrapped.exception.failures.values():
                        self.assertIsInstance(exc, CheckpointCorruptionError, msg)
                    self._assert_untouched(target, fill, msg)
                    # Unchecked, the flip loads silently: the probe hits data this load uses.
                    dcp.load({"model.w": target}, storage_reader=ByteRangeFileSystemReader(path, verify=False))
                    for shard in target.local_shards():
                        md = shard.metadata
                        inside = all(o <= i < o + s for i, o, s in zip((row, col), md.shard_offsets, md.shard_sizes))
                        expected = box_slice(full, md).clone()
                        if inside:
                            self.assertFalse(torch.equal(shard.tensor, expected), f"{msg}: flip not loaded")
                            expected[row - md.shard_offsets[0], col - md.shard_offsets[1]] = shard.tensor[
                                row - md.shard_offsets[0], col - md.shard_offsets[1]
                            ]
                        self.assertTrue(torch.equal(shard.tensor, expected), msg)

    @with_comms(init_rpc=False)
    def test_clean_checkpoint_loads_and_verifies(self):
        full = _values(torch.float32)
        for writer_cls in (ChecksumFileSystemWriter, dcp.FileSystemWriter):
            path = self._tmp_dir()
            dcp.save({"w": filled(full, chunks(0)), "note": {"epoch": 2}}, storage_writer=writer_cls(path))
            for load_dim in (0, 1):
                target = sharded_tensor.zeros(chunks(load_dim), ROWS, COLS)
                state = {"w": target, "note": {"epoch": 0}}
                load(state, path)
                for shard in target.local_shards():
                    self.assertTrue(torch.equal(shard.tensor, box_slice(full, shard.metadata)))
                self.assertEqual(state["note"], {"epoch": 2})
            dist.barrier()
            if self.rank == 0:
                report = verify_checkpoint(path, progress=False)
                self.assertTrue(report.ok, report.corruptions)
                self.assertEqual(report.has_block_checksums, writer_cls is ChecksumFileSystemWriter)
            dist.barrier()

    @with_comms(init_rpc=False)
    def test_async_save_with_sharded_tensors_verifies(self):
        full = _values(torch.float32)
        st = filled(full, chunks(0))
        path = self._tmp_dir()
        state = {"w": st, "bias": torch.arange(5.0), "step": 11}
        future = dcp.async_save(state, storage_writer=ChecksumFileSystemWriter(path))
        for shard in st.local_shards():  # training goes on: the save has its own copy
            shard.tensor.add_(1)
        future.result()
        dist.barrier()
        if self.rank == 0:
            self.assertTrue(verify_checkpoint(path, progress=False).ok)
        target = sharded_tensor.zeros(chunks(1), ROWS, COLS)
        loaded = {"w": target, "bias": torch.zeros(5), "step": 0}
        load(loaded, path)
        for shard in target.local_shards():
            self.assertTrue(torch.equal(shard.tensor, box_slice(full, shard.metadata)))
        self.assertTrue(torch.equal(loaded["bias"], torch.arange(5.0)))
        self.assertEqual(loaded["step"], 11)

    @with_comms(init_rpc=False)
    def test_async_save_with_default_stager(self):
        # No writer or stager given: DCP's own DefaultStager copies the ShardedTensors (NOTE [ Staging
        # a ShardedTensor with DCP's default stager ]) and FileSystemWriter saves them.
        full = _values(torch.float32)
        st = filled(full, chunks(0))
        doubles = filled(full.double(), chunks(1))
        group = st._process_group
        self.assertEqual(st.data_ptr(), 0)  # no storage of its own: DCP's stager copies its __dict__
        empty = st.new_empty(st.size(), device="cpu")
        self.assertEqual([s.metadata.shard_sizes for s in empty.local_shards()],
                         [s.metadata.shard_sizes for s in st.local_shards()])
        self.assertTrue(all(s.tensor.is_cpu for s in empty.local_shards()))
        path = self._tmp_dir()
        state = {"w": st, "d": doubles, "bias": torch.arange(5.0), "step": 11}
        future = dcp.async_save(state, checkpoint_id=path)
        for shard in st.local_shards():  # training goes on: the save has its own copy
            shard.tensor.add_(1)
        for shard in doubles.local_shards():
            shard.tensor.zero_()
        state["bias"].add_(1)
        future.result()
        dist.barrier()
        if self.rank == 0:
            report = verify_checkpoint(path, progress=False)
            self.assertTrue(report.ok, report)
        target = sharded_tensor.zeros(chunks(1), ROWS, COLS)
        other = sharded_tensor.zeros(chunks(0), ROWS, COLS, dtype=torch.float64)
        loaded = {"w": target, "d": other, "bias": torch.zeros(5), "step": 0}
        load(loaded, path)
        for shard in target.local_shards():
            self.assertTrue(torch.equal(shard.tensor, box_slice(full, shard.metadata)))
        for shard in other.local_shards():
            self.assertTrue(torch.equal(shard.tensor, box_slice(full.double(), shard.metadata)))
        self.assertTrue(torch.equal(loaded["bias"], torch.arange(5.0)))
        self.assertEqual(loaded["step"], 11)
        # The original is untouched by staging: same layout, its own (changed) shards, same group.
        for shard in st.local_shards():
            self.assertTrue(torch.equal(shard.tensor, box_slice(full, shard.metadata) + 1))
        self.assertIs(st._process_group, group)

    @with_comms(init_rpc=False)
    def test_verify_command_line(self):
        full = _values(torch.float32)
        path = self._tmp_dir()
        dcp.save({"layer.weight": filled(full, chunks(0)), "other": filled(full, chunks(1))},
                 storage_writer=ChecksumFileSystemWriter(path))
        dist.barrier()
        if self.rank == 0:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
            command = [sys.executable, "-m", "torch_shard.checkpoint", "verify", path]
            clean = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
            self.assertEqual(clean.returncode, 0, clean.stdout + clean.stderr)
            self.assertIn("OK", clean.stdout)
            _flip(path, "layer.weight", 16, 100)
            bad = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
            self.assertEqual(bad.returncode, 1, bad.stdout + bad.stderr)
            self.assertIn("layer.weight", bad.stdout)
            self.assertNotIn("  other", bad.stdout)
            missing = subprocess.run(command[:-1] + [path + "_none"], capture_output=True, text=True, env=env,
                                     timeout=300)
            self.assertEqual(missing.returncode, 2, missing.stdout + missing.stderr)
        dist.barrier()


def _xxh3(tensor) -> int:
    return xxhash.xxh3_64_intdigest(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())


def _saved(tensor):
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    source = BytesSource(buffer.getvalue(), 0)
    grid, tiles = tensor_tile_digests(tensor)
    return source, read_archive(source), ItemChecksums("t", _xxh3(tensor), grid, tuple(tiles))


def test_crc32_is_zlibs_whatever_the_backend():
    # zlib-ng / ISA-L / zlib: the same CRC-32, whole or continued piece by piece, of bytes and tensors.
    import zlib

    from torch_shard.checkpoint._archive import crc32

    rng = random.Random(0)
    data = bytes(rng.randrange(256) for _ in range(100_003))
    assert crc32(data) == zlib.crc32(data)
    running = 0
    for at in range(0, len(data), 7919):
        running = crc32(memoryview(data)[at : at + 7919], running)
    assert running == zlib.crc32(data)
    tensor = torch.frombuffer(bytearray(data[:100_000]), dtype=torch.float32)
    assert crc32(tensor) == zlib.crc32(data[:100_000])
    assert crc32(b"") == 0


def test_tile_digests_are_xxh3s_of_each_tiles_bytes():
    from torch_shard.checkpoint._digest import hasher

    torch.manual_seed(0)
    for shape in [(300, 700), (65, 256), (5, 3000), (1, 17), (128, 1024)]:
        t = torch.randn(shape)
        whole = hasher()
        grid, tiles = tensor_tile_digests(t, whole)
        m = t.reshape(-1).view(torch.uint8).view(grid.rows, grid.row_bytes)
        expected = []
        for r in range(0, grid.rows, grid.tile_rows):
            for c in range(0, grid.row_bytes, grid.tile_bytes):
                tile = m[r : r + grid.tile_rows, c : c + grid.tile_bytes].contiguous().numpy().tobytes()
                expected.append(xxhash.xxh3_64_intdigest(tile))
        assert tiles == expected, shape
        # The whole digest, handed the bytes band by band on the way, is the tensor's XXH3-64.
        assert whole.intdigest() == xxhash.xxh3_64_intdigest(t.numpy().tobytes()), shape


def test_a_damaged_tile_of_a_saved_chunk_is_caught_by_its_xxh3(tmp_path):
    # A chunk saved by ChecksumFileSystemWriter, opened as a load opens it: its data record is checked
    # by XXH3-64 (whole: check_whole / read_whole / hash_record_into agree on the digest, the writer's);
    # a box read by tiles checks each tile against its recorded XXH3-64, and a flipped byte in a tile
    # the box touches is named by its block.
    import warnings

    from torch_shard.checkpoint import ChecksumFileSystemWriter
    from torch_shard.checkpoint._archive import FileSource
    from torch_shard.checkpoint._checksums import location_key, parse
    from torch_shard.checkpoint._saved_item import (
        Expected,
        check_whole,
        hash_record_into,
        open_chunk,
        piece_scratch,
        read_record,
        read_whole,
    )

    tensor = torch.arange(512 * 1024, dtype=torch.float32).view(512, 1024)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"t": tensor}, storage_writer=ChecksumFileSystemWriter(str(tmp_path)), no_dist=True)
    [(index, info)] = dcp.FileSystemReader(str(tmp_path)).read_metadata().storage_data.items()
    sums = parse((tmp_path / ".checksums").read_bytes()).items[location_key(info.relative_path, info.offset)]
    assert sums.grid is not None and sums.digest == xxhash.xxh3_64_intdigest(tensor.numpy())
    place = ItemPlace("t", (0, 0), info.relative_path)
    file = tmp_path / info.relative_path
    with open(file, "rb") as f:
        plain = Expected(place, (512, 1024), torch.float32, None)
        checked = Expected(place, (512, 1024), torch.float32, sums)
        # Without checksums: the zip CRC-32, as before; with: the writer's XXH3-64.
        for expected, value in ((plain, None), (checked, sums.digest)):
            source = FileSource(f, info.offset, info.length)
            archive, bad = open_chunk(source, expected)
            assert not bad
            found, bad = check_whole(source, archive, expected, piece_scratch())
            assert not bad and found == (archive.data.crc if value is None else value)
            assert read_record(source, archive.data)[1] == found
            assert hash_record_into(source, archive.data, memoryview(bytearray(archive.data.size))) == found
            assert not read_whole(source, archive, expected)[1]
        assert archive.data.checked_by == "xxh3_64"
        box = ([100, 256], [200, 256])
        value, bad = read_box_by_tiles(source, archive, sums, *box, place)
        assert not bad and torch.equal(value, tensor[100:300, 256:512])
        at = info.offset + archive.data.data_offset + (150 * 1024 + 300) * 4 + 1
    data = bytearray(file.read_bytes())
    data[at] ^= 0x04
    file.write_bytes(bytes(data))
    with open(file, "rb") as f:
        source = FileSource(f, info.offset, info.length)
        _, bad = read_box_by_tiles(source, archive, sums, *box, place)
        [corruption] = bad
        k = int(corruption.what.split()[1])
        assert corruption.what.startswith("block") and corruption.expected == sums.tile_digests[k] != corruption.found
        assert corruption.found > 0xFFFFFFFF or sums.tile_digests[k] > 0xFFFFFFFF  # 64-bit digests, not CRC-32s
        # A box beside it, in other tiles, reads clean; the whole record fails its digest.
        assert not read_box_by_tiles(source, archive, sums, [100, 512], [200, 256], place)[1]
        [whole] = check_whole(source, archive, checked, piece_scratch())[1]
        assert whole.expected == sums.digest and "not the data this save wrote" in whole.what


def test_box_reads_match_slicing():
    rng = random.Random(0)
    place = ItemPlace("t", None, "f")
    for shape, dtype in [((3000,), torch.float32), ((40, 700), torch.bfloat16), ((5, 30, 90), torch.int64),
                         ((130, 1100), torch.uint8), ((7, 3, 300), torch.float64)]:
        tensor = (torch.rand(shape) * 1000).to(dtype)
        source, archive, sums = _saved(tensor)
        for _ in range(25):
            offsets = [rng.randrange(n) for n in shape]
            lengths = [rng.randrange(1, n - o + 1) for n, o in zip(shape, offsets)]
            value, bad = read_box_by_tiles(source, archive, sums, offsets, lengths, place)
            expected = tensor[tuple(slice(o, o + n) for o, n in zip(offsets, lengths))]
            assert not bad
            assert torch.equal(value, expected), (shape, offsets, lengths)


def test_box_reads_catch_every_flipped_byte_they_read():
    tensor = torch.arange(40 * 700, dtype=torch.float32).view(40, 700)
    source, archive, sums = _saved(tensor)
    place = ItemPlace("t", None, "f")
    data = bytearray(source.data)
    rng = random.Random(1)
    for _ in range(20):
        element = rng.randrange(tensor.numel())
        at = archive.data.data_offset + element * 4 + rng.randrange(4)
        flipped = bytearray(data)
        flipped[at] ^= 0x01
        row, col = divmod(element, 700)
        # A box holding the element, and one that only shares its tile.
        _, bad = read_box_by_tiles(BytesSource(bytes(flipped), 0), archive, sums, [row, col], [1, 1], place)
        assert len(bad) == 1 and bad[0].expected != bad[0].found
        # A box that shares only the element's tile reads and checks it too.
        per_tile = sums.grid.tile_bytes // 4
        other = col + 1 if col % per_tile != per_tile - 1 and col + 1 < 700 else col - 1
        _, bad = read_box_by_tiles(BytesSource(bytes(flipped), 0), archive, sums, [row, other], [1, 1], place)
        assert len(bad) == 1


if __name__ == "__main__":
    run_tests()


def test_boxes_of_a_whole_record_match_slicing_and_any_flipped_byte_is_caught():
    # A chunk without tile CRCs read in parts: the whole record is hashed a run of dim-0 slices at a
    # time, and only the boxes are kept (several at once, any dims, slices smaller and bigger than a piece).
    from torch_shard.checkpoint import _saved_item
    from torch_shard.checkpoint._saved_item import Expected, boxes_readable_whole, read_boxes_of_whole

    rng = random.Random(2)
    place = ItemPlace("t", None, "f")
    for shape, dtype in [((300, 700), torch.float32), ((5, 30, 900), torch.int64), ((3, 200_000), torch.float32),
                         ((150_000,), torch.bfloat16)]:
        tensor = (torch.rand(shape) * 1000).to(dtype)
        source, archive, _ = _saved(tensor)
        expected = Expected(place, tuple(shape), dtype, None)
        assert boxes_readable_whole(archive, expected, source.length)
        boxes = []
        for _ in range(4):
            offsets = [rng.randrange(n) for n in shape]
            boxes.append((offsets, [rng.randrange(1, n - o + 1) for n, o in zip(shape, offsets)]))
        with mock.patch.object(_saved_item, "_PIECE", 64 * 1024):  # several pieces even for the small shapes
            values, bad = read_boxes_of_whole(source, archive, expected, boxes)
        assert not bad
        for (offsets, lengths), value in zip(boxes, values):
            assert torch.equal(value, tensor[tuple(slice(o, o + n) for o, n in zip(offsets, lengths))]), shape
        data = bytearray(source.data)
        data[archive.data.data_offset + rng.randrange(archive.data.size)] ^= 0x10
        _, bad = read_boxes_of_whole(BytesSource(bytes(data), 0), archive, expected, boxes[:1])
        assert len(bad) == 1 and bad[0].expected != bad[0].found, shape
        # With the writer's digest (a chunk of a checkpoint with .checksums): checked by XXH3-64.
        with_sums = Expected(place, tuple(shape), dtype, ItemChecksums("t", _xxh3(tensor)))
        values, bad = read_boxes_of_whole(source, archive, with_sums, boxes[:1])
        assert not bad and torch.equal(values[0], tensor[tuple(slice(o, o + n) for o, n in zip(*boxes[0]))]), shape
        [wrong] = read_boxes_of_whole(BytesSource(bytes(data), 0), archive, with_sums, boxes[:1])[1]
        assert wrong.expected == with_sums.sums.digest, shape


def test_row_reads_match_the_file_however_they_are_read(tmp_path):
    # FileSource.read_rows: a read per row (wide holes), runs of rows read with their holes (holes no
    # wider than the rows), and rows of a read window (a small archive read whole).
    from torch_shard.checkpoint._archive import FileSource

    data = bytes(random.Random(0).randrange(256) for _ in range(300_000))
    (tmp_path / "f").write_bytes(data)
    with open(tmp_path / "f", "rb", buffering=0) as f:
        for windows in (False, True):
            for offset, stride, width, count in [(10, 1000, 600, 200), (5, 3000, 100, 50), (0, 512, 512, 400),
                                                 (7, 60_000, 50_000, 4), (3, 20_000, 12_000, 1)]:
                source = FileSource(f, 123, 250_000, windows=windows)
                source.read_into(memoryview(bytearray(10)), 0)  # a small read: the window, if any
                out = bytearray(width * count)
                source.read_rows(memoryview(out), offset, stride, width, count)
                at = 123 + offset
                assert bytes(out) == b"".join(data[at + i * stride : at + i * stride + width] for i in range(count))
