"""torchrun on one host, or on two "hosts" made on this machine from network namespaces.

Two hosts: two network namespaces joined by a veth pair, each end addressed inside its namespace only
(10.213.0.1/24 and 10.213.0.2/24) with its own loopback up; torchrun runs in each namespace with a
static rendezvous on the first address, and gloo binds the namespace's veth (GLOO_SOCKET_IFNAME).
Traffic between the two hosts then crosses a real network interface (TCP over the veth, MTU 1500 by
default) instead of loopback, as it would between machines; traffic within a host stays on its own
loopback. Both hosts still share this machine's cores and memory, and the link is as fast as the
machine copies bytes between namespaces unless a rate caps it (``rate``/--rate, tc's token bucket).

Every run gets its own namespaces, named after this process's pid and a counter (the veth ends carry
the same names), so runs never collide, and the master port is free in a namespace made for the run.
Teardown stops every process left in the namespaces, then deletes them (which deletes the veth pair),
on every exit path: normal exit, exceptions, Ctrl-C, SIGTERM/SIGHUP. Namespaces left behind by a
process that was SIGKILLed are deleted by the next run (their owner's pid is gone).

Needs root and iproute2; :func:`unavailable_reason` says in one line why not where either is missing.

As a tool (from the repository root)::

    python scripts/torchrun_hosts.py --hosts 2 --nproc-per-node 2 -- bench/bench_data_paths.py --sizes 64
    python scripts/torchrun_hosts.py --hosts 1 --nproc-per-node 8 -- bench/bench_data_paths.py
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

ADDRESSES = ("10.213.0.1", "10.213.0.2")
PREFIX_LEN = 24
MASTER_PORT = 29500
# Interface names hold at most 15 characters: "tsmh" + pid (<= 7 digits) + "x" + counter (< 100) + a/b.
_NAME_PREFIX = "tsmh"
_NAME = re.compile(rf"^{_NAME_PREFIX}(\d+)x(\d+)[ab]$")
_counter = itertools.count()
_ETC_NETNS = "/etc/netns/"
# Variables a launcher may have left in the environment that would change where the ranks connect or
# how torchrun behaves; each run sets what it needs itself.
_SCRUBBED = ("GLOO_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
             "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable_reason() -> str | None:
    """Why two namespaces cannot be made here (one line), or None when they can.

    Probes by making (and deleting) a namespace, so an environment that forbids it (a container
    without CAP_SYS_ADMIN, a read-only /run) is caught too.
    """
    if shutil.which("ip") is None:
        return "ip netns is not available: iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "ip netns is not permitted: making network namespaces needs root"
    name = f"{_NAME_PREFIX}{os.getpid()}x{next(_counter) % 100}a"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"ip netns is not permitted here: `ip netns add` failed: {made.stderr.strip() or made.returncode}"
    _ip("netns", "del", name, check=False)
    return None


def _pids_in_namespace(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split()]


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


def _reap_stale() -> None:
    """Delete namespaces of this tool whose owner process is gone (it was SIGKILLed mid-run)."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    for line in listed:
        name = line.split(" ")[0]
        match = _NAME.match(name)
        if match is None or _alive(int(match.group(1))):
            continue
        _stop(_pids_in_namespace(name), grace=1.0)
        _ip("netns", "del", name, check=False)
    try:
        left = os.listdir(_ETC_NETNS)
    except OSError:
        return
    for name in left:
        match = _NAME.match(name)
        if match is not None and not _alive(int(match.group(1))):
            shutil.rmtree(_ETC_NETNS + name, ignore_errors=True)


def _write_hosts_file(ns: str) -> None:
    """Give the namespace an /etc/hosts naming both hosts (`ip netns exec` mounts /etc/netns/<ns>/hosts
    over /etc/hosts). c10d's store looks up the name of every peer that connects; without an entry
    the lookup goes to a DNS server the namespace cannot reach: a warning per connection, and a wait
    for the resolver's timeout where unreachable servers are not refused at once."""
    try:
        with open("/etc/hosts") as f:
            hosts = f.read().rstrip("\n") + "\n"
    except OSError:
        hosts = "127.0.0.1 localhost\n"
    for i, address in enumerate(ADDRESSES):
        # The store listens on IPv6 too: its peers show up as IPv4-mapped addresses.
        hosts += f"{address} {_NAME_PREFIX}-host{i}\n::ffff:{address} {_NAME_PREFIX}-host{i}\n"
    try:
        os.makedirs(_ETC_NETNS + ns, exist_ok=True)
        with open(_ETC_NETNS + ns + "/hosts", "w") as f:
            f.write(hosts)
    except OSError:
        pass  # only slower start-up


@dataclass
class NodeResult:
    """What one host's torchrun did."""

    node_rank: int
    returncode: int | None  # None: it was stopped at the timeout
    output: str  # stdout and stderr together (empty when not captured)


class TorchrunError(RuntimeError):
    """A torchrun exited non-zero or did not finish in time; the message carries the outputs' tails."""

    def __init__(self, message: str, results: list[NodeResult]):
        super().__init__(message)
        self.results = results


