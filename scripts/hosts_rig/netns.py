"""Network namespaces of a run: their names, ``ip``, whether they can be made here, reaping those of
runs whose owner is gone, and the /etc/hosts each one sees.

Every run gets its own namespaces, named after the owning process's pid and a counter (the veth ends
carry the same names), so runs never collide, and a namespace whose owner's pid is gone is left over
from a SIGKILLed run: the next run deletes it.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from collections.abc import Sequence

from .processes import _alive, _orphans, _stop

ADDRESSES = ("10.213.0.1", "10.213.0.2")
PREFIX_LEN = 24
# Interface names hold at most 15 characters: "tsmh" + pid (<= 7 digits) + "x" + counter (< 100) + a/b.
_NAME_PREFIX = "tsmh"
_NAME = re.compile(rf"^{_NAME_PREFIX}(\d+)x(\d+)[a-z]$")
_counter = itertools.count()
_ETC_NETNS = "/etc/netns/"


def _run_stem() -> str:
    """A fresh stem for one run's names (``_NAME`` without its last letter, which tells them apart)."""
    return f"{_NAME_PREFIX}{os.getpid()}x{next(_counter) % 100}"


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
    name = _run_stem() + "a"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"ip netns is not permitted here: `ip netns add` failed: {made.stderr.strip() or made.returncode}"
    _ip("netns", "del", name, check=False)
    return None


def _pids_in_namespace(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split()]


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
