"""torch_shard's libraries use the process's one C++ runtime: the shared ``libstdc++.so.6`` torch uses.

NOTE [ One C++ runtime ]
A compiler that links libstdc++ statically (``-static-libstdc++``: the portable GCC of some GPU
images, ``/opt/gcc/bin/g++`` set as ``CXX``) puts a private copy of the C++ runtime into the
extension. Its functions then run on the shared runtime's data (locale facets, iostream state) that
torch's libraries already set up, and the first ``c10::str(..., some_int)`` of an error message
breaks: it can crash the process with SIGSEGV (inside ``std::ostream::_M_insert<long>``, building
the message of the first TORCH_CHECK that fails), or silently drop the number out of the message. So the build links the shared runtime
by name (:data:`LINK_ARGS`, placed before the compiler driver's own ``-lstdc++``, so nothing is
taken from ``libstdc++.a``), setup.py refuses a library that does not list it, and ``import
torch_shard`` refuses one built elsewhere that does not (:func:`check`), before it loads it.

Standard library only: setup.py loads this file by path, before torch_shard is importable.
"""

from __future__ import annotations

import mmap
import struct

RUNTIME = "libstdc++.so.6"
# GNU ld, gold and lld: `-l:NAME` takes the file NAME itself, so a `-L` folder that holds only a
# libstdc++.a cannot stand in for it.
LINK_ARGS = (f"-Wl,-l:{RUNTIME}",)

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB = 0, 1, 5


def needed_libraries(path: str) -> list[str] | None:
    """The DT_NEEDED entries of the ELF64 little-endian shared library at ``path`` (the libraries it
    names for the loader), or None where the file is no such library (another format, a truncated
    file), for which nothing is checked."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        try:
            return _needed(data)
        except (struct.error, ValueError, IndexError):
            return None


def _needed(data) -> list[str] | None:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:  # ELF, 64-bit, little-endian
        return None
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []
    entries = []
    for at in range(dynamic[0], dynamic[0] + dynamic[1] - 15, 16):
        tag, value = struct.unpack_from("<qQ", data, at)
        if tag == _DT_NULL:
            break
        entries.append((tag, value))
    strtab = next((value for tag, value in entries if tag == _DT_STRTAB), None)
    # DT_STRTAB is an address: the file offset is found through the segment that maps it.
    base = next((off + strtab - vaddr for vaddr, off, size in loads if strtab is not None and vaddr <= strtab < vaddr + size), None)
    if base is None:
        return None
    names = []
    for tag, value in entries:
        if tag == _DT_NEEDED:
            start = base + value
            names.append(bytes(data[start : data.find(b"\0", start)]).decode("utf-8", "replace"))
    return names


def problem(path: str) -> str | None:
    """Why the library at ``path`` does not use the shared C++ runtime, or None where it does (or is
    not an ELF64 library, which is not checked)."""
    needed = needed_libraries(path)
    if needed is None or RUNTIME in needed:
        return None
    return (
        f"{path} does not load the shared C++ runtime ({RUNTIME}) that torch uses: the compiler that "
        "linked it put a private copy of libstdc++ into it (-static-libstdc++), and C++ errors from "
        "such a library crash the process or lose their text (NOTE [ One C++ runtime ], "
        "torch_shard/_support/_cxx_runtime.py)"
    )


def check(library: str) -> None:
    """Raise ImportError if the library at ``library`` carries its own C++ runtime. Reads the file;
    does not load it."""
    reason = problem(library)
    if reason is not None:
        raise ImportError(
            f"torch_shard cannot load its C++ library: {reason}. Rebuild it with a compiler that links "
            "libstdc++ dynamically (this tree's setup.py does so with any g++), e.g. "
            "`CXX=g++ pip install --force-reinstall --no-deps <torch_shard source>`."
        )
