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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from . import _checksums, _digest, _metadata
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


# A tensor with at least this many bytes is hashed on a thread while torch.save writes it
# (_RecordingPlanner); a smaller one is hashed here (cheaper than handing it over).
_ON_THREAD_BYTES = 1 << 20


def _tensor_checksums(fqn: str, data: torch.Tensor) -> ItemChecksums:
    """A tensor chunk's checksums: the digest of its storage (the archive's data record) and, for a
    row-major chunk, its tile digests, in one pass over its bytes where it has tiles."""
    stored = _checksums.saved_storage_bytes(data)
    grid, tiles = None, ()
    if (
        data.is_contiguous()
        and data.storage_offset() == 0
        and stored.numel() == data.nbytes
        and _checksums.tiles_worth_recording(data.nbytes)
    ):
        # Tile digests are of the row-major bytes (a reader uses them only for a record in that
        # order); here those are the storage's bytes, handed to the whole digest band by band.
        whole = _digest.hasher()
        grid, tiles = _checksums.tensor_tile_digests(data, whole)
        value = whole.intdigest()
    else:
        value = _digest.digest(stored)
    return ItemChecksums(fqn, value, grid, tuple(tiles))


class _RecordingPlanner:
    """The save planner, seen by ``write_data``: it also records each item's checksums as it hands
    the item over.

    The digests are of what ``torch.save`` is given: the tensor in memory, brought here to the form
    the writer saves (on the CPU, its own storage), which the writer then leaves as it is. A big
    tensor is hashed on ``hasher``'s thread while ``torch.save`` writes it (``jobs``): both only read
    the tensor, and the hashing (in pieces over 64 KiB) and the copies it makes let go of the GIL, so
    a save bound by the disk hides the hashing."""

    def __init__(self, planner: SavePlanner, recorded: dict):
        self._planner, self._recorded = planner, recorded
        self.hasher: ThreadPoolExecutor | None = None  # started by the first big tensor
        self.jobs: dict = {}  # index -> the future ItemChecksums of a big tensor

    def resolve_data(self, item):
        data = self._planner.resolve_data(item)
        fqn = item.index.fqn
        if isinstance(data, io.BytesIO):
            self._recorded[item.index] = ItemChecksums(fqn, _digest.digest(data.getbuffer()))
        elif isinstance(data, torch.Tensor):
            data = _as_saved(data)
            if data.untyped_storage().nbytes() < _ON_THREAD_BYTES:
                self._recorded[item.index] = _tensor_checksums(fqn, data)
            else:
                if self.hasher is None:
                    self.hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch_shard_checksums")
                self.jobs[item.index] = self.hasher.submit(_tensor_checksums, fqn, data)
        return data

    def __getattr__(self, name):
        return getattr(self._planner, name)


class ChecksumFileSystemWriter(FileSystemWriter):
    """A ``FileSystemWriter`` that also records, in ``.checksums``, what a load needs to check every
    byte it reads against this save: every item's data digest, tile digests of every tensor chunk a
    reader may read in parts (so :class:`ByteRangeFileSystemReader` checks byte ranges without reading
    whole chunks), all XXH3-64, and the SHA-256 of the ``.metadata`` file.

    Use it wherever ``FileSystemWriter`` is used, including ``dcp.async_save`` with ShardedTensors::

        dcp.save(state_dict, storage_writer=ChecksumFileSystemWriter(path))
        future = dcp.async_save(state_dict, storage_writer=ChecksumFileSystemWriter(path))

    Takes ``FileSystemWriter``'s arguments.
    """

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        recorded: dict = {}
        recording = _RecordingPlanner(planner, recorded)
        try:
            results = super().write_data(plan, recording).wait()
            recorded.update((index, job.result()) for index, job in recording.jobs.items())
        finally:
            if recording.hasher is not None:
                recording.hasher.shutdown(wait=True)
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
