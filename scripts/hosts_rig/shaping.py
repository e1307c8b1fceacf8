"""Capping a link's rate with tc's token-bucket filter."""

from __future__ import annotations

import re

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
