"""Whether a checkpoint lies on a network or FUSE file system, where read-once is on by default (NOTE [
When read-once is on ], ``_reader.py``)."""

from __future__ import annotations

import os

# File systems a checkpoint on which read-once is the default for (every rank's read of a byte
# would cross the network; page caches are per host).
_NETWORK_FILESYSTEMS = {
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "9p",
    "afs", "ocfs2", "gfs2", "pvfs2", "orangefs", "panfs", "wekafs", "virtiofs",
}


def on_network_filesystem(path: str) -> bool:
    """Whether ``path`` lies on a network or FUSE file system (by /proc/self/mounts; False where it
    cannot be told)."""
    try:
        real = os.path.realpath(os.fspath(path))
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1:3] for line in f if len(line.split()) >= 3]
    except (OSError, TypeError):
        return False
    best, kind = "", ""
    for point, fstype in mounts:
        point = point.replace("\\040", " ")
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fstype
    return kind in _NETWORK_FILESYSTEMS or kind == "fuse" or kind.startswith("fuse.")
