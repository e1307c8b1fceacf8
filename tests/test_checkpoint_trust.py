"""A checked load trusts nothing it has not checked (issue 32): checkpoints attacked, not just bit-flipped.

TestCheckpointTrust (4 ranks, gloo): the ways a checkpoint directory can hold the wrong bytes while
every zip record stays consistent with itself, and the failures that used to leave destinations half
written or reach users as DCP's BaseException:

* a ``.distcp`` file, or one chunk, copied from an older save of the same model; two ranks' files
  swapped (NOTE [ What .checksums binds to one save ]);
* ``.metadata`` rewritten with a chunk moved or two chunks' offsets swapped, and single bit flips of it
  (NOTE [ Checking a checkpoint's metadata ]);
* ``.checksums`` truncated, with a flipped digit, or left by another save;
* a data file deleted or truncated;
* a bytes item that cannot be unpickled (its class gone, a damaged pickle);
* a load that fails for another reason (a key the checkpoint lacks).

Every damaged load raises the same ``Exception`` subclass on every rank with every destination as it
was, ``verify`` exits 1 on exactly the damaged checkpoints, and a load that succeeds holds exactly the
saved values. Single-process tests at the end: ``.checksums``'s own check catches every changed
character, and the metadata digest survives a pickle round trip.
"""

import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import types
import warnings
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import xxhash
from _shared import box_slice, chunks, filled, shared_tmp_dir
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

from torch_shard import sharded_tensor
from torch_shard.checkpoint import (
    ByteRangeFileSystemReader,
    CheckpointCorruptionError,
    CheckpointLoadError,
    ChecksumFileSystemWriter,
    _checksums,
    _load_outcome,
    _metadata,
    load,
    verify_checkpoint,
)
from torch_shard.checkpoint._archive import BytesSource, read_archive
from torch_shard.checkpoint.read import chunk as read_chunk
from torch_shard.testing import ShardedTensorTestBase, run_tests, with_comms

ROWS, COLS = 64, 640
FILL = -7.0


def _values(seed):
    return torch.arange(ROWS * COLS, dtype=torch.float32).view(ROWS, COLS) + 1000.0 * seed


def _verify_exit(path, *flags) -> int:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    command = [sys.executable, "-m", "torch_shard.checkpoint", "verify", *flags, path]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300).returncode


def _storage(path):
    return dcp.FileSystemReader(path).read_metadata().storage_data


