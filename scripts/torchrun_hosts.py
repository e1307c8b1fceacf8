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

With --storage DIR, any number of hosts (1 to 18) read DIR over sshfs served from a storage namespace,
the server's link capped at --storage-rate (1gbit by default): a cluster's network filesystem, each
host with its own page cache (:class:`StorageHosts`; the notes above it say how). One command starts
and stops it: nothing stays mounted, no server runs and no key stays authorised after it::

    python scripts/torchrun_hosts.py --hosts 2 --nproc-per-node 2 --storage /tmp/ckpt --storage-rate 1gbit \\
        -- bench/bench_checkpoint.py --state replicated --mib 32
"""

from __future__ import annotations

import argparse
import contextlib
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
_NAME = re.compile(rf"^{_NAME_PREFIX}(\d+)x(\d+)[a-z]$")
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
    for name in _orphans(_ETC_NETNS, _NAME):
        shutil.rmtree(_ETC_NETNS + name, ignore_errors=True)


def _orphans(directory: str, pattern: re.Pattern) -> list[str]:
    """The entries of ``directory`` named by ``pattern`` (group 1: the owner's pid) whose owner is gone."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return []
    return [name for name in entries
            if (match := pattern.match(name)) is not None and not _alive(int(match.group(1)))]


def _write_hosts_file(ns: str, addresses: Sequence[str] = ADDRESSES) -> None:
    """Give the namespace an /etc/hosts naming both hosts (`ip netns exec` mounts /etc/netns/<ns>/hosts
    over /etc/hosts). c10d's store looks up the name of every peer that connects; without an entry
    the lookup goes to a DNS server the namespace cannot reach: a warning per connection, and a wait
    for the resolver's timeout where unreachable servers are not refused at once."""
    try:
        with open("/etc/hosts") as f:
            hosts = f.read().rstrip("\n") + "\n"
    except OSError:
        hosts = "127.0.0.1 localhost\n"
    for i, address in enumerate(addresses):
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


def _torchrun_argv(nnodes: int, node_rank: int, nproc: int, script_argv: Sequence[str],
                   master_addr: str = ADDRESSES[0]) -> list[str]:
    if nnodes == 1:
        rdzv = ["--standalone"]
    else:
        rdzv = [f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--master-addr={master_addr}",
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


# --- Storage: hosts reading one directory over a network filesystem served from another namespace ---
#
# StorageHosts makes N host namespaces and a "storage" namespace. The storage namespace holds a bridge
# (the cluster's switch) with the server's address, and one veth per host: the host's end, addressed
# 10.214.0.<i+1>, sits in the host's namespace, the other end is a port of the bridge. sshd runs in the
# storage namespace and serves the directory over SFTP; each host mounts it with sshfs (FUSE) at its
# own path in this machine's mount namespace, the mount started through `nsenter --net` so its SSH
# connection leaves from the host's namespace and crosses the host's veth (`ip netns exec` would give
# the mount a mount namespace of its own, unseen by anything else). Each mount is a FUSE filesystem of
# its own, so each host has its own page cache of the files, as each machine of a cluster has.
#
# The server's link is capped with a token-bucket filter on the bridge's egress: everything the server
# sends (to any host) leaves through the bridge device, so all hosts share one capped link, while
# traffic between hosts (gloo) is forwarded from port to port and does not pass that qdisc. The bytes
# the server sent are the bridge's tx counter (TORCH_SHARD_RIG_LINK names it).
#
# Nothing of a run outlives it: the teardown stops the ranks, unmounts every mount (fusermount3 -u,
# else umount -l), stops sshfs and sshd, deletes the namespaces, and deletes the run's directory
# under /run/torch_shard_rig (host key, client key, authorized_keys, sshd_config and the mount
# points: nothing is added to ~/.ssh or /etc/ssh). A run whose owner was SIGKILLed is cleaned up by
# the next one.

STORAGE_SUBNET = "10.214.0"
STORAGE_ADDRESS = STORAGE_SUBNET + ".254"
STORAGE_BRIDGE = "br0"
RIG_ROOT = "/run/torch_shard_rig"
_RUN_DIR_NAME = re.compile(rf"^{_NAME_PREFIX}(\d+)x(\d+)$")
_SSHD = "/usr/sbin/sshd"
_PRIVSEP_DIR = "/run/sshd"  # Debian's sshd refuses to start without it
# Present while /run/sshd is one a rig made (deleted by the last run to end, even after a SIGKILL).
_PRIVSEP_MARK = RIG_ROOT + "/made-run-sshd"
_STORAGE_TOOLS = {"sshfs": "sshfs", "fusermount3": "fuse3", "nsenter": "util-linux",
                  "ssh-keygen": "openssh-client", "ssh": "openssh-client", "tc": "iproute2"}
_MAX_STORAGE_HOSTS = 18  # host namespaces end in a..r; the storage namespace ends in s

# sshfs's options, chosen to behave like a cluster's network filesystem (NFS-like):
#   auto_cache: a host keeps a file's pages in its page cache across opens while the file's mtime and
#     size on the server are unchanged (NFS's close-to-open consistency): a second read on the same
#     host, caches not dropped, does not cross the link again. FUSE's default drops a file's cached
#     pages at every open (every read crosses the link); kernel_cache would keep them even after the
#     file changed on the server.
#   dcache_timeout=1, attr_timeout=1, entry_timeout=1: sshfs's own cache of names and attributes (20 s
#     by default) and the kernel's (1 s) expire after a second, so files written straight into the
#     exported directory show on the mounts at once (NFS's attribute cache is 3-60 s; a checkpoint's
#     files are new names, never cached as absent: negative_timeout stays 0).
#   max_conns=1: one SSH connection per host (an NFS mount's single TCP connection). Reads of
#     different files and read-ahead still go in parallel on it (SFTP requests are pipelined); at a
#     1 Gbit/s cap one connection is not the limit (measured, see the rig's test and the docstring).
# SSH: one fixed, fast cipher (AES-GCM), no compression (a checkpoint's floats do not compress, and it
# would hide the link's cost), keys and host checks confined to the run's directory.
SSHFS_OPTIONS = ("auto_cache", "dcache_timeout=1", "attr_timeout=1", "entry_timeout=1", "max_conns=1")
_SSH_OPTIONS = ("Ciphers=aes128-gcm@openssh.com", "Compression=no", "BatchMode=yes", "IdentitiesOnly=yes",
                "StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null", "GlobalKnownHostsFile=/dev/null",
                "LogLevel=ERROR", "ConnectTimeout=10")


def storage_unavailable_reason() -> str | None:
    """Why the storage rig cannot run here (one line), or None when it can."""
    reason = unavailable_reason()
    if reason is not None:
        return reason
    missing = sorted({pkg for tool, pkg in _STORAGE_TOOLS.items() if shutil.which(tool) is None}
                     | (set() if os.access(_SSHD, os.X_OK) else {"openssh-server"}))
    if missing:
        return f"the storage rig needs Debian's {', '.join(missing)} (install_storage_tools() installs them)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse: FUSE (sshfs) mounts are not possible here"
    return None


def install_storage_tools() -> str | None:
    """Install sshfs and openssh-server from Debian's packages where they are missing (apt-get, as
    root), without starting the system's sshd. Returns why the rig still cannot run, or None."""
    reason = storage_unavailable_reason()
    if reason is None or "install_storage_tools" not in reason:
        return reason
    if shutil.which("apt-get") is None:
        return reason + "; no apt-get to install them"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    policy = "/usr/sbin/policy-rc.d"
    made_policy = not os.path.exists(policy)
    try:
        if made_policy:
            # Tells the packages' scripts not to start services: installing must not leave a server running.
            with open(policy, "w") as f:
                f.write("#!/bin/sh\nexit 101\n")
            os.chmod(policy, 0o755)
        argv = ["apt-get", "install", "-y", "--no-install-recommends", "sshfs", "openssh-server"]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:
            subprocess.run(["apt-get", "update"], capture_output=True, text=True, env=env, timeout=600)
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [str(done.returncode)]
            return f"{reason}; apt-get install sshfs openssh-server failed: {tail[0]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{reason}; installing them failed: {exc}"
    finally:
        if made_policy:
            try:
                os.unlink(policy)
            except OSError:
                pass
    return storage_unavailable_reason()


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


def _reap_stale_rigs() -> None:
    """Unmount and delete the run directories of storage rigs whose owner process is gone."""
    for name in _orphans(RIG_ROOT, _RUN_DIR_NAME):
        _remove_run_dir(f"{RIG_ROOT}/{name}")


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def link_bytes(link: str) -> int:
    """Bytes sent so far by the server's link, named as in TORCH_SHARD_RIG_LINK ("<netns>:<ifname>")."""
    import json

    ns, ifname = link.split(":", 1)
    out = _ip("-n", ns, "-s", "-j", "link", "show", ifname).stdout
    return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])


