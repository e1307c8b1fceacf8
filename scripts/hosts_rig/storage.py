"""Storage: hosts reading one directory over a network filesystem served from another namespace.

StorageHosts makes N host namespaces and a "storage" namespace. The storage namespace holds a bridge
(the cluster's switch) with the server's address, and one veth per host: the host's end, addressed
10.214.0.<i+1>, sits in the host's namespace, the other end is a port of the bridge. sshd runs in the
storage namespace and serves the directory over SFTP; each host mounts it with sshfs (FUSE) at its
own path in this machine's mount namespace, the mount started through `nsenter --net` so its SSH
connection leaves from the host's namespace and crosses the host's veth (`ip netns exec` would give
the mount a mount namespace of its own, unseen by anything else). Each mount is a FUSE filesystem of
its own, so each host has its own page cache of the files, as each machine of a cluster has.

The server's link is capped with a token-bucket filter on the bridge's egress: everything the server
sends (to any host) leaves through the bridge device, so all hosts share one capped link, while
traffic between hosts (gloo) is forwarded from port to port and does not pass that qdisc. The bytes
the server sent are the bridge's tx counter (TORCH_SHARD_RIG_LINK names it).

Nothing of a run outlives it: the teardown stops the ranks, unmounts every mount (fusermount3 -u,
else umount -l), stops sshfs and sshd, deletes the namespaces, and deletes the run's directory
under /run/torch_shard_rig (host key, client key, authorized_keys, sshd_config and the mount
points: nothing is added to ~/.ssh or /etc/ssh). A run whose owner was SIGKILLed is cleaned up by
the next one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence

from .guards import _Deferred, _ExitOnSignal, _torn_down_on_failure
from .launch import NodeResult, _run_nodes, _torchrun_argv, _worker_env
from .mounts import _remove_run_dir, _unmount, mounts_under
from .netns import (
    _ETC_NETNS,
    _NAME_PREFIX,
    PREFIX_LEN,
    _ip,
    _pids_in_namespace,
    _reap_stale,
    _run_stem,
    _write_hosts_file,
)
from .processes import _comm, _orphans, _stop
from .shaping import _shaping_args
from .storage_tools import _SSHD

STORAGE_SUBNET = "10.214.0"
STORAGE_ADDRESS = STORAGE_SUBNET + ".254"
STORAGE_BRIDGE = "br0"
RIG_ROOT = "/run/torch_shard_rig"
_RUN_DIR_NAME = re.compile(rf"^{_NAME_PREFIX}(\d+)x(\d+)$")
_PRIVSEP_DIR = "/run/sshd"  # Debian's sshd refuses to start without it
# Present while /run/sshd is one a rig made (deleted by the last run to end, even after a SIGKILL).
_PRIVSEP_MARK = RIG_ROOT + "/made-run-sshd"
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


def _reap_stale_rigs() -> None:
    """Unmount and delete the run directories of storage rigs whose owner process is gone."""
    for name in _orphans(RIG_ROOT, _RUN_DIR_NAME):
        _remove_run_dir(f"{RIG_ROOT}/{name}")


def link_bytes(link: str) -> int:
    """Bytes sent so far by the server's link, named as in TORCH_SHARD_RIG_LINK ("<netns>:<ifname>")."""
    import json

    ns, ifname = link.split(":", 1)
    out = _ip("-n", ns, "-s", "-j", "link", "show", ifname).stdout
    return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])


class StorageHosts:
    """``hosts`` network namespaces that read ``storage`` (a directory of this machine) over sshfs from
    a storage namespace, for as long as the ``with`` block runs (see the module's notes).

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
        stem = _run_stem()
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
