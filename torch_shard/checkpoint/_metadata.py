"""What a checked load trusts before it reads any data: the checkpoint's ``.metadata`` and ``.checksums``.

NOTE [ Checking a checkpoint's metadata ]
DCP's ``.metadata`` is a pickle of what every saved item is (a tensor's size, dtype and chunks; a
bytes item) and where it is stored (file, offset, length). Single bit flips of it often still
unpickle, into other metadata: a chunk's offsets or sizes moved (part of a tensor never read, its
old values kept), an index DCP then cannot find, an attribute of the wrong type. Two checks stand
between it and the data:

* its structure (:func:`check_structure`), for every checked load, with or without ``.checksums``:
  every field of the type DCP gives it, every tensor's chunks inside the tensor and tiling it
  exactly (a chunk moved or resized leaves a gap or an overlap), every chunk and bytes item stored
  somewhere, every stored item at a relative path inside the checkpoint;
* its digest, when ``.checksums`` exists: ``ChecksumFileSystemWriter`` records the SHA-256 of the
  ``.metadata`` file's bytes as DCP's ``finish`` wrote them, taken just before DCP renames the file
  into place (:func:`hashing_renames`), and a load compares it with the SHA-256 of the bytes it
  unpickles (:func:`read_checked`): exactly the file the save wrote, at the cost of hashing it
  (a fraction of unpickling it).

:func:`read_checked` does both, and the ``.checksums`` checks of NOTE [ What .checksums binds to one
save ], for the reader and for ``verify``: one list of what is wrong, so both check the same things.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from .._support import _native
from . import _checksums
from ._errors import Corruption

__all__ = ["Checked", "check_structure", "file_sha256", "hashing_renames", "read_checked"]

METADATA_FILE = ".metadata"


class _HashingReads:
    """A DCP ``FileSystem`` whose streams opened for reading are read whole, hashed, and handed on
    from memory: ``sha256`` is the SHA-256 (hex) of the last one's bytes."""

    def __init__(self, fs):
        self._fs, self.sha256 = fs, None

    @contextlib.contextmanager
    def create_stream(self, path, mode: str):
        if mode != "rb":
            with self._fs.create_stream(path, mode) as stream:
                yield stream
            return
        with self._fs.create_stream(path, mode) as stream:
            data = stream.read()
        self.sha256 = hashlib.sha256(data).hexdigest()
        yield io.BytesIO(data)

    def __getattr__(self, name):
        return getattr(self._fs, name)


def file_sha256(fs, path) -> str:
    """The SHA-256 (hex) of the bytes of the file at ``path`` of a DCP ``FileSystem``."""
    with fs.create_stream(path, "rb") as stream:
        return hashlib.sha256(stream.read()).hexdigest()


class _HashingRenames:
    """A DCP ``FileSystem`` that, when a file named ``name`` is renamed into place, first hands the
    SHA-256 (hex) of the file's bytes to ``before``."""

    def __init__(self, fs, name: str, before: Callable[[str], None]):
        self._fs, self._name, self._before, self.seen = fs, name, before, False

    def rename(self, path, new_path) -> None:
        if os.path.basename(str(new_path)) == self._name and not self.seen:
            self._before(file_sha256(self._fs, path))
            self.seen = True
        self._fs.rename(path, new_path)

    def __getattr__(self, name):
        return getattr(self._fs, name)


@contextlib.contextmanager
def hashing_renames(writer, name: str, before: Callable[[str], None]):
    """Within the block, ``writer`` (a ``FileSystemWriter``) calls ``before(sha256)`` with the SHA-256
    of the file it renames to ``name``, just before the rename (DCP's ``finish`` writes ``.metadata``
    under a temporary name, then renames it). Yields the file system; its ``seen`` says whether the
    rename happened."""
    hashing = _HashingRenames(writer.fs, name, before)
    writer.fs = hashing
    try:
        yield hashing
    finally:
        writer.fs = hashing._fs


def _is_int(value) -> bool:
    return type(value) is int  # not bool, nor another int subclass


def _int_tuple(value, ndim: int | None = None) -> bool:
    """A size or offsets: a tuple, list or ``torch.Size`` of ints >= 0 (of ``ndim`` of them)."""
    if not isinstance(value, (torch.Size, tuple, list)) or (ndim is not None and len(value) != ndim):
        return False
    return all(type(v) is int for v in value) and (not value or min(value) >= 0)


def check_structure(metadata: Any, file: str = METADATA_FILE) -> list[Corruption]:
    """What is wrong with the structure of ``metadata`` (empty when nothing is): see NOTE [ Checking a
    checkpoint's metadata ]."""
    try:
        return _structure_problems(metadata, file)
    except Exception as e:  # noqa: BLE001 - metadata odd enough to break a check is damaged too
        return [Corruption(None, None, file, None, None, None, f"is malformed ({type(e).__name__}: {e})")]


