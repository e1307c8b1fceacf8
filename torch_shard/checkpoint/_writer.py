""":class:`ChecksumFileSystemWriter`: DCP's ``FileSystemWriter`` plus what lets a load check every byte
it reads against THIS save (NOTE [ What .checksums binds to one save ], NOTE [ Block checksums for
byte-range reads ]).

The checkpoint it writes is DCP's: the same ``.distcp`` files and ``.metadata``, readable by any DCP
reader; the checksums go into one more file, ``.checksums``. As a stager for ``dcp.async_save`` it
also copies ShardedTensors (see ``_staging.py``).
"""

from __future__ import annotations

import dataclasses
import io
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from . import _checksums, _metadata
from ._archive import FileSource, crc32, read_archive
from ._checksums import ItemChecksums
from ._staging import stage_state_dict

__all__ = ["ChecksumFileSystemWriter"]


@dataclass(frozen=True)
class _WithChecksums:
    """A rank's first write result's storage data with the checksums of all the rank's items, encoded
    (:func:`_checksums.encode_items`): they ride to the coordinator with DCP's own gather of the
    write results, in one string (a per-result object would cost a pickle per item)."""

    info: Any
    encoded_items: str


def _as_saved(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor ``FileSystemWriter`` hands to ``torch.save``: on the CPU, with a storage of exactly
    its own bytes (its loaders clone a view of a larger storage, keeping the memory format)."""
    tensor = tensor.detach()
    if not tensor.is_cpu:
        tensor = tensor.cpu()
    if tensor.untyped_storage().nbytes() != tensor.nbytes:
        tensor = tensor.clone()
    return tensor


# A tensor with at least this many bytes takes its data CRC from the zip record torch.save wrote (read
# back after the write: the archive's directory, a few hundred bytes) instead of being hashed twice;
# a smaller one is hashed here (cheaper than reading a directory back). A bigger one's tile CRCs are
# computed on a thread while torch.save writes it (_RecordingPlanner).
_READ_BACK_BYTES = 1 << 20


def _torch_save_records_crcs() -> bool:
    options = getattr(torch.serialization, "get_crc32_options", None)
    return bool(options()) if options is not None else False


def _tensor_checksums(fqn: str, data: torch.Tensor, stored: torch.Tensor | None) -> ItemChecksums:
    """A tensor chunk's checksums: its data CRC (None when it is read back from the archive:
    ``stored`` None) and, for a row-major chunk, its tile CRCs."""
    crc = crc32(stored) if stored is not None else None
    grid, tiles = None, ()
    if data.is_contiguous() and data.storage_offset() == 0 and _checksums.tiles_worth_recording(data.nbytes):
        # Tile CRCs are of the row-major bytes; a reader uses them only for a record in that order.
        grid, tiles = _checksums.tensor_tile_crcs(data)
    return ItemChecksums(fqn, crc, grid, tuple(tiles))


class _RecordingPlanner:
    """The save planner, seen by ``write_data``: it also records each item's checksums as it hands
    the item over.

    The CRCs are of what ``torch.save`` is given: the tensor in memory, brought here to the form the
    writer saves (on the CPU, its own storage), which the writer then leaves as it is. A big tensor's
    data CRC is the one ``torch.save`` computes from the same memory as it writes the data record
    (``pending``: read back from the archive's directory once written), and its tile CRCs are computed
    on ``hasher``'s thread while ``torch.save`` writes it (``jobs``): both only read the tensor, and the
    hashing and the copies it makes let go of the GIL, so a save bound by the disk hides the hashing."""

    def __init__(self, planner: SavePlanner, recorded: dict, read_back: bool):
        self._planner, self._recorded, self._read_back = planner, recorded, read_back
        self.hasher: ThreadPoolExecutor | None = None  # started by the first big tensor
        self.pending: dict = {}  # index -> the data record's size, for big tensors
        self.jobs: dict = {}  # index -> the future ItemChecksums of a big tensor

    def resolve_data(self, item):
        data = self._planner.resolve_data(item)
        fqn = item.index.fqn
        if isinstance(data, io.BytesIO):
            self._recorded[item.index] = ItemChecksums(fqn, crc32(data.getbuffer()))
        elif isinstance(data, torch.Tensor):
            data = _as_saved(data)
            stored = _checksums.saved_storage_bytes(data)
            if stored.numel() < _READ_BACK_BYTES:
                self._recorded[item.index] = _tensor_checksums(fqn, data, stored)
            else:
                if self._read_back:
                    self.pending[item.index] = stored.numel()
                    stored = None
                if self.hasher is None:
                    self.hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch_shard_checksums")
                self.jobs[item.index] = self.hasher.submit(_tensor_checksums, fqn, data, stored)
        return data

    def __getattr__(self, name):
        return getattr(self._planner, name)


def _data_record_crc(source: FileSource, size: int) -> int:
    """The CRC-32 of the one data record of ``size`` bytes in the archive at ``source``: from the zip
    directory when torch.save recorded it, else hashed from the file."""
    archive = read_archive(source, with_tensor=False)
    records = [r for r in archive.records if _DATA_RECORD.fullmatch(r.name) and r.size == size]
    if len(records) == 1 and records[0].has_crc:
        return records[0].crc
    # Not the archive torch.save writes today: hash the stored bytes of its one record of that size.
    record = next((r for r in archive.records if r.size == size), None)
    if record is None:
        raise RuntimeError(f"torch_shard.checkpoint: no {size}-byte data record in the archive just written")
    crc = 0
    for at in range(0, size, 1 << 20):
        crc = crc32(source.read(record.data_offset + at, min(1 << 20, size - at)), crc)
    return crc


_DATA_RECORD = re.compile(r"(.*/)?data/\d+")


class ChecksumFileSystemWriter(FileSystemWriter):
    """A ``FileSystemWriter`` that also records, in ``.checksums``, what a load needs to check every
    byte it reads against this save: every item's data CRC-32, block CRC-32s of every tensor chunk a
    reader may read in parts (so :class:`ByteRangeFileSystemReader` checks byte ranges without reading
    whole chunks) and the SHA-256 of the ``.metadata`` file.

    Use it wherever ``FileSystemWriter`` is used, including ``dcp.async_save`` with ShardedTensors::

        dcp.save(state_dict, storage_writer=ChecksumFileSystemWriter(path))
        future = dcp.async_save(state_dict, storage_writer=ChecksumFileSystemWriter(path))

    Takes ``FileSystemWriter``'s arguments.
    """

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        recorded: dict = {}
        # Stream-transformed items (compression, ...) store no zip archive to read a CRC back from.
        read_back = _torch_save_records_crcs() and not getattr(self.transforms, "extensions", ())
        recording = _RecordingPlanner(planner, recorded, read_back)
        try:
            results = super().write_data(plan, recording).wait()
            recorded.update((index, job.result()) for index, job in recording.jobs.items())
        finally:
            if recording.hasher is not None:
                recording.hasher.shutdown(wait=True)
        self._read_back_crcs(results, recording.pending, recorded)
        if results:
            encoded = _checksums.encode_items({
                _checksums.location_key(r.storage_data.relative_path, r.storage_data.offset): recorded[r.index]
                for r in results
                if r.index in recorded
            })
            results = list(results)
            results[0] = dataclasses.replace(results[0], storage_data=_WithChecksums(results[0].storage_data, encoded))
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def _read_back_crcs(self, results: list[WriteResult], pending: dict, recorded: dict) -> None:
        """Fill in the data CRCs of big tensors from the archives just written."""
        per_file: dict[str, list[WriteResult]] = {}
        for result in results:
            if result.index in pending:
                per_file.setdefault(result.storage_data.relative_path, []).append(result)
        for relative_path, written in per_file.items():
            with self.fs.create_stream(self.fs.concat_path(self.path, relative_path), "rb") as stream:
                raw = getattr(stream, "raw", stream)
                for result in written:
                    info = result.storage_data
                    crc = _data_record_crc(FileSource(raw, info.offset, info.length), pending[result.index])
                    recorded[result.index] = dataclasses.replace(recorded[result.index], crc=crc)

    def finish(self, metadata, results: list[list[WriteResult]]) -> None:
        item_parts: list[str] = []
        plain = []
        for rank_results in results:
            unwrapped = list(rank_results)
            for at, result in enumerate(unwrapped):
                data = result.storage_data
                if isinstance(data, _WithChecksums):
                    item_parts.append(data.encoded_items)
                    unwrapped[at] = dataclasses.replace(result, storage_data=data.info)
            plain.append(unwrapped)
        # .checksums goes into place before .metadata, so a checkpoint with .metadata is complete: it
        # is written when DCP's finish renames the .metadata it wrote into place, with the SHA-256 of
        # that file's bytes (NOTE [ Checking a checkpoint's metadata ]).
        rank = self.rank if not self.use_collectives and self.rank is not None else None

        def write_checksums(metadata_sha256: str) -> None:
            name = _checksums.checksums_file_name(rank)
            tmp = self.fs.concat_path(self.path, name + ".tmp")
            with self.fs.create_stream(tmp, "wb") as stream:
                stream.write(_checksums.dump(self.save_id, metadata_sha256, item_parts))
            final = self.fs.concat_path(self.path, name)
            if self.fs.exists(final):
                self.fs.rm_file(final)
            self.fs.rename(tmp, final)

        metadata_name = _metadata.metadata_file_name(rank)
        with _metadata.hashing_renames(self, metadata_name, write_checksums) as hashing:
            super().finish(metadata, plain)
        if not hashing.seen:
            # A DCP that writes .metadata in place: .checksums follows it (a crash between the two
            # leaves a checkpoint whose loads check zip CRCs alone).
            write_checksums(_metadata.file_sha256(self.fs, self.fs.concat_path(self.path, metadata_name)))

    def stage(self, state_dict):
        """CPU copies of the state dict's tensors for ``dcp.async_save``, ShardedTensors included."""
        self.per_thread_copy_ahead = 0  # as FileSystemWriter: the staged copies are on the CPU already
        return stage_state_dict(state_dict)
