"""Imported by the test fork server only: loads the libraries the test process had loaded.

See NOTE [ Rank processes come from a fork server ] in ``_multiprocess``. The test process writes a
JSON file ``{"sys_path": [...], "modules": [...]}`` and names it in the environment variable
``TORCH_SHARD_TEST_FORKSERVER_PRELOAD`` when it starts the server; this module imports those
modules so every rank forked from the server has them without importing them itself. Anything that
fails to import is left to the ranks, which import what they need anyway.

Importing must not start threads: threads do not survive fork, and one that exists in the server
(an OpenMP pool above all) can hang every rank. ``started_threads`` records how many this import
started, and ranks refuse to run if it is not zero.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

PRELOAD_ENV = "TORCH_SHARD_TEST_FORKSERVER_PRELOAD"


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # no procfs: only Python's own threads are visible
        import threading

        return threading.active_count()


def _preload(path: str) -> list[str]:
    with open(path) as f:
        spec = json.load(f)
    sys.path[:] = spec["sys_path"]
    failed = []
    for name in spec["modules"]:
        try:
            importlib.import_module(name)
        except (Exception, SystemExit):  # noqa: BLE001 - the ranks import it (or report it) themselves
            failed.append(name)
    return failed


_threads_before = _thread_count()
#: Modules of the list that did not import here.
failed_modules: list[str] = _preload(os.environ[PRELOAD_ENV]) if os.environ.get(PRELOAD_ENV) else []
#: Threads that importing the list started; must be 0 for ranks forked from here to be safe.
started_threads: int = _thread_count() - _threads_before
