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
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from . import _checksums, _metadata
from ._archive import crc32
from ._checksums import ItemChecksums
from ._staging import stage_state_dict

__all__ = ["ChecksumFileSystemWriter"]


@dataclass(frozen=True)
class _WithChecksums:
    """A write result's storage data with the item's checksums, on their way to the coordinator."""

    info: Any
    checksums: ItemChecksums | None


def _as_saved(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor ``FileSystemWriter`` hands to ``torch.save``: on the CPU, with a storage of exactly
    its own bytes (its loaders clone a view of a larger storage, keeping the memory format)."""
    tensor = tensor.detach()
    if not tensor.is_cpu:
        tensor = tensor.cpu()
    if tensor.untyped_storage().nbytes() != tensor.nbytes:
        tensor = tensor.clone()
    return tensor


class _RecordingPlanner:
    """The save planner, seen by ``write_data``: it also hashes each item's data as it hands it over.

    The CRCs are of what ``torch.save`` is given: the tensor in memory, brought here to the form the
    writer saves (on the CPU, its own storage), which the writer then leaves as it is."""

    def __init__(self, planner: SavePlanner, recorded: dict):
        self._planner, self._recorded = planner, recorded

    def resolve_data(self, item):
        data = self._planner.resolve_data(item)
        fqn = item.index.fqn
        if isinstance(data, io.BytesIO):
            self._recorded[item.index] = ItemChecksums(fqn, crc32(data.getbuffer()))
        elif isinstance(data, torch.Tensor):
            data = _as_saved(data)
            crc = crc32(_checksums.saved_storage_bytes(data))
            grid, tiles = None, ()
            if data.is_contiguous() and data.storage_offset() == 0:
                # Tile CRCs are of the row-major bytes; a reader uses them only for a record in that order.
                grid, tiles = _checksums.tensor_tile_crcs(data)
            self._recorded[item.index] = ItemChecksums(fqn, crc, grid, tuple(tiles))
        return data

    def __getattr__(self, name):
        return getattr(self._planner, name)


class ChecksumFileSystemWriter(FileSystemWriter):
    """A ``FileSystemWriter`` that also records, in ``.checksums``, what a load needs to check every
    byte it reads against this save: every item's data CRC-32, block CRC-32s of every tensor chunk
    (so :class:`ByteRangeFileSystemReader` checks byte ranges without reading whole chunks) and a
    digest of the metadata.

    Use it wherever ``FileSystemWriter`` is used, including ``dcp.async_save`` with ShardedTensors::

        dcp.save(state_dict, storage_writer=ChecksumFileSystemWriter(path))
        future = dcp.async_save(state_dict, storage_writer=ChecksumFileSystemWriter(path))

    Takes ``FileSystemWriter``'s arguments.
    """

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        recorded: dict = {}
        results = super().write_data(plan, _RecordingPlanner(planner, recorded)).wait()
        wrapped = [
            dataclasses.replace(r, storage_data=_WithChecksums(r.storage_data, recorded.get(r.index)))
            for r in results
        ]
        done: Future[list[WriteResult]] = Future()
        done.set_result(wrapped)
        return done

    def finish(self, metadata, results: list[list[WriteResult]]) -> None:
        items: dict[str, ItemChecksums] = {}
        plain = []
        for rank_results in results:
            unwrapped = []
            for result in rank_results:
                data = result.storage_data
                if isinstance(data, _WithChecksums):
                    if data.checksums is not None:
                        items[_checksums.location_key(data.info.relative_path, data.info.offset)] = data.checksums
                    result = dataclasses.replace(result, storage_data=data.info)
                unwrapped.append(result)
            plain.append(unwrapped)
        # The metadata FileSystemWriter.finish is about to write: its storage_data is every result's.
        storage_data = {r.index: r.storage_data for rank_results in plain for r in rank_results}
        digest = _metadata.digest_of(metadata.state_dict_metadata, storage_data, metadata.planner_data, self.save_id)
        # Written (and renamed into place) before .metadata: a checkpoint with .metadata is complete.
        rank = self.rank if not self.use_collectives and self.rank is not None else None
        name = _checksums.checksums_file_name(rank)
        tmp = self.fs.concat_path(self.path, name + ".tmp")
        with self.fs.create_stream(tmp, "wb") as stream:
            stream.write(_checksums.dump(self.save_id, digest, items))
        final = self.fs.concat_path(self.path, name)
        if self.fs.exists(final):
            self.fs.rm_file(final)
        self.fs.rename(tmp, final)
        super().finish(metadata, plain)

    def stage(self, state_dict):
        """CPU copies of the state dict's tensors for ``dcp.async_save``, ShardedTensors included."""
        self.per_thread_copy_ahead = 0  # as FileSystemWriter: the staged copies are on the CPU already
        return stage_state_dict(state_dict)
