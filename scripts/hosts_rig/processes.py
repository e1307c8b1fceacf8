"""Finding and stopping processes: a process tree, a namespace's processes, a dead owner's leftovers."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence


def _descendants(pid: int) -> list[int]:
    """``pid``'s descendants now (children first found through /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # The name field may hold spaces and parentheses: the ppid follows the last ')'.
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _stop(pids: Sequence[int], grace: float) -> None:
    """SIGTERM ``pids``, then SIGKILL those still alive after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        live = [p for p in pids if _alive(p)]
        for p in live:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while live and time.monotonic() < deadline:
            time.sleep(0.05)
            live = [p for p in live if _alive(p)]
        if not live:
            return


def stop_process_tree(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """Stop ``proc`` and every process it started (torchrun starts its workers in their own sessions,
    so its process group does not hold them), then reap ``proc``."""
    if proc.poll() is None:
        # Found before anything is signalled: once torchrun exits, its workers' parent links are gone.
        _stop([proc.pid, *_descendants(proc.pid)], grace)
    proc.wait()


def _orphans(directory: str, pattern: re.Pattern) -> list[str]:
    """The entries of ``directory`` named by ``pattern`` (group 1: the owner's pid) whose owner is gone."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return []
    return [name for name in entries
            if (match := pattern.match(name)) is not None and not _alive(int(match.group(1)))]


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""