class TestCheckpointTrust(ShardedTensorTestBase):
    def _tmp_dir(self) -> str:
        return shared_tmp_dir(self, "torch_shard_trust_")

    def _on_rank0(self, fn):
        """Run ``fn`` on rank 0 only (it changes the checkpoint's files), then let every rank go on."""
        dist.barrier()
        if self.rank == 0:
            fn()
        dist.barrier()

    def _targets(self):
        return {dim: sharded_tensor.full(chunks(dim), (ROWS, COLS), FILL) for dim in (0, 1)}

    def _assert_untouched(self, st, msg):
        for shard in st.local_shards():
            self.assertTrue(bool((shard.tensor == FILL).all()), f"{msg}: a destination was written")

    def _assert_holds(self, st, full, msg):
        for shard in st.local_shards():
            self.assertTrue(torch.equal(shard.tensor, box_slice(full, shard.metadata)), msg)

    def _assert_refused(self, path, error=CheckpointCorruptionError, msg="", state=None, **reader_kwargs):
        """Every rank raises ``error`` loading ``path`` into rows and into columns, nothing written;
        returns the exceptions."""
        caught = []
        for dim, target in self._targets().items():
            loaded = {"w": target} if state is None else dict(state, w=target)
            with self.assertRaises(error, msg=f"{msg} (load dim {dim})") as cm:
                load(loaded, path, **reader_kwargs)
            self._assert_untouched(target, f"{msg} (load dim {dim})")
            caught.append(cm.exception)
        # Every rank raised the same error (the agreement): compare the messages.
        messages = [None] * dist.get_world_size()
        dist.all_gather_object(messages, str(caught[0]))
        self.assertEqual(len(set(messages)), 1, msg)
        return caught

    @with_comms(init_rpc=False)
    def test_files_and_chunks_of_another_save_are_caught(self):
        old, new = _values(1), _values(2)
        for how in ("file", "chunk", "swap"):
            older, path = self._tmp_dir(), self._tmp_dir()
            # Two tensors, so each .distcp file holds two chunks and "chunk" replaces one of them.
            dcp.save({"w": filled(old, chunks(0)), "v": filled(old, chunks(0))},
                     storage_writer=ChecksumFileSystemWriter(older))
            dcp.save({"w": filled(new, chunks(0)), "v": filled(new, chunks(0))},
                     storage_writer=ChecksumFileSystemWriter(path))

            def damage(how=how, older=older, path=path):
                if how == "file":  # a crashed save left an older file in place
                    shutil.copy(os.path.join(older, "__0_0.distcp"), os.path.join(path, "__0_0.distcp"))
                elif how == "chunk":  # one chunk's bytes from the older save, at the same place
                    [(_, info)] = [(i, s) for i, s in _storage(path).items() if i.fqn == "w" and i.offset[0] == 16]
                    with open(os.path.join(older, info.relative_path), "rb") as f:
                        f.seek(info.offset)
                        chunk = f.read(info.length)
                    with open(os.path.join(path, info.relative_path), "r+b") as f:
                        f.seek(info.offset)
                        f.write(chunk)
                else:  # two ranks' files swapped
                    a, b = os.path.join(path, "__0_0.distcp"), os.path.join(path, "__1_0.distcp")
                    os.rename(a, a + ".tmp")
                    os.rename(b, a)
                    os.rename(a + ".tmp", b)

            self._on_rank0(damage)
            caught = self._assert_refused(path, msg=how)
            self.assertTrue(all(c.fqn in ("w", "v") for c in caught[0].corruptions), caught[0])
            # Unchecked, the damage loads silently: the probe hits data a load uses.
            target = sharded_tensor.full(chunks(0), (ROWS, COLS), FILL)
            dcp.load({"w": target}, storage_reader=ByteRangeFileSystemReader(path, verify=False))
            wrong = torch.tensor([int(not torch.equal(s.tensor, box_slice(new, s.metadata))) for s in target.local_shards()])
            dist.all_reduce(wrong)
            self.assertGreater(int(wrong), 0, how)
            if self.rank == 0:
                self.assertFalse(verify_checkpoint(path, progress=False).ok, how)
                self.assertEqual(_verify_exit(path), 1, how)
            dist.barrier()

    @with_comms(init_rpc=False)
    def test_checksums_hold_every_ranks_items_and_each_names_its_item(self):
        # Each rank's checksums travel to the coordinator as one encoded string, joined there: every
        # stored item of every rank (sharded chunks, a tensor and a bytes item saved per rank, a big
        # tensor hashed on the writer's thread) has exactly one entry, under its own place.
        path = self._tmp_dir()
        state = {
            "w": filled(_values(3), chunks(0)),
            f"plain{self.rank}": torch.full((5, 3), float(self.rank)),
            f"note{self.rank}": {"rank": self.rank},
            f"big{self.rank}": torch.full((512, 1024), float(self.rank)),  # 2 MiB: hashed on a thread
        }
        dcp.save(state, storage_writer=ChecksumFileSystemWriter(path))
        if self.rank == 0:
            storage = _storage(path)
            with open(os.path.join(path, ".checksums"), "rb") as f:
                sums = _checksums.parse(f.read())
            expected = {_checksums.location_key(info.relative_path, info.offset): index.fqn
                        for index, info in storage.items()}
            self.assertEqual({key: item.fqn for key, item in sums.items.items()}, expected)
            self.assertEqual(len({info.relative_path for info in storage.values()}), dist.get_world_size())
            self.assertTrue(verify_checkpoint(path, progress=False).ok)
        target = sharded_tensor.full(chunks(1), (ROWS, COLS), FILL)
        load({"w": target}, path)
        self._assert_holds(target, _values(3), "a load checked against the joined .checksums")

    @with_comms(init_rpc=False)
    def test_nothing_is_written_when_a_bytes_item_cannot_be_unpickled(self):
        full = _values(3)
        gone = types.ModuleType("torch_shard_test_gone_module")

        class Gone:
            pass

        Gone.__module__, Gone.__qualname__ = gone.__name__, "Gone"
        gone.Gone = Gone
        for case in ("class gone", "damaged pickle"):
            path = self._tmp_dir()
            sys.modules[gone.__name__] = gone
            try:
                # Keys after "w" in every order DCP may take: the tensor is planned before the item.
                state = {"w": filled(full, chunks(0)), "z_item": Gone(), "a_item": "epoch 4"}
                dcp.save(state, storage_writer=dcp.FileSystemWriter(path))
            finally:
                del sys.modules[gone.__name__]

            if case == "damaged pickle":
                def damage(path=path):
                    [(_, info)] = [(i, s) for i, s in _storage(path).items() if i.fqn == "a_item"]
                    file = os.path.join(path, info.relative_path)
                    with open(file, "r+b") as f:
                        f.seek(info.offset)
                        archive = read_archive(BytesSource(f.read(info.length), info.offset), with_tensor=False)
                        [pkl] = [r for r in archive.records if r.name.endswith("data.pkl")]
                        f.seek(info.offset + pkl.data_offset)
                        f.write(b"\xff\xfe")  # not a pickle opcode: unpickling fails
                self._on_rank0(damage)
            loaded = {"z_item": None, "a_item": None}
            [rows, cols] = self._assert_refused(path, error=CheckpointLoadError, msg=case, state=loaded)
            self.assertNotIsInstance(rows, CheckpointCorruptionError, case)  # a plain checkpoint: no CRC says
            self.assertIsInstance(rows.__cause__, CheckpointException, case)
            self.assertIn("cannot be unpickled", str(rows))
            self.assertIn("_item", str(rows))
            self.assertEqual(loaded, {"z_item": None, "a_item": None}, case)

    @with_comms(init_rpc=False)
    def test_rewritten_metadata_is_caught(self):
        full = _values(4)
        for writer_cls in (ChecksumFileSystemWriter, dcp.FileSystemWriter):
            for how in ("moved", "swapped"):
                path = self._tmp_dir()
                dcp.save({"w": filled(full, chunks(0))}, storage_writer=writer_cls(path))

                def damage(path=path, how=how):
                    file = os.path.join(path, ".metadata")
                    with open(file, "rb") as f:
                        md = pickle.load(f)
                    chunks = md.state_dict_metadata["w"].chunks
                    if how == "moved":  # chunk 1 moved from row 16 to row 20: a gap and an overlap
                        moves = {16: 20}
                    else:  # chunks 1 and 2 trade places: they still tile the tensor
                        moves = {16: 32, 32: 16}
                    for i, c in enumerate(chunks):
                        if c.offsets[0] in moves:
                            offsets = torch.Size([moves[c.offsets[0]], 0])
                            chunks[i] = ChunkStorageMetadata(offsets, c.sizes)
                    md.storage_data = {
                        (MetadataIndex(k.fqn, [moves.get(k.offset[0], k.offset[0]), 0]) if k.fqn == "w" else k): v
                        for k, v in md.storage_data.items()
                    }
                    with open(file, "wb") as f:
                        pickle.dump(md, f)

                self._on_rank0(damage)
                msg = f"{writer_cls.__name__} {how}"
                if writer_cls is dcp.FileSystemWriter and how == "swapped":
                    # Without .checksums a well-formed swap is invisible (documented in NOTE [ Verified
                    # loads ]): the load succeeds with the rows swapped.
                    continue
                [caught, _] = self._assert_refused(path, msg=msg)
                self.assertEqual({c.file for c in caught.corruptions}, {".metadata"}, msg)
                if self.rank == 0:
                    self.assertEqual(_verify_exit(path), 1, msg)
                dist.barrier()

    @with_comms(init_rpc=False)
    def test_metadata_bit_flips_never_load_wrong_or_partly(self):
        full = _values(5)
        rng = random.Random(32)
        for writer_cls in (ChecksumFileSystemWriter, dcp.FileSystemWriter):
            path = self._tmp_dir()
            dcp.save({"w": filled(full, chunks(0)), "step": 7}, storage_writer=writer_cls(path))
            size = os.path.getsize(os.path.join(path, ".metadata"))
            with open(os.path.join(path, ".metadata"), "rb") as f:
                original = f.read()
            flips = [(rng.randrange(size), 1 << rng.randrange(8)) for _ in range(64)]
            refused = 0
            for at, bit in flips:
                def damage(at=at, bit=bit, path=path, original=original):
                    flipped = bytearray(original)
                    flipped[at] ^= bit
                    with open(os.path.join(path, ".metadata"), "wb") as f:
                        f.write(flipped)

                self._on_rank0(damage)
                msg = f"{writer_cls.__name__}: byte {at} bit {bit:#x} of {size}"
                target = sharded_tensor.full(chunks(1), (ROWS, COLS), FILL)
                state = {"w": target, "step": 0}
                try:
                    load(state, path)
                except CheckpointLoadError:
                    refused += 1
                    self._assert_untouched(target, msg)
                    self.assertEqual(state["step"], 0, msg)
                    ok = torch.tensor([0])
                else:
                    ok = torch.tensor([1])
                    if writer_cls is ChecksumFileSystemWriter:  # with .checksums, never wrong
                        self._assert_holds(target, full, msg)
                        self.assertEqual(state["step"], 7, msg)
                    else:  # without, never partly: every shard read from the file, or raised
                        for shard in target.local_shards():
                            self.assertFalse(bool((shard.tensor == FILL).any()), msg)
                # Every rank reached the same verdict, and verify agrees with it.
                loaded_on = ok.clone()
                dist.all_reduce(loaded_on)
                self.assertIn(int(loaded_on), (0, dist.get_world_size()), msg)
                if self.rank == 0 and writer_cls is ChecksumFileSystemWriter:
                    try:
                        verified = verify_checkpoint(path, progress=False).ok
                    except FileNotFoundError:
                        verified = False
                    self.assertEqual(verified, bool(int(ok)), msg)
            self.assertGreater(refused, 0, writer_cls)

    @with_comms(init_rpc=False)
    def test_damaged_checksums_file_is_named(self):
        full = _values(6)
        for how in ("truncated", "digit", "another save"):
            path = self._tmp_dir()
            dcp.save({"w": filled(full, chunks(0))}, storage_writer=ChecksumFileSystemWriter(path))
            sums = os.path.join(path, ".checksums")

            def damage(how=how, path=path, sums=sums):
                with open(sums, "rb") as f:
                    data = f.read()
                if how == "truncated":
                    data = data[: len(data) // 2]
                elif how == "digit":  # one hex digit of the first data digest
                    at = data.index(b'"digest":"') + len(b'"digest":"')
                    data = data[:at] + (b"1" if data[at : at + 1] != b"1" else b"2") + data[at + 1 :]
                else:  # a later save by DCP's own writer leaves this save's .checksums behind
                    dcp.save({"w": full}, storage_writer=dcp.FileSystemWriter(path), no_dist=True)
                    return
                with open(sums, "wb") as f:
                    f.write(data)

            self._on_rank0(damage)
            [caught, _] = self._assert_refused(path, msg=how)
            self.assertEqual([(c.fqn, c.file) for c in caught.corruptions[:1]], [(None, ".checksums")], how)
            self.assertTrue(all(c.fqn is None for c in caught.corruptions), how)  # no data block blamed
            if how != "another save":
                self.assertIn("checksums=False", str(caught))
                # The data are intact: checked against their zip CRC-32s alone, they load.
                target = sharded_tensor.zeros(chunks(1), ROWS, COLS)
                load({"w": target}, path, checksums=False)
                self._assert_holds(target, full, how)
            if self.rank == 0:
                self.assertEqual(_verify_exit(path), 1, how)
                if how != "another save":
                    self.assertEqual(_verify_exit(path, "--no-checksums"), 0, how)
            dist.barrier()

    @with_comms(init_rpc=False)
    def test_missing_or_truncated_data_file(self):
        full = _values(7)
        for writer_cls in (ChecksumFileSystemWriter, dcp.FileSystemWriter):
            for how in ("deleted", "truncated"):
                path = self._tmp_dir()
                dcp.save({"w": filled(full, chunks(0))}, storage_writer=writer_cls(path))

                def damage(how=how, path=path):
                    file = os.path.join(path, "__2_0.distcp")
                    if how == "deleted":
                        os.remove(file)
                    else:
                        os.truncate(file, os.path.getsize(file) // 2)

                self._on_rank0(damage)
                msg = f"{writer_cls.__name__} {how}"
                [caught, _] = self._assert_refused(path, msg=msg)
                self.assertTrue(all(c.file == "__2_0.distcp" for c in caught.corruptions), msg)
                if self.rank == 0:
                    self.assertEqual(_verify_exit(path), 1, msg)
                dist.barrier()
        if self.rank == 0:
            self.assertEqual(_verify_exit(path + "_no_such_dir"), 2)
        dist.barrier()

    @with_comms(init_rpc=False)
    def test_a_chunk_changed_between_its_check_and_its_copy_raises_on_every_rank(self):
        # NOTE [ Whole chunks are checked, then read again into the destination ]: rank 0's chunk
        # changes on disk after every rank checked its chunks and agreed, before the copy re-reads it;
        # only rank 0 sees it, and every rank raises its error.
        full = _values(6)
        path = self._tmp_dir()
        dcp.save({"w": filled(full, chunks(0))}, storage_writer=ChecksumFileSystemWriter(path))
        [info] = [s for i, s in _storage(path).items() if i.offset[0] == 0]
        agree, calls = _load_outcome.exchange, []

        def agree_then_change(outcome, participants):
            calls.append(outcome)
            if len(calls) == 1 and self.rank == 0:
                with open(os.path.join(path, info.relative_path), "r+b") as f:
                    f.seek(info.offset)
                    at = info.offset + read_archive(BytesSource(f.read(info.length), info.offset)).data.data_offset
                    f.seek(at)
                    byte = f.read(1)[0]
                    f.seek(at)
                    f.write(bytes([byte ^ 0x40]))
            return agree(outcome, participants)

        target = sharded_tensor.full(chunks(0), (ROWS, COLS), FILL)
        # Every whole chunk read twice, however small (the reader stages chunks under 32 MiB).
        with mock.patch.object(_load_outcome, "exchange", agree_then_change), mock.patch.object(read_chunk, "_READ_TWICE_FROM", 0):
            with self.assertRaises(CheckpointCorruptionError) as cm:
                load({"w": target}, path)
        self.assertEqual(len(calls), 1)  # one agreement; DCP's read step gathers what the copy found
        self.assertIn("changed on disk during the load", str(cm.exception))
        self.assertIn("partly written", str(cm.exception))
        self.assertEqual([c.rank for c in cm.exception.corruptions], [0])
        messages = [None] * dist.get_world_size()
        dist.all_gather_object(messages, str(cm.exception))
        self.assertEqual(len(set(messages)), 1)
        # The other ranks' chunks were read, checked twice and written: they hold the saved values.
        if self.rank != 0:
            self._assert_holds(target, full, "an unchanged chunk")
        # Loaded again, the changed chunk fails its first check: nothing is written anywhere.
        self._assert_refused(path, msg="changed chunk, loaded again")

    @with_comms(init_rpc=False)
    def test_other_load_failures_are_exceptions_on_every_rank(self):
        path = self._tmp_dir()
        dcp.save({"w": filled(_values(8), chunks(0))}, storage_writer=ChecksumFileSystemWriter(path))
        target = sharded_tensor.full(chunks(1), (ROWS, COLS), FILL)
        with self.assertRaises(CheckpointLoadError) as cm:
            load({"w": target, "missing": torch.zeros(3)}, path)
        self.assertNotIsInstance(cm.exception, CheckpointCorruptionError)
        self.assertIsInstance(cm.exception, Exception)
        self.assertIsInstance(cm.exception.__cause__, CheckpointException)
        self.assertIn("missing", str(cm.exception))
        self._assert_untouched(target, "missing key")


def test_checksums_file_catches_every_changed_character():
    tensor = torch.arange(300 * 70, dtype=torch.float32).view(300, 70)
    grid, tiles = _checksums.tensor_tile_digests(tensor)
    items = {
        "__0_0.distcp:0": _checksums.ItemChecksums("w", 0x1234ABCD5678EF90, grid, tuple(tiles)),
        "__0_0.distcp:99": _checksums.ItemChecksums("note", 0x0BADF00D),
    }
    data = _checksums.dump("save-1", "d" * 64, [_checksums.encode_items(items)])
    parsed = _checksums.parse(data)
    assert parsed.items == items and parsed.save_id == "save-1" and parsed.metadata_digest == "d" * 64
    text = data.decode()
    for at, char in enumerate(text):
        if not char.isalnum():
            continue
        other = "0" if char != "0" else "1"
        changed = (text[:at] + other + text[at + 1 :]).encode()
        try:
            _checksums.parse(changed)
        except ValueError:
            continue
        raise AssertionError(f"changing character {at} ({char!r} -> {other!r}) went unnoticed")


def _save_alone(path, state_dict, writer=ChecksumFileSystemWriter):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state_dict, storage_writer=writer(str(path)), no_dist=True)


def test_checksums_hold_the_sha256_of_the_metadata_file_and_catch_any_change_to_it(tmp_path):
    import hashlib

    _save_alone(tmp_path, {"w": torch.ones(8, 4), "note": {"a": 1}})
    with open(tmp_path / ".metadata", "rb") as f:
        raw = f.read()
    with open(tmp_path / ".checksums", "rb") as f:
        sums = _checksums.parse(f.read())
    assert sums.version == _checksums.VERSION == 4
    assert sums.metadata_digest == hashlib.sha256(raw).hexdigest()
    assert verify_checkpoint(str(tmp_path), progress=False).ok
    # The same content pickled again (as another torch would): different bytes, so refused, and
    # .metadata is blamed, not the data.
    md = pickle.loads(raw)
    with open(tmp_path / ".metadata", "wb") as f:
        pickle.dump(md, f, protocol=2)
    report = verify_checkpoint(str(tmp_path), progress=False)
    assert not report.ok and [c.file for c in report.corruptions] == [".metadata"], report.corruptions
    assert "digest differs" in report.corruptions[0].what


def test_a_dcp_that_writes_metadata_without_a_rename_still_gets_checksums(tmp_path):
    # The writer hashes .metadata as DCP renames it into place; a DCP that renamed nothing would leave
    # the hook unused: .checksums then follows .metadata, with the same digest.
    def plain_rename(self, path, new_path):
        self._fs.rename(path, new_path)

    with mock.patch.object(_metadata._HashingRenames, "rename", plain_rename):
        _save_alone(tmp_path, {"w": torch.ones(8, 4)})
    with open(tmp_path / ".checksums", "rb") as f:
        sums = _checksums.parse(f.read())
    import hashlib

    assert sums.metadata_digest == hashlib.sha256((tmp_path / ".metadata").read_bytes()).hexdigest()
    assert verify_checkpoint(str(tmp_path), progress=False).ok


def test_checksums_of_an_unreleased_version_are_refused_with_how_to_load_without_them(tmp_path):
    # Versions 1 to 3 (CRC-32s) were never released: a .checksums of version 3, whole and self-consistent,
    # is refused by name, and the message says how to load the data against their zip CRC-32s alone.
    import zlib

    full = torch.arange(64 * 6, dtype=torch.float32).view(64, 6)
    _save_alone(tmp_path, {"w": full})
    with open(tmp_path / ".checksums", "rb") as f:
        body = json.loads(f.read())
    del body["check"]
    body.update(version=3, algorithm="crc32")
    head = json.dumps(body, separators=(",", ":")).encode()[:-1]
    with open(tmp_path / ".checksums", "wb") as f:
        f.write(head + b',"check":"%08x"}' % zlib.crc32(head))
    with open(tmp_path / ".checksums", "rb") as f, pytest.raises(ValueError, match="has version 3 / algorithm 'crc32'; "
                                                                 "this torch_shard reads version 4 of xxh3_64"):
        _checksums.parse(f.read())
    report = verify_checkpoint(str(tmp_path), progress=False)
    assert not report.ok and [c.file for c in report.corruptions] == [".checksums"], report.corruptions
    assert "has version 3" in report.corruptions[0].what and "checksums=False" in report.corruptions[0].what
    assert verify_checkpoint(str(tmp_path), progress=False, checksums=False).ok
    target = {"w": torch.zeros(64, 6)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(target, storage_reader=ByteRangeFileSystemReader(str(tmp_path), checksums=False), no_dist=True)
    assert torch.equal(target["w"], full)


def test_checksums_entries_are_decoded_when_read_and_a_malformed_one_is_named():
    items = {"__0_0.distcp:0": _checksums.ItemChecksums("w", 0x1234ABCD)}
    data = _checksums.dump("save-1", "d" * 64, [_checksums.encode_items(items)])
    parsed = _checksums.parse(data)
    assert "__0_0.distcp:0" in parsed.items and len(parsed.items) == 1 and not parsed.items._decoded
    assert parsed.items["__0_0.distcp:0"] == items["__0_0.distcp:0"]
    # An entry that passes the file's check but is malformed (its writer wrote it so): named on use.
    head = data[: -len(b',"check":"0000000000000000"}')].replace(b'"digest":"000000001234abcd"', b'"digest":"zz"')
    parsed = _checksums.parse(head + b',"check":"%016x"}' % xxhash.xxh3_64_intdigest(head))
    with pytest.raises(ValueError, match="malformed entry for '__0_0.distcp:0'"):
        parsed.items["__0_0.distcp:0"]


if __name__ == "__main__":
    run_tests()


def test_tensors_record_the_xxh3_of_their_storage(tmp_path):
    # Every item's digest is the XXH3-64 of the bytes torch.save stores as its data record, hashed from
    # memory (in one pass with the tile digests for a big row-major tensor, on the writer's thread),
    # whether or not torch.save computes its own CRC-32s.
    big = torch.arange(512 * 1024, dtype=torch.float32).view(512, 1024)  # 2 MiB
    small = torch.arange(100, dtype=torch.float32)
    expected = {"big": xxhash.xxh3_64_intdigest(big.numpy().tobytes()),
                "small": xxhash.xxh3_64_intdigest(small.numpy().tobytes())}
    for crcs_on in (True, False):
        path = str(tmp_path / f"crc_{crcs_on}")
        before = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(crcs_on)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dcp.save({"big": big, "small": small}, storage_writer=ChecksumFileSystemWriter(path), no_dist=True)
        finally:
            torch.serialization.set_crc32_options(before)
        with open(os.path.join(path, ".checksums"), "rb") as f:
            sums = _checksums.parse(f.read())
        assert {item.fqn: item.digest for item in sums.items.values()} == expected, crcs_on
        # Tile digests only for a chunk a reader may read in parts (a small one is read whole).
        assert {item.fqn: item.grid is not None for item in sums.items.values()} == {"big": True, "small": False}
        assert verify_checkpoint(path, progress=False).ok
        # A flipped data byte of the big tensor is caught, by its digest from this save.
        [(_, info)] = [(i, s) for i, s in _storage(path).items() if i.fqn == "big"]
        with open(os.path.join(path, info.relative_path), "r+b") as f:
            f.seek(info.offset)
            archive = read_archive(BytesSource(f.read(info.length), info.offset))
            at = info.offset + archive.data.data_offset + 12345
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ 0x10]))
        report = verify_checkpoint(path, progress=False)
        assert [c.fqn for c in report.corruptions] == ["big"], report.corruptions