def _structure_problems(metadata: Any, file: str) -> list[Corruption]:
    bad: list[Corruption] = []

    def wrong(what: str) -> None:
        bad.append(Corruption(None, None, file, None, None, None, what))

    if not isinstance(metadata, Metadata):
        wrong(f"holds a {type(metadata).__name__}, not DCP's Metadata")
        return bad
    items, storage = getattr(metadata, "state_dict_metadata", None), getattr(metadata, "storage_data", None)
    if not isinstance(items, dict) or not isinstance(storage, dict):
        wrong("has no state_dict_metadata or storage_data dict")
        return bad
    # Every stored item, by (fqn, chunk offsets): MetadataIndex hashes and compares exactly these.
    stored = {(index.fqn, index.offset): info for index, info in storage.items() if isinstance(index, MetadataIndex)}
    several: list[tuple[str, TensorStorageMetadata]] = []
    for fqn, item in items.items():
        if not isinstance(fqn, str):
            wrong(f"has a key {fqn!r} that is not a string")
        elif isinstance(item, BytesStorageMetadata):
            _check_stored(fqn, None, stored, wrong)
        elif isinstance(item, TensorStorageMetadata):
            problem = _tensor_problem(item)
            if problem is not None:
                bad.append(Corruption(fqn, None, file, None, None, None, problem))
                continue
            if len(item.chunks) > 1:
                several.append((fqn, item))
            for chunk in item.chunks:
                _check_stored(fqn, chunk.offsets, stored, wrong)
        else:
            wrong(f"'{fqn}' is a {type(item).__name__}, not tensor or bytes metadata")
    for fqn, item in several:
        problem = _tiling_problem(item)
        if problem is not None:
            bad.append(Corruption(fqn, None, file, None, None, None, problem))
    return bad


def _check_stored(fqn: str, offsets, stored: dict, wrong: Callable[[str], None]) -> None:
    info = stored.get((fqn, offsets if offsets is None else tuple(offsets)))
    if info is None:
        where = f" chunk at {list(offsets)}" if offsets is not None else ""
        wrong(f"'{fqn}'{where} is stored nowhere (no storage_data entry)")
        return
    path, offset, length = (getattr(info, name, None) for name in ("relative_path", "offset", "length"))
    if not isinstance(path, str) or not _is_int(offset) or not _is_int(length) or offset < 0 or length < 0:
        wrong(f"'{fqn}' has a malformed storage entry ({info!r})")
    elif not path or os.path.isabs(path) or ".." in path.replace("\\", "/").split("/"):
        wrong(f"'{fqn}' is stored at {path!r}, outside the checkpoint directory")


def _tensor_problem(item: TensorStorageMetadata) -> str | None:
    """What is wrong with a tensor entry's fields (None when nothing is); a single chunk is checked
    to cover the tensor here, several by :func:`_tiling_problem`."""
    size = item.size
    dtype = getattr(item.properties, "dtype", None)
    if not _int_tuple(size):
        return f"has a malformed size ({size!r})"
    if not isinstance(dtype, torch.dtype):
        return f"has a malformed dtype ({dtype!r})"
    chunks = item.chunks
    if not isinstance(chunks, list) or not chunks:
        return "has no chunks"
    ndim = len(size)
    for chunk in chunks:
        if (
            not isinstance(chunk, ChunkStorageMetadata)
            or not _int_tuple(chunk.offsets, ndim)
            or not _int_tuple(chunk.sizes, ndim)
        ):
            return f"has a malformed chunk ({chunk!r})"
    if len(chunks) == 1 and (any(chunks[0].offsets) or list(chunks[0].sizes) != list(size)):
        return (f"has chunks that do not tile its size {list(size)} exactly (its one chunk is at "
                f"{list(chunks[0].offsets)}, of size {list(chunks[0].sizes)})")
    return None


def _tiling_problem(item: TensorStorageMetadata) -> str | None:
    """Whether a tensor's several chunks tile it exactly: inside it, no two overlapping, no gap."""
    chunks, ndim = item.chunks, len(item.size)
    offsets = torch.tensor([v for c in chunks for v in c.offsets], dtype=torch.int64).view(len(chunks), ndim)
    sizes = torch.tensor([v for c in chunks for v in c.sizes], dtype=torch.int64).view(len(chunks), ndim)
    try:
        _native.validate_boxes(offsets, sizes, list(item.size))
    except (ValueError, RuntimeError) as e:
        return f"has chunks that do not tile its size {list(item.size)} exactly ({e})"
    return None


