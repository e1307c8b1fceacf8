"""Signal handling around a rig, so that its teardown runs on every exit path and runs to its end."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading


class _ExitOnSignal:
    """While active, SIGTERM and SIGHUP raise SystemExit in the main thread, so `finally` blocks and
    context managers (the namespace teardown) run as they do for Ctrl-C."""

    _SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __enter__(self):
        self._saved = {}
        if threading.current_thread() is threading.main_thread():
            for sig in self._SIGNALS:
                self._saved[sig] = signal.signal(sig, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise SystemExit(128 + signum)

    def __exit__(self, *exc):
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        return False


class _Deferred:
    """Holds SIGINT, SIGTERM and SIGHUP back while a teardown runs (a second Ctrl-C must not cut it
    short and leave processes or namespaces behind); they are delivered when it ends."""

    _SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}

    def __enter__(self):
        self._old = signal.pthread_sigmask(signal.SIG_BLOCK, self._SIGNALS)
        return self

    def __exit__(self, *exc):
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old)
        return False


@contextlib.contextmanager
def _torn_down_on_failure(rig, what: str):
    """The set-up in a rig's ``__enter__``: if it raises anything (a Ctrl-C included), the rig's
    ``__exit__`` tears down what was made, then the error propagates; a failed command as a
    RuntimeError naming ``what``, the command and its stderr."""
    try:
        yield
    except BaseException as exc:
        rig.__exit__(type(exc), exc, exc.__traceback__)
        if isinstance(exc, subprocess.CalledProcessError):
            raise RuntimeError(f"{what} failed: {' '.join(exc.cmd)}: {(exc.stderr or '').strip()}") from exc
        raise
