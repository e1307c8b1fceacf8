"""Two hosts: two network namespaces joined by a veth pair, each end addressed inside its namespace
only, with torchrun run in each."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

from .guards import _Deferred, _ExitOnSignal, _torn_down_on_failure
from .launch import NodeResult, _run_nodes, _torchrun_argv, _worker_env
from .netns import _ETC_NETNS, ADDRESSES, PREFIX_LEN, _ip, _pids_in_namespace, _reap_stale, _run_stem, _write_hosts_file
from .processes import _stop
from .shaping import _shaping_args


class TwoHosts:
    """Two network namespaces joined by a veth pair, for as long as the ``with`` block runs.

    ``names[i]`` is host i's namespace and the name of its veth end; host i has ``ADDRESSES[i]``.
    ``rate`` (e.g. "1gbit") caps the link in each direction with a token-bucket filter (tc tbf);
    without it the link is as fast as the machine moves bytes between namespaces. (Delay cannot be
    added where tc's netem is missing.)
    """

    def __init__(self, mtu: int = 1500, rate: str | None = None):
        self.mtu = mtu
        self.rate = rate
        if rate is not None:
            _shaping_args(rate, "check")
        stem = _run_stem()
        self.names = (stem + "a", stem + "b")
        self._signals = _ExitOnSignal()

    def __enter__(self) -> TwoHosts:
        self._signals.__enter__()
        with _torn_down_on_failure(self, "setting up the namespaces"):
            _reap_stale()
            a, b = self.names
            for ns in self.names:
                _ip("netns", "add", ns)
            # Each end is created inside its namespace: nothing of the run ever sits in the host's own.
            _ip("link", "add", a, "netns", a, "mtu", str(self.mtu), "type", "veth",
                "peer", "name", b, "netns", b, "mtu", str(self.mtu))
            for ns, address in zip(self.names, ADDRESSES):
                _ip("-n", ns, "addr", "add", f"{address}/{PREFIX_LEN}", "dev", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "link", "set", ns, "up")
                if self.rate is not None:
                    subprocess.run(["ip", "netns", "exec", ns, "tc", *_shaping_args(self.rate, ns)],
                                   capture_output=True, text=True, check=True, timeout=30)
                _write_hosts_file(ns)
        return self

    def __exit__(self, *exc) -> bool:
        try:
            with _Deferred():
                for ns in self.names:
                    _stop(_pids_in_namespace(ns), grace=3.0)
                for ns in self.names:
                    _ip("netns", "del", ns, check=False)
                    shutil.rmtree(_ETC_NETNS + ns, ignore_errors=True)
        finally:
            self._signals.__exit__(*exc)
        return False

    def popen(self, node: int, argv: Sequence[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
        """Start ``argv`` in host ``node``'s namespace (in a new session, so a terminal's Ctrl-C
        reaches only this process; teardown stops it)."""
        return subprocess.Popen(["ip", "netns", "exec", self.names[node], *argv],
                                env=_worker_env(env, self.names[node]), start_new_session=True, **kwargs)

    def torchrun(self, script_argv: Sequence[str], nproc_per_node: int, *, env: dict[str, str] | None = None,
                 timeout: float = 600.0, capture: bool = True) -> list[NodeResult]:
        """Run ``torchrun ... script_argv`` on both hosts (``nproc_per_node`` ranks each, ranks
        0..k-1 on host 0) and wait for both; raises TorchrunError unless both exit 0 within ``timeout``."""

        def launch(node, log):
            argv = _torchrun_argv(2, node, nproc_per_node, script_argv)
            return self.popen(node, argv, env, stdout=log, stderr=subprocess.STDOUT if log else None)

        return _run_nodes(launch, 2, timeout, capture)
