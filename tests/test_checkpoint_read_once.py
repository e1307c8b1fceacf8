"""Read once across the ranks (issue 43): ``ByteRangeFileSystemReader(read_once=True)``.

TestReadOnce (4 ranks, gloo): a state dict of a row-sharded tensor and a replicated one, saved with
``ChecksumFileSystemWriter`` and loaded in the saved layout and into columns:

* the values land exactly, and the bytes read from the checkpoint's files, summed over the ranks, are
  the union of what the ranks need (at most 1.05x, with archive headers), where each rank reading for
  itself reads the replicated tensor once per rank;
* bands and rounds: with small bands and a small round budget a load takes several exchange rounds
  and still lands exactly;
* a damaged byte in the replicated chunk (read by one rank for all) raises the same
  ``CheckpointCorruptionError`` on every rank with every destination unchanged;
* a rank whose reads fail (EIO) makes every rank raise ``CheckpointLoadError``, destinations unchanged;
* a chunk that changes on disk after the agreement, before its reader reads it again to send it,
  raises on every rank, saying so;
* the default: off for a checkpoint on a local file system (no schedule in the plan).

The upstream-derived scenarios (sub-groups, empty shards, DTensor and upstream ShardedTensor layouts)
run read-once in test_checkpoint_scenarios.py (the ``ReadOnce`` classes). Single-process: the
schedule's units cover every needed box exactly once, readers are balanced, and
``on_network_filesystem`` tells network and FUSE mounts from local ones.
"""

import errno
import math
from unittest import mock

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from _shared import box_slice, chunks, filled, shared_tmp_dir

from torch_shard import sharded_tensor
from torch_shard.checkpoint import (
    ByteRangeFileSystemReader,
    CheckpointCorruptionError,
    CheckpointLoadError,
    ChecksumFileSystemWriter,
    _archive,
    _load_outcome,
    load,
)
from torch_shard.checkpoint.read import chunk as read_chunk
from torch_shard.checkpoint.read import exchange as read_exchange
from torch_shard.checkpoint.read import mounts as read_mounts
from torch_shard.checkpoint.read import schedule as read_schedule
from torch_shard.testing import ShardedTensorTestBase, run_tests, with_comms

ROWS, COLS, REP = 512, 256, 384


