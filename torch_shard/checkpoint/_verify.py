"""Checking a whole checkpoint offline: every saved item, every checksum it has.

For each chunk: the ``torch.save`` archive's records against their zip CRC-32s (data included, read
whole), and, when ``.checksums`` has them, the writer's tile CRCs (so a damaged ``.checksums`` shows
up here rather than as a failed load) and bytes items' CRC-32s. What cannot be checked is counted
and reported (bytes items of checkpoints without ``.checksums``; records saved with CRCs off).
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field

from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from . import _checksums
from ._archive import BytesSource, FileSource, crc32, read_archive
from ._chunk import ItemPlace, check_small_records, check_tiles_of_whole, read_record, tiles_usable
from ._errors import Corruption

__all__ = ["VerifyReport", "verify_checkpoint"]

# Below this many bytes a checkpoint is checked without a progress bar (it takes well under a second).
_PROGRESS_MIN_BYTES = 256 * 2**20


@dataclass
class VerifyReport:
    """What :func:`verify_checkpoint` found.

    Attributes:
        corruptions: every failed check.
        items: saved items (chunks and bytes items) looked at.
        unchecked: items (or records) with no checksum to compare against, by name.
        has_block_checksums: whether the checkpoint has a ``.checksums`` of its own save.
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
        """The fully qualified names of the corrupted items, each once, in checkpoint order."""
        return list(dict.fromkeys(c.fqn for c in self.corruptions))


def verify_checkpoint(path, *, progress: bool | None = None, _extension_registry=None) -> VerifyReport:
    """Check every byte of the DCP checkpoint at ``path`` that has a checksum.

    Args:
        path: the checkpoint directory (written by ``FileSystemWriter`` or ``ChecksumFileSystemWriter``).
        progress: show a tqdm progress bar over the bytes checked; None: only for big checkpoints
            when stderr is a terminal.
        _extension_registry: as for ``FileSystemReader`` (to decode stream-transformed chunks).

    Returns:
        A :class:`VerifyReport`.
    """
    reader = FileSystemReader(path, _extension_registry)
    metadata = reader.read_metadata()
    sums = _checksums.read_for(reader.fs, reader.path, metadata) or {}
    report = VerifyReport(has_block_checksums=bool(sums))
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
                if info.relative_path not in handles:
                    path = fs.concat_path(reader.path, info.relative_path)
                    handles[info.relative_path] = files.enter_context(fs.create_stream(path, "rb"))
                _verify_item(reader, metadata, sums, index, info, handles[info.relative_path], report)
                report.items += 1
                bar.update(info.length)
        finally:
            bar.close()
    return report


def _verify_item(reader, metadata, sums, index, info, stream, report: VerifyReport) -> None:
    place = ItemPlace(index.fqn, tuple(index.offset) if index.offset is not None else None, info.relative_path)
    recorded = sums.get(_checksums.location_key(info.relative_path, info.offset))
    raw = getattr(stream, "raw", stream)
    if info.transform_descriptors:
        from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

        item = ReadItem(LoadItemType.BYTE_IO, index, [], index, [], [])
        view = reader._slice_file(stream, info)
        decoded = reader.transforms.transform_load_stream(item, info.transform_descriptors, view).read(-1)
        source = BytesSource(decoded, info.offset)
    else:
        source = FileSource(raw, info.offset, info.length)
    if isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
        if recorded is None or recorded.grid is not None:
            report.unchecked.append(f"{index.fqn} (bytes item, no CRC recorded)")
            return
        found = crc32(source.read(0, source.length))
        if found != recorded.crcs[0]:
            report.corruptions.append(place.corruption(source, 0, recorded.crcs[0], found, "bytes item"))
        return
    try:
        archive = read_archive(source)
    except Exception as e:  # noqa: BLE001 - reported as a corrupted item
        report.corruptions.append(place.corruption(source, 0, None, None, f"unreadable torch.save archive ({e})"))
        return
    report.corruptions.extend(check_small_records(source, archive, place))
    for record in archive.records:
        if not record.has_crc:
            report.unchecked.append(f"{index.fqn} (record '{record.name}' saved without CRC-32)")
    if archive.data is None:
        report.corruptions.append(place.corruption(source, 0, None, None, "archive holds no tensor data record"))
        return
    buffer, bad = read_record(source, archive.data, place)
    report.corruptions.extend(bad)
    if tiles_usable(archive, recorded):
        report.corruptions.extend(check_tiles_of_whole(buffer, archive, recorded, source, place))
    elif recorded is not None:
        report.corruptions.append(
            place.corruption(source, 0, None, None, "the .checksums entry does not match the saved chunk's layout")
        )


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