@dataclass
class Checked:
    """A checkpoint's metadata and ``.checksums``, and what is wrong with them.

    Attributes:
        metadata: the unpickled ``.metadata`` (None when it cannot be read).
        checksums: the parsed ``.checksums`` of this save (None when there is none or it cannot be used).
        problems: every failed check of the two files.
        checksums_file: the ``.checksums`` file's name, relative to the checkpoint.
    """

    metadata: Metadata | None
    checksums: _checksums.ChecksumsFile | None
    problems: list[Corruption] = field(default_factory=list)
    checksums_file: str = _checksums.checksums_file_name()


def metadata_file_name(rank: int | None = None) -> str:
    """``.metadata``, or ``__<rank>.metadata`` for rank-local metadata."""
    return METADATA_FILE if rank is None else f"__{rank}{METADATA_FILE}"


def read_checked(reader, read: Callable[[], Metadata], rank: int | None = None, *,
                 use_checksums: bool = True) -> Checked:
    """Read a checkpoint's metadata with ``read()`` (``reader``'s ``read_metadata``, a
    ``FileSystemReader``'s), hashing the bytes it unpickles, and check it and its ``.checksums``
    (:func:`_open_checked`). A ``.metadata`` that cannot be unpickled is a corruption, not an error.

    Raises:
        FileNotFoundError: when there is no such file (not a checkpoint; DCP's own message).
    """
    hashing = _HashingReads(reader.fs)  # read_metadata's only read is the .metadata file
    reader.fs = hashing
    try:
        metadata, problems = read(), []
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 - any unpickling failure is a damaged file
        what = f"cannot be unpickled ({type(e).__name__}: {e})"
        metadata, problems = None, [Corruption(None, None, metadata_file_name(rank), None, None, None, what)]
    finally:
        reader.fs = hashing._fs
    return _open_checked(reader.fs, reader.path, metadata, rank, use_checksums=use_checksums, problems=problems,
                         metadata_sha256=hashing.sha256)


def _open_checked(fs, path, metadata: Metadata | None, rank: int | None, *, use_checksums: bool,
                  problems: list[Corruption], metadata_sha256: str | None) -> Checked:
    """Check ``metadata`` (read from the checkpoint at ``path``) and its ``.checksums``.

    Args:
        fs, path: the checkpoint, as a ``FileSystemReader`` holds it.
        metadata: its unpickled metadata (None when it could not be read: ``problems`` says why).
        rank: for rank-local metadata (``__<rank>.metadata`` / ``__<rank>.checksums``).
        use_checksums: False leaves ``.checksums`` unread (a load checks zip CRC-32s only).
        problems: failures found while reading the metadata.
        metadata_sha256: the SHA-256 of the ``.metadata`` bytes unpickled (None when none were read).
    """
    metadata_file = metadata_file_name(rank)
    name = _checksums.checksums_file_name(rank)
    checked = Checked(metadata, None, list(problems), name)
    file = fs.concat_path(path, name)
    sums, unusable = None, None
    if use_checksums and fs.exists(file):
        with fs.create_stream(file, "rb") as stream:
            data = stream.read()
        try:
            sums = _checksums.parse(data)
        except ValueError as e:
            unusable = (f"{e}; the data can still be checked against their zip CRC-32s alone: load with "
                        f"ByteRangeFileSystemReader(path, checksums=False), or verify with "
                        f"`python -m torch_shard.checkpoint verify --no-checksums DIR`")
    save_id = getattr(getattr(metadata, "storage_meta", None), "save_id", None)
    # The bytes the save wrote, to the bit (the SHA-256 its .checksums holds): their structure is
    # DCP's own, not checked again.
    written = (
        metadata is not None and sums is not None and sums.save_id == save_id
        and metadata_sha256 is not None and metadata_sha256 == sums.metadata_digest
    )
    if metadata is not None and not written:
        checked.problems.extend(check_structure(metadata, metadata_file))
    if unusable is not None:
        checked.problems.append(Corruption(None, None, name, None, None, None, unusable))
    if sums is None:
        return checked

    def wrong(what: str, file_name: str = name) -> Checked:
        checked.problems.append(Corruption(None, None, file_name, None, None, None, what))
        checked.checksums = None
        return checked

    checked.checksums = sums
    if metadata is None or checked.problems:
        return checked
    if sums.save_id != save_id:
        return wrong(
            f"belongs to another save (id {sums.save_id}) than {metadata_file} (id {save_id}): the directory "
            f"holds parts of two saves (a save that stopped between the two files, or a later save by a "
            f"writer that records no checksums; in that case delete {name})"
        )
    if not written:
        return wrong(f"does not hold what its save wrote: its digest differs from the one in {name}", metadata_file)
    missing = [
        index for index, info in metadata.storage_data.items()
        if _checksums.location_key(info.relative_path, info.offset) not in sums.items
    ]
    if missing:
        names = ", ".join(sorted({i.fqn for i in missing})[:5])
        return wrong(f"has no entry for {len(missing)} stored item(s) ({names}...)")
    return checked