class TestReadOnce(ShardedTensorTestBase):
    def _save(self, rep_rows=REP):
        torch.manual_seed(0)
        full = torch.randn(ROWS, COLS).to(self.device)
        rep = torch.randn(rep_rows, COLS).to(self.device)
        path = shared_tmp_dir(self, "torch_shard_read_once_")
        state = {"sharded": filled(full, chunks(0)), "rep": rep.clone(), "step": 7}
        dcp.save(state, storage_writer=ChecksumFileSystemWriter(path))
        dist.barrier()
        return path, full, rep

    def _targets(self, spec, rep_rows=REP):
        return {
            "sharded": sharded_tensor.full(spec, (ROWS, COLS), -1.0),
            "rep": torch.full((rep_rows, COLS), -1.0, device=self.device),
            "step": 0,
        }

    def _holds(self, state, full, rep, msg=""):
        for shard in state["sharded"].local_shards():
            self.assertTrue(torch.equal(shard.tensor, box_slice(full, shard.metadata)), msg)
        self.assertTrue(torch.equal(state["rep"], rep), msg)
        self.assertEqual(state["step"], 7, msg)

    def _untouched(self, state, msg=""):
        for shard in state["sharded"].local_shards():
            self.assertTrue(bool((shard.tensor == -1).all()), msg)
        self.assertTrue(bool((state["rep"] == -1).all()), msg)

    def _load(self, path, spec, rep_rows=REP, **kwargs):
        state = self._targets(spec, rep_rows)
        reader = ByteRangeFileSystemReader(path, **kwargs)
        dcp.load(state, storage_reader=reader)
        read = torch.tensor([reader.timings.read_bytes])
        dist.all_reduce(read)
        return state, int(read), reader

    @with_comms(init_rpc=False)
    def test_every_needed_byte_is_read_once(self):
        path, full, rep = self._save()
        union = (ROWS + REP) * COLS * 4
        for spec, name in ((chunks(0), "rows"), (chunks(1), "columns")):
            once, read_once, reader = self._load(path, spec, read_once=True)
            self._holds(once, full, rep, name)
            self.assertGreaterEqual(read_once, union, name)
            self.assertLessEqual(read_once, 1.05 * union, name)
            if name == "columns":  # the replicated tensor's bytes moved between ranks
                self.assertGreater(reader.timings.exchange_s, 0.0)
            each, read_each, _ = self._load(path, spec, read_once=False)
            self._holds(each, full, rep, name)
            # Each rank for itself: the replicated tensor once per rank.
            self.assertGreaterEqual(read_each, ROWS * COLS * 4 + self.world_size * REP * COLS * 4, name)
        # Whole chunks checked, then read again into their destinations (as chunks of 32 MiB and more
        # are): the second reads are counted apart, as read again.
        with mock.patch.object(read_chunk, "_READ_TWICE_FROM", 0):
            once, read_once, reader = self._load(path, chunks(0), read_once=True)
        self._holds(once, full, rep, "read twice")
        self.assertLessEqual(read_once, 1.05 * union)
        self.assertGreaterEqual(reader.timings.reread_bytes, ROWS // self.world_size * COLS * 4, str(reader.timings))

    @with_comms(init_rpc=False)
    def test_bands_and_rounds(self):
        rep_rows = 6 * 1024  # 6 MiB: tile rows of 1024 rows (64 KiB tiles of 64-byte row pieces)
        path, full, rep = self._save(rep_rows)
        union = (ROWS + rep_rows) * COLS * 4
        # 1 MiB bands, 1 MiB rounds: the replicated tensor in 6 bands read by different ranks, two
        # rounds for a rank that reads two of them.
        with mock.patch.object(read_schedule, "BAND_BYTES", 1 << 20), mock.patch.object(read_schedule, "ROUND_BYTES", 1 << 20):
            calls = []
            exchange = read_exchange.exchange_round

            def counted(*args, **kwargs):
                calls.append(1)
                return exchange(*args, **kwargs)

            with mock.patch("torch_shard.checkpoint.read.read_once.exchange_round", counted):
                for spec in (chunks(0), chunks(1, (2, 0, 3, 1))):
                    calls.clear()
                    state, read, _ = self._load(path, spec, rep_rows, read_once=True)
                    self._holds(state, full, rep, str(spec))
                    self.assertLessEqual(read, 1.05 * union)
                    self.assertGreater(len(calls), 1, "expected several exchange rounds")

    @with_comms(init_rpc=False)
    def test_damage_in_a_chunk_read_for_all_raises_on_every_rank(self):
        path, full, rep = self._save()
        if self.rank == 0:
            md = dcp.FileSystemReader(path).read_metadata()
            (index,) = [i for i in md.storage_data if i.fqn == "rep"]
            info = md.storage_data[index]
            with open(f"{path}/{info.relative_path}", "r+b") as f:
                at = info.offset + info.length - 64 * 1024  # inside the data record
                f.seek(at)
                byte = f.read(1)
                f.seek(at)
                f.write(bytes([byte[0] ^ 0x40]))
        dist.barrier()
        state = self._targets(chunks(1))
        with self.assertRaises(CheckpointCorruptionError) as cm:
            load(state, path, read_once=True)
        self.assertIn("'rep'", str(cm.exception))
        self._untouched(state)

    @with_comms(init_rpc=False)
    def test_a_chunk_changed_after_the_agreement_raises_on_every_rank(self):
        # NOTE [ Read once: check, agree, then read again and deliver ]: the replicated tensor's file
        # changes on disk after every rank checked its units and agreed, before the reader reads its
        # band again to send it: the reader sees it, and every rank raises its error.
        path, full, rep = self._save()
        md = dcp.FileSystemReader(path).read_metadata()
        (info,) = [md.storage_data[i] for i in md.storage_data if i.fqn == "rep"]
        agree, calls = _load_outcome.exchange, []

        def agree_then_change(outcome, participants):
            calls.append(outcome)
            if len(calls) == 1 and self.rank == 0:
                with open(f"{path}/{info.relative_path}", "r+b") as f:
                    at = info.offset + info.length - 64 * 1024  # inside the data record
                    f.seek(at)
                    byte = f.read(1)[0]
                    f.seek(at)
                    f.write(bytes([byte ^ 0x40]))
            return agree(outcome, participants)

        state = self._targets(chunks(1))
        with mock.patch.object(_load_outcome, "exchange", agree_then_change), \
                self.assertRaises(CheckpointCorruptionError) as cm:
            load(state, path, read_once=True)
        self.assertEqual(len(calls), 1)
        self.assertIn("changed on disk during the load", str(cm.exception))
        self.assertIn("partly written", str(cm.exception))
        messages = [None] * dist.get_world_size()
        dist.all_gather_object(messages, str(cm.exception))
        self.assertEqual(len(set(messages)), 1)
        # Loaded again, the changed chunk fails its first check: nothing is written anywhere.
        state = self._targets(chunks(1))
        with self.assertRaises(CheckpointCorruptionError):
            load(state, path, read_once=True)
        self._untouched(state)

    @with_comms(init_rpc=False)
    def test_a_rank_whose_reads_fail_makes_every_rank_raise(self):
        path, full, rep = self._save()
        state = self._targets(chunks(1))
        failing = _archive._read_exact

        def eio(*args, **kwargs):
            raise OSError(errno.EIO, "Input/output error")

        patch = mock.patch.object(_archive, "_read_exact", eio if self.rank == 2 else failing)
        with patch, self.assertRaises((CheckpointLoadError, CheckpointCorruptionError)) as cm:
            load(state, path, read_once=True)
        self.assertIn("Input/output error", str(cm.exception))
        self._untouched(state)
        # The next load, with nothing failing, lands.
        state, _, _ = self._load(path, chunks(1), read_once=True)
        self._holds(state, full, rep)

    @with_comms(init_rpc=False)
    def test_default_is_off_on_a_local_file_system(self):
        path, full, rep = self._save()
        seen = []
        read_data = ByteRangeFileSystemReader.read_data

        def spy(reader, plan, planner):
            seen.append(type(plan.storage_data).__name__)
            return read_data(reader, plan, planner)

        with mock.patch.object(ByteRangeFileSystemReader, "read_data", spy):
            state, read, _ = self._load(path, chunks(1))
        self._holds(state, full, rep)
        self.assertEqual(seen, ["Participants"])
        with mock.patch.object(ByteRangeFileSystemReader, "read_data", spy), \
                mock.patch("torch_shard.checkpoint._reader.on_network_filesystem", return_value=True):
            self._load(path, chunks(1))
        self.assertEqual(seen[-1], "ReadOnce")


def test_read_once_needs_verify():
    import pytest

    with pytest.raises(ValueError, match="read_once=True needs verify=True"):
        ByteRangeFileSystemReader("/nonexistent", verify=False, read_once=True)


def test_network_and_fuse_mounts_are_told_from_local_ones():
    mounts = (
        "/dev/sda1 / ext4 rw 0 0\n"
        "server:/export /mnt/nfs nfs4 rw 0 0\n"
        "user@host:/data /mnt/ss fuse.sshfs rw 0 0\n"
        "tmpfs /mnt/nfs/local tmpfs rw 0 0\n"
    )
    with mock.patch("builtins.open", mock.mock_open(read_data=mounts)), \
            mock.patch("os.path.realpath", side_effect=lambda p: p):
        assert read_mounts.on_network_filesystem("/mnt/nfs/ckpt")
        assert read_mounts.on_network_filesystem("/mnt/ss/run/step100")
        assert not read_mounts.on_network_filesystem("/mnt/nfs/local/ckpt")  # the deeper mount wins
        assert not read_mounts.on_network_filesystem("/home/ckpt")
        assert not read_mounts.on_network_filesystem("/mnt/nfsx")  # a prefix of the name is not the mount


def test_units_cover_every_needed_box_once_and_readers_are_balanced():
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

    from torch_shard.checkpoint._checksums import ItemChecksums, TileGrid
    from torch_shard.checkpoint._load_outcome import Participants

    # One 4096 x 1024 float32 chunk (16 MiB), replicated on 4 ranks, plus 4 row chunks each needed by
    # its own rank.
    world, rows, cols = 4, 4096, 1024
    index = MetadataIndex("rep", [0, 0])
    md = {"rep": TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([rows, cols]),
                                       [ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([rows, cols]))])}
    storage = {index: _StorageInfo("__rep.distcp", 0, rows * cols * 4 + 1024)}
    shard_rows = 1024
    md["w"] = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([world * shard_rows, cols]),
                                    [ChunkStorageMetadata(torch.Size([r * shard_rows, 0]), torch.Size([shard_rows, cols]))
                                     for r in range(world)])
    for r in range(world):
        storage[MetadataIndex("w", [r * shard_rows, 0])] = _StorageInfo(f"__{r}_0.distcp", 0, shard_rows * cols * 4 + 1024)
    grid = TileGrid.for_chunk((rows, cols), 4)

    class Sums:
        items = {"__rep.distcp:0": ItemChecksums("rep", 0, grid, (0,) * grid.count)}

    plans = []
    for r in range(world):
        items = [ReadItem(LoadItemType.TENSOR, MetadataIndex("rep"), torch.Size([0, 0]), index,
                          torch.Size([0, 0]), torch.Size([rows, cols]))]
        wi = MetadataIndex("w", [r * shard_rows, 0])
        items.append(ReadItem(LoadItemType.TENSOR, wi, torch.Size([0, 0]), wi, torch.Size([0, 0]),
                              torch.Size([shard_rows, cols])))
        plans.append(LoadPlan(items))
    with mock.patch.object(read_schedule, "BAND_BYTES", 1 << 20):
        out = read_schedule.plan_read_once(plans, Participants(tuple(range(world))), storage, Metadata(md), Sums())
    schedule = out[0].storage_data
    units = schedule.units
    # Every rank's every item is covered exactly by its pieces.
    for r, plan in enumerate(out):
        for item, pieces in zip(plan.items, plan.storage_data.pieces):
            covered = torch.zeros(list(item.lengths), dtype=torch.int32)
            for p in pieces:
                u = units[p.unit]
                assert r in u.receivers
                covered[tuple(slice(a, a + n) for a, n in zip(p.at, u.lengths))] += 1
            assert bool((covered == 1).all())
    # Bytes read: the union (16 MiB + 16 MiB), balanced over the ranks; shards read by their owners.
    read = [0] * world
    for u in units:
        read[u.reader] += u.nbytes
    assert sum(read) == 2 * rows * cols * 4
    assert max(read) - min(read) <= (1 << 20)
    for u in units:
        if u.chunk.fqn == "w":
            assert u.receivers == (u.reader,)
    # Each band is tile-aligned: its first row starts a tile row.
    for u in units:
        if u.chunk.fqn == "rep":
            assert u.offsets[0] % grid.tile_rows == 0
    assert math.prod(units[0].lengths) > 0


if __name__ == "__main__":
    run_tests()