def _worker_env(base: dict[str, str] | None, ifname: str) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    for key in _SCRUBBED:
        env.pop(key, None)
    env["GLOO_SOCKET_IFNAME"] = ifname
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _torchrun_argv(nnodes: int, node_rank: int, nproc: int, script_argv: Sequence[str]) -> list[str]:
    if nnodes == 1:
        rdzv = ["--standalone"]
    else:
        rdzv = [f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--master-addr={ADDRESSES[0]}",
                f"--master-port={MASTER_PORT}"]
    return [sys.executable, "-m", "torch.distributed.run", *rdzv, f"--nproc-per-node={nproc}",
            "--max-restarts=0", *script_argv]


def _tail(text: str, lines: int = 120) -> str:
    return "\n".join(text.splitlines()[-lines:])


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


def _run_nodes(launch, nnodes: int, timeout: float, capture: bool) -> list[NodeResult]:
    """Start every node's torchrun through ``launch(node_rank, stdout)``, wait for all (or the
    timeout), stop what is left, and return their results; raises TorchrunError unless all exited 0."""
    logs = [tempfile.TemporaryFile("w+") if capture else None for _ in range(nnodes)]
    procs: list[subprocess.Popen] = []
    try:
        for node in range(nnodes):
            procs.append(launch(node, logs[node]))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            # One host failing leaves the other waiting for it until gloo's timeout: stop early.
            if any(p.poll() not in (None, 0) for p in procs):
                time.sleep(2.0)  # let the other side print its error
                break
            time.sleep(0.1)
    finally:
        with _Deferred():
            timed_out = [p.poll() is None for p in procs]
            for p in procs:
                stop_process_tree(p)
    results = []
    for node, p in enumerate(procs):
        output = ""
        if logs[node] is not None:
            logs[node].seek(0)
            output = logs[node].read()
            logs[node].close()
        results.append(NodeResult(node, None if timed_out[node] else p.returncode, output))
    bad = [r for r in results if r.returncode != 0]
    if bad:
        parts = []
        for r in results:
            state = "stopped (still running at the timeout, or after the other host failed)" if r.returncode is None else f"exit {r.returncode}"
            parts.append(f"--- host {r.node_rank}: {state} ---\n{_tail(r.output)}")
        raise TorchrunError("torchrun failed:\n" + "\n".join(parts), results)
    return results


_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}


def _shaping_args(rate: str, dev: str) -> list[str]:
    """``tc`` arguments that cap ``dev``'s egress at ``rate`` (tc's units: "800mbit", "2gbit")."""
    match = _RATE.match(rate)
    if match is None:
        raise ValueError(f"link rate must look like 800mbit or 2gbit, got {rate!r}")
    bytes_per_s = float(match.group(1)) * _RATE_UNITS[match.group(2)] / 8
    # A token-bucket filter whose bucket holds 1 ms at the rate: bytes up to the bucket's size pass at
    # full speed, so a larger bucket would let a benchmark's single messages (a few hundred KiB) through
    # unshaped; a smaller one can keep a kernel that refills it once per timer tick below the rate.
    burst = max(16 << 10, int(bytes_per_s / 1000))
    return ["qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", str(burst), "latency", "100ms"]


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
        stem = f"{_NAME_PREFIX}{os.getpid()}x{next(_counter) % 100}"
        self.names = (stem + "a", stem + "b")
        self._signals = _ExitOnSignal()

    def __enter__(self) -> TwoHosts:
        self._signals.__enter__()
        try:
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
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            if isinstance(exc, subprocess.CalledProcessError):
                raise RuntimeError(f"setting up the namespaces failed: {' '.join(exc.cmd)}: "
                                   f"{(exc.stderr or '').strip()}") from exc
            raise
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


def run_one_host(script_argv: Sequence[str], nproc_per_node: int, *, env: dict[str, str] | None = None,
                 timeout: float = 600.0, capture: bool = True) -> NodeResult:
    """``torchrun --standalone`` on this host, gloo over loopback; raises TorchrunError unless it exits 0."""

    def launch(node, log):
        return subprocess.Popen(_torchrun_argv(1, 0, nproc_per_node, script_argv), env=_worker_env(env, "lo"),
                                start_new_session=True, stdout=log, stderr=subprocess.STDOUT if log else None)

    with _ExitOnSignal():
        return _run_nodes(launch, 1, timeout, capture)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, choices=(1, 2), default=2)
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before both sides are stopped")
    parser.add_argument("--mtu", type=int, default=1500, help="veth MTU (two hosts)")
    parser.add_argument("--rate", help="cap the link between the hosts, in tc's units (e.g. 1gbit)")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    args = parser.parse_args()
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script:
        parser.error("give the script to run after --")
    try:
        if args.hosts == 1:
            run_one_host(script, args.nproc_per_node, timeout=args.timeout, capture=False)
        else:
            reason = unavailable_reason()
            if reason is not None:
                sys.exit(reason)
            with TwoHosts(mtu=args.mtu, rate=args.rate) as hosts:
                hosts.torchrun(script, args.nproc_per_node, timeout=args.timeout, capture=False)
    except TorchrunError as exc:
        codes = ", ".join("stopped" if r.returncode is None else f"exit {r.returncode}" for r in exc.results)
        sys.exit(f"torchrun failed ({codes})")
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
