"""FUSE mounts in this machine's mount namespace: listing them, unmounting them, and deleting a
run's directory without ever deleting through a mount."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys


def _unescape_mountinfo(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts_under(path: str) -> list[str]:
    """Mount points at or below ``path`` in this process's mount namespace."""
    path = path.rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            target = _unescape_mountinfo(line.split()[4])
            if target == path or target.startswith(path + "/"):
                found.append(target)
    return found


def _unmount(target: str) -> None:
    """Unmount a FUSE mount: fusermount3 -u, else a lazy unmount (busy, or its daemon gone)."""
    for argv in (["fusermount3", "-u", "-q", target], ["umount", "-l", target], ["fusermount3", "-u", "-z", "-q", target]):
        if target not in mounts_under(target):
            return
        try:
            subprocess.run(argv, capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass


def _remove_run_dir(run_dir: str) -> None:
    """Delete a run's directory, never through a mount: what is still mounted below it is detached
    first, and if anything stays mounted the directory is left (deleting it would delete the
    exported files through the mount)."""
    for target in sorted(mounts_under(run_dir), key=len, reverse=True):
        _unmount(target)
    if mounts_under(run_dir):
        print(f"torchrun_hosts: {run_dir} still has mounts, left in place: {mounts_under(run_dir)}", file=sys.stderr)
        return
    shutil.rmtree(run_dir, ignore_errors=True)