class StorageHosts:
    """``hosts`` network namespaces that read ``storage`` (a directory of this machine) over sshfs from
    a storage namespace, for as long as the ``with`` block runs (see the notes above the class).

    ``names[i]`` is host i's namespace and the name of its veth end, ``addresses[i]`` its address,
    ``mounts[i]`` where the directory is mounted for it (a path in this machine's mount namespace, seen
    by the processes started with :meth:`popen` / :meth:`torchrun`). ``storage_rate`` (tc's units,
    e.g. "1gbit"; None: uncapped) caps what the server sends, shared by all hosts; ``rate`` caps each
    host's own egress (to the other hosts and its requests to the server).

    The processes started on host i get TORCH_SHARD_RIG_MOUNT (its mount), TORCH_SHARD_RIG_EXPORT (the
    directory itself: writing there is writing on the server), TORCH_SHARD_RIG_LINK ("<netns>:<ifname>"
    of the server's link: :func:`link_bytes`, or ``ip -n NS -s -j link show IF``, reads its tx bytes),
    TORCH_SHARD_RIG_HOST (i), TORCH_SHARD_RIG_HOSTS (the number of hosts) and TORCH_SHARD_RIG_RATE (the
    server link's cap; empty: none).
    """

    def __init__(self, hosts: int, storage: str, *, storage_rate: str | None = "1gbit", rate: str | None = None,
                 mtu: int = 1500, sshfs_options: Sequence[str] = SSHFS_OPTIONS):
        if not 1 <= hosts <= _MAX_STORAGE_HOSTS:
            raise ValueError(f"hosts must be 1..{_MAX_STORAGE_HOSTS}, got {hosts}")
        self.storage = os.path.realpath(storage)
        if not os.path.isdir(self.storage):
            raise ValueError(f"storage must be a directory, got {storage!r}")
        if "," in self.storage:
            raise ValueError("the storage directory's path must not hold a comma (sshfs's option lists)")
        for r in (rate, storage_rate):
            if r is not None:
                _shaping_args(r, "check")
        self.rate, self.storage_rate, self.mtu = rate, storage_rate, mtu
        self.sshfs_options = tuple(sshfs_options)
        stem = f"{_NAME_PREFIX}{os.getpid()}x{next(_counter) % 100}"
        self.names = tuple(stem + chr(ord("a") + i) for i in range(hosts))
        self.storage_ns = stem + "s"
        self.addresses = tuple(f"{STORAGE_SUBNET}.{i + 1}" for i in range(hosts))
        self.run_dir = f"{RIG_ROOT}/{stem}"
        self.mounts = tuple(f"{self.run_dir}/host{i}" for i in range(hosts))
        self.link = f"{self.storage_ns}:{STORAGE_BRIDGE}"
        self._ssh_dir = f"{self.run_dir}/ssh"
        self._sshd: subprocess.Popen | None = None
        self._signals = _ExitOnSignal()

    # -- set-up ------------------------------------------------------------------------------------

    def __enter__(self) -> StorageHosts:
        self._signals.__enter__()
        with _torn_down_on_failure(self, "setting up the storage rig"):
            _reap_stale_rigs()
            _reap_stale()
            os.makedirs(RIG_ROOT, exist_ok=True)
            os.mkdir(self.run_dir, 0o700)
            os.mkdir(self._ssh_dir, 0o700)
            self._network()
            self._start_sshd()
            for i in range(len(self.names)):
                self._mount(i)
        return self

    def _tc(self, ns: str, rate: str, dev: str) -> None:
        subprocess.run(["tc", "-n", ns, *_shaping_args(rate, dev)], capture_output=True, text=True,
                       check=True, timeout=30)

    def _network(self) -> None:
        s = self.storage_ns
        for ns in (*self.names, s):
            _ip("netns", "add", ns)
        _ip("-n", s, "link", "set", "lo", "up")
        _ip("-n", s, "link", "add", STORAGE_BRIDGE, "mtu", str(self.mtu), "type", "bridge")
        _ip("-n", s, "addr", "add", f"{STORAGE_ADDRESS}/{PREFIX_LEN}", "dev", STORAGE_BRIDGE)
        for i, (ns, address) in enumerate(zip(self.names, self.addresses)):
            port = f"port{i}"
            _ip("link", "add", ns, "netns", ns, "mtu", str(self.mtu), "type", "veth",
                "peer", "name", port, "netns", s, "mtu", str(self.mtu))
            _ip("-n", s, "link", "set", port, "master", STORAGE_BRIDGE)
            _ip("-n", s, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{address}/{PREFIX_LEN}", "dev", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", ns, "up")
            if self.rate is not None:
                self._tc(ns, self.rate, ns)
            _write_hosts_file(ns, self.addresses)
        _ip("-n", s, "link", "set", STORAGE_BRIDGE, "up")
        if self.storage_rate is not None:
            self._tc(s, self.storage_rate, STORAGE_BRIDGE)

    def _start_sshd(self) -> None:
        d = self._ssh_dir
        for key in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "torch_shard_rig", "-f", f"{d}/{key}"],
                           capture_output=True, text=True, check=True, timeout=30)
        with open(f"{d}/client_key.pub") as f:
            public = f.read().strip()
        with open(f"{d}/authorized_keys", "w") as f:
            f.write(f"restrict {public}\n")  # SFTP only: no pty, no forwarding
        config = f"""\
ListenAddress {STORAGE_ADDRESS}
Port 22
HostKey {d}/host_key
PidFile {d}/sshd.pid
AuthorizedKeysFile {d}/authorized_keys
AuthenticationMethods publickey
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowUsers root
UsePAM no
StrictModes no
X11Forwarding no
AllowTcpForwarding no
AllowAgentForwarding no
PrintMotd no
Subsystem sftp internal-sftp
"""
        with open(f"{d}/sshd_config", "w") as f:
            f.write(config)
        if not os.path.isdir(_PRIVSEP_DIR):
            os.mkdir(_PRIVSEP_DIR, 0o755)
            open(_PRIVSEP_MARK, "w").close()
        log_path = f"{d}/sshd.log"
        with open(log_path, "w") as log:
            self._sshd = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{self.storage_ns}", _SSHD, "-D", "-e", "-f", f"{d}/sshd_config"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 15.0
        while True:
            with open(log_path) as f:
                text = f.read()
            if "Server listening" in text:
                return
            if self._sshd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start in the storage namespace:\n{text.strip()}")
            time.sleep(0.05)

    def _mount(self, i: int) -> None:
        os.mkdir(self.mounts[i], 0o755)
        ssh = [f"IdentityFile={self._ssh_dir}/client_key", *_SSH_OPTIONS]
        argv = ["nsenter", f"--net=/run/netns/{self.names[i]}", "sshfs", "-F", "/dev/null",
                f"root@{STORAGE_ADDRESS}:{self.storage}", self.mounts[i], "-o", ",".join((*self.sshfs_options, *ssh))]
        # Its output goes to a file, not a pipe: the daemonised sshfs and its ssh keep the stderr they
        # were started with, and a pipe would never reach its end.
        log_path = f"{self._ssh_dir}/sshfs{i}.log"
        with open(log_path, "w") as log:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, timeout=60)
        if done.returncode != 0 or self.mounts[i] not in mounts_under(self.mounts[i]):
            with open(log_path) as f:
                raise RuntimeError(f"sshfs mount for host {i} failed (exit {done.returncode}): {f.read().strip()}")

    # -- teardown ----------------------------------------------------------------------------------

    def __exit__(self, *exc) -> bool:
        try:
            with _Deferred():
                # 1. The ranks and whatever else runs on the hosts, but not the mounts' daemons yet.
                for ns in self.names:
                    _stop([p for p in _pids_in_namespace(ns) if _comm(p) not in ("sshfs", "ssh")], grace=3.0)
                # 2. The mounts (sshfs exits once its mount is gone).
                for target in self.mounts:
                    _unmount(target)
                # 3. What is left: sshfs, ssh, sshd.
                for ns in (*self.names, self.storage_ns):
                    _stop(_pids_in_namespace(ns), grace=3.0)
                if self._sshd is not None:
                    _stop([self._sshd.pid], grace=3.0)
                    self._sshd.wait()
                for ns in (*self.names, self.storage_ns):
                    _ip("netns", "del", ns, check=False)
                    shutil.rmtree(_ETC_NETNS + ns, ignore_errors=True)
                # 4. Keys, sshd's config and the mount points.
                _remove_run_dir(self.run_dir)
                others = [n for n in (os.listdir(RIG_ROOT) if os.path.isdir(RIG_ROOT) else []) if _RUN_DIR_NAME.match(n)]
                if not others and os.path.exists(_PRIVSEP_MARK):
                    try:
                        os.rmdir(_PRIVSEP_DIR)
                    except OSError:
                        pass
                    os.unlink(_PRIVSEP_MARK)
                try:
                    os.rmdir(RIG_ROOT)
                except OSError:
                    pass  # another run's directory is there
        finally:
            self._signals.__exit__(*exc)
        return False

    # -- running -----------------------------------------------------------------------------------

    def env(self, node: int, base: dict[str, str] | None = None) -> dict[str, str]:
        env = _worker_env(base, self.names[node])
        env.update(TORCH_SHARD_RIG_MOUNT=self.mounts[node], TORCH_SHARD_RIG_EXPORT=self.storage,
                   TORCH_SHARD_RIG_LINK=self.link, TORCH_SHARD_RIG_HOST=str(node),
                   TORCH_SHARD_RIG_HOSTS=str(len(self.names)), TORCH_SHARD_RIG_RATE=self.storage_rate or "")
        return env

    def popen(self, node: int, argv: Sequence[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
        """Start ``argv`` on host ``node`` (its network namespace; the mounts are visible), in a new session."""
        return subprocess.Popen(["ip", "netns", "exec", self.names[node], *argv], env=self.env(node, env),
                                start_new_session=True, **kwargs)

    def torchrun(self, script_argv: Sequence[str], nproc_per_node: int, *, env: dict[str, str] | None = None,
                 timeout: float = 600.0, capture: bool = True) -> list[NodeResult]:
        """Run ``torchrun ... script_argv`` on every host (``nproc_per_node`` ranks each, host 0 first,
        rendezvous on host 0's address) and wait for all; raises TorchrunError unless all exit 0."""
        n = len(self.names)

        def launch(node, log):
            argv = _torchrun_argv(n, node, nproc_per_node, script_argv, master_addr=self.addresses[0])
            return self.popen(node, argv, env, stdout=log, stderr=subprocess.STDOUT if log else None)

        return _run_nodes(launch, n, timeout, capture)


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
    parser.add_argument("--hosts", type=int, default=2, help="1 or 2; with --storage, 1 to 18")
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before both sides are stopped")
    parser.add_argument("--mtu", type=int, default=1500, help="veth MTU (two hosts)")
    parser.add_argument("--rate", help="cap the link between the hosts, in tc's units (e.g. 1gbit)")
    parser.add_argument("--storage", metavar="DIR",
                        help="the hosts read DIR over sshfs from a storage namespace (each at the path in "
                             "$TORCH_SHARD_RIG_MOUNT); installs sshfs and openssh-server where missing")
    parser.add_argument("--storage-rate", default="1gbit",
                        help="cap on what the storage server sends, shared by all hosts (tc's units; 'none': uncapped)")
    parser.add_argument("--sshfs-options", default=",".join(SSHFS_OPTIONS),
                        help="sshfs's mount options (default: %(default)s)")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    args = parser.parse_args()
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script:
        parser.error("give the script to run after --")
    if args.storage is None and args.hosts not in (1, 2):
        parser.error("--hosts must be 1 or 2 without --storage")
    try:
        if args.storage is not None:
            reason = install_storage_tools()
            if reason is not None:
                sys.exit(reason)
            storage_rate = None if args.storage_rate.lower() == "none" else args.storage_rate
            options = [o for o in args.sshfs_options.split(",") if o]
            with StorageHosts(args.hosts, args.storage, storage_rate=storage_rate, rate=args.rate, mtu=args.mtu,
                              sshfs_options=options) as hosts:
                hosts.torchrun(script, args.nproc_per_node, timeout=args.timeout, capture=False)
        elif args.hosts == 1:
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
