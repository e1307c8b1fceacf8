"""Checking a whole checkpoint offline: everything a load checks, for every saved item.

``.metadata`` and ``.checksums`` as a load checks them (NOTE [ Checking a checkpoint's metadata ]);
then every saved item as a load that reads it whole does (``_saved_item.open_chunk`` / ``check_whole`` /
``read_bytes_item``, the functions the reader uses), bytes items unpickled as DCP's planner does. What
cannot be checked is counted and reported (items of checkpoints without ``.checksums`` whose records
were saved with CRCs off, bytes items of such checkpoints).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from dataclasses import dataclass, field

import torch
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

from . import _checksums, _metadata
from ._archive import BytesSource, FileSource
from ._errors import Corruption
from ._saved_item import Expected, ItemPlace, check_whole, open_chunk, piece_scratch, read_bytes_item

__all__ = ["VerifyReport", "verify_checkpoint"]

# Below this many bytes a checkpoint is checked without a progress bar (it takes well under a second).
_PROGRESS_MIN_BYTES = 256 * 2**20


@dataclass
class VerifyReport:
    """What :func:`verify_checkpoint` found.

    Attributes:
        corruptions: every failed check (of ``.metadata``, ``.checksums`` and the saved items).
        items: saved items (chunks and bytes items) looked at.
        unchecked: items (or records) with no checksum to compare against, by name.
        has_block_checksums: whether the checkpoint has a usable ``.checksums`` of its own save.
    """

    corruptions: list[Corruption] = field(default_factory=list)
    items: int = 0
    unchecked: list[str] = field(default_factory=list)
    has_block_checksums: bool = False

    @property
    def ok(self) -> bool:
        return not self.corruptions

    @property
    def corrupted_items(self) -> list[str]:
        """What is corrupted, each once, in checkpoint order: items by fully qualified name, the
        checkpoint's own files by file name."""
        return list(dict.fromkeys(c.fqn if c.fqn is not None else c.file for c in self.corruptions))


def verify_checkpoint(path, *, progress: bool | None = None, checksums: bool = True,
                      _extension_registry=None) -> VerifyReport:
    """Check the DCP checkpoint at ``path`` as a load would, every saved item read whole.

    Args:
        path: the checkpoint directory (written by ``FileSystemWriter`` or ``ChecksumFileSystemWriter``).
        progress: show a tqdm progress bar over the bytes checked; None: only for big checkpoints
            when stderr is a terminal.
        checksums: use the checkpoint's ``.checksums`` (default); False checks only the zip CRC-32s
            (what ``ByteRangeFileSystemReader(path, checksums=False)`` checks).
        _extension_registry: as for ``FileSystemReader`` (to decode stream-transformed chunks).

    Returns:
        A :class:`VerifyReport`.

    Raises:
        FileNotFoundError: ``path`` is not a directory holding a ``.metadata`` (not a checkpoint).
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no such directory: {path}")
    reader = FileSystemReader(path, _extension_registry)
    checked = _metadata.read_checked(reader, reader.read_metadata, use_checksums=checksums)
    metadata = checked.metadata
    report = VerifyReport(corruptions=list(checked.problems), has_block_checksums=checked.checksums is not None)
    if metadata is None or any(c.file == _metadata.METADATA_FILE for c in checked.problems):
        return report  # where the items are is not known
    sums = checked.checksums.items if checked.checksums is not None and not checked.problems else {}
    storage = metadata.storage_data
    # One entry per stored item; sorted by file and offset so the files are read front to back.
    entries = sorted(storage.items(), key=lambda kv: (kv[1].relative_path, kv[1].offset))
    total = sum(info.length for _, info in entries)
    bar = _progress_bar(total, progress)
    fs = FileSystem()
    handles: dict[str, object] = {}
    with contextlib.ExitStack() as files:
        try:
            for index, info in entries:
                place = ItemPlace(index.fqn, tuple(index.offset) if index.offset is not None else None,
                                  info.relative_path)
                report.items += 1
                if info.relative_path not in handles:
                    try:
                        stream = fs.create_stream(fs.concat_path(reader.path, info.relative_path), "rb")
                        handles[info.relative_path] = files.enter_context(stream)
                    except OSError as e:  # a missing or unreadable data file
                        handles[info.relative_path] = e
                handle = handles[info.relative_path]
                if isinstance(handle, OSError):
                    report.corruptions.append(
                        place.corruption(None, None, None, None, f"cannot be read ({type(handle).__name__}: {handle})")
                    )
                else:
                    md = metadata.state_dict_metadata.get(index.fqn)
                    recorded = sums.get(_checksums.location_key(info.relative_path, info.offset))
                    if isinstance(md, TensorStorageMetadata):
                        chunk = next(c for c in md.chunks if tuple(c.offsets) == tuple(index.offset))
                        expected = Expected(place, tuple(chunk.sizes), md.properties.dtype, recorded)
                    else:
                        expected = Expected(place, sums=recorded)
                    try:
                        _verify_item(reader, index, md, expected, info, handle, report)
                    except OSError as e:  # a truncated file
                        report.corruptions.append(
                            place.corruption(None, None, None, None, f"cannot be read ({type(e).__name__}: {e})")
                        )
                bar.update(info.length)
        finally:
            bar.close()
    return report


def _verify_item(reader, index, md, expected: Expected, info, stream, report: VerifyReport) -> None:
    raw = getattr(stream, "raw", stream)
    place = expected.place
    if info.transform_descriptors:
        item = ReadItem(LoadItemType.BYTE_IO, index, [], index, [], [])
        view = reader._slice_file(stream, info)
        decoded = reader.transforms.transform_load_stream(item, info.transform_descriptors, view).read(-1)
        source = BytesSource(decoded, info.offset)
    else:
        source = FileSource(raw, info.offset, info.length, windows=True)  # read whole
    if isinstance(md, BytesStorageMetadata):
        data, bad = read_bytes_item(source, expected)
        report.corruptions.extend(bad)
        if expected.sums is None:
            report.unchecked.append(f"{place.fqn} (bytes item, no checksum recorded)")
        if not bad:
            try:  # as a load does (DCP's planner unpickles it)
                torch.load(io.BytesIO(data), weights_only=False)
            except Exception as e:  # noqa: BLE001 - reported as a failed check
                report.corruptions.append(
                    place.corruption(source, 0, None, None, f"cannot be unpickled ({type(e).__name__}: {e})")
                )
        return
    archive, bad = open_chunk(source, expected)
    report.corruptions.extend(bad)
    if archive is None:
        return
    if expected.sums is None:
        report.unchecked.extend(
            f"{place.fqn} (record '{r.name}' saved without CRC-32)" for r in archive.records if not r.has_crc
        )
    _, bad = check_whole(source, archive, expected, piece_scratch())
    report.corruptions.extend(bad)


class _PlainProgress:
    """A progress line on stderr when tqdm is not installed."""

    def __init__(self, total: int):
        self.total, self.done, self.shown = total, 0, -1

    def update(self, n: int) -> None:
        self.done += n
        percent = 100 * self.done // max(1, self.total)
        if percent != self.shown:
            self.shown = percent
            print(f"\rverifying: {percent}% of {self.total / 2**20:.0f} MiB", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        print(file=sys.stderr)


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, progress: bool | None):
    if progress is None:
        progress = total >= _PROGRESS_MIN_BYTES and sys.stderr.isatty() and not os.environ.get("CI")
    if not progress:
        return _NoProgress()
    try:
        from tqdm import tqdm  # imported lazily: only the verifier shows a bar
    except ImportError:
        return _PlainProgress(total)
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="verifying")
