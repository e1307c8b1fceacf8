"""bench_data_paths.py over several settings (hosts x ranks per host), repeated, in one table.

Each setting is run --runs times as separate torchrun launches (the runs of all settings interleaved,
so a busy spell of the machine does not land on one setting alone). Every launch writes its medians
as JSON (bench_data_paths.py --json); the table gives, per setting and size, the median over the runs
of each ratio and its spread (min-max over the runs):

* ts/up: torch_shard / torch.distributed._shard; ts/dt: torch_shard / DTensor (for gather DTensor has
  no gather-to-one, so its ``full_tensor()``, every rank getting the tensor, stands in);
* ts/fl: torch_shard / the op's floor (the same bytes moved by one unchecked collective).

Settings: one host, ``torchrun --standalone`` with W ranks (--one-host, gloo over loopback); two
hosts, network namespaces joined by a veth pair with k ranks each (--two-hosts; needs root, see
scripts/torchrun_hosts.py; the link is as fast as loopback here unless --rate caps it, e.g. --rate
1gbit). --round-one runs every setting once per given exchange mode.

    python bench/sweep.py                                   # 1x4 1x8 1x16 2x2 2x4 2x8, 3 runs each
    python bench/sweep.py --one-host 4 --two-hosts 2 --runs 1 --round-one auto all_to_all
    python bench/sweep.py --one-host --two-hosts 2 4 --rate 1gbit --save runs.json
    python bench/sweep.py --from runs.json                  # the table again, from a saved sweep

(``make bench-sweep``, ``make bench-multihost``.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _round_one import ROUND_ONE_MODES

HERE = Path(__file__).resolve().parent
BENCH = HERE / "bench_data_paths.py"


def _load_launcher():
    # A script of the repository, not a package module: loaded from its path.
    spec = importlib.util.spec_from_file_location("torchrun_hosts", HERE.parent / "scripts" / "torchrun_hosts.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


OPS = ("scatter", "gather", "reshard")
# Per op: (torch_shard case, upstream case, DTensor case, floor case) in bench_data_paths.py's results.
CASES = {
    "scatter": ("torch_shard scatter", "upstream scatter", "dtensor scatter", "floor scatter"),
    "gather": ("torch_shard gather", "upstream gather", "dtensor full_tensor", "floor gather"),
    "reshard": ("torch_shard reshard", "upstream reshard", "dtensor reshard", "floor all_to_all"),
}
RATIOS = ("ts/up", "ts/dt", "ts/fl")


def ratios(seconds: dict[str, float]) -> dict[str, float]:
    """One run's ratios for one size, keyed "<op> <ratio>"."""
    out = {}
    for op, (ts, up, dt, fl) in CASES.items():
        for name, other in zip(RATIOS, (up, dt, fl)):
            out[f"{op} {name}"] = seconds[ts] / seconds[other]
    return out


def _cell(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def table(runs: list[dict]) -> str:
    """Markdown: one row per (setting, size, round-1 mode), ratio medians over the runs (min-max).

    A setting's modes sit in adjacent rows for each size, so they compare at a glance.
    """
    groups: dict[tuple, list[dict[str, float]]] = {}
    for run in runs:
        for n, seconds in run["seconds"].items():
            key = (run["hosts"], run["world"] // run["hosts"], int(n), run["round_one"] or "-")
            groups.setdefault(key, []).append(seconds)
    header = ["setting", "N", "round 1", "runs"] + [f"{op} {r}" for op in OPS for r in RATIOS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    ms_header = ["setting", "N", "round 1"] + [f"{op} {who}" for op in OPS for who in ("ts", "floor")]
    ms_lines = ["| " + " | ".join(ms_header) + " |", "|" + "---|" * len(ms_header)]
    for (hosts, per_host, n, mode), per_run in sorted(groups.items()):
        label = [f"{hosts}x{per_host}", str(n), mode]
        rs = [ratios(s) for s in per_run]
        cells = [*label, str(len(rs))] + [_cell([r[f"{op} {name}"] for r in rs]) for op in OPS for name in RATIOS]
        lines.append("| " + " | ".join(cells) + " |")
        ms = list(label)
        for op in OPS:
            ts, _, _, fl = CASES[op]
            ms += [f"{statistics.median(s[ts] for s in per_run) * 1e3:.2f}",
                   f"{statistics.median(s[fl] for s in per_run) * 1e3:.2f}"]
        ms_lines.append("| " + " | ".join(ms) + " |")
    return ("ratios: median over runs (min-max); setting = hosts x ranks per host; < 1: torch_shard is faster\n\n"
            + "\n".join(lines)
            + "\n\ntorch_shard and floor, ms (median over runs of each run's median)\n\n"
            + "\n".join(ms_lines))


def run_once(launcher, hosts: int, per_host: int, bench_args: list[str], timeout: float, link: dict) -> dict:
    """One launch of bench_data_paths.py; returns its JSON record."""
    fd, path = tempfile.mkstemp(prefix="sweep-", suffix=".json")
    os.close(fd)
    try:
        argv = [str(BENCH), *bench_args, "--json", path]
        if hosts == 1:
            launcher.run_one_host(argv, per_host, timeout=timeout)
        else:
            with launcher.TwoHosts(**link) as two:
                two.torchrun(argv, per_host, timeout=timeout)
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one-host", type=int, nargs="*", default=[4, 8, 16], metavar="W",
                        help="world sizes on one host (default 4 8 16)")
    parser.add_argument("--two-hosts", type=int, nargs="*", default=[2, 4, 8], metavar="K",
                        help="ranks per host on two hosts (default 2 4 8)")
    parser.add_argument("--runs", type=int, default=3, help="launches per setting (default 3)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 512, 2048],
                        help="N of the N x N float32 tensors; multiples of every world size (default 64 512 2048)")
    # bench_data_paths.py's own defaults (40 repeats up to N = 512, 7 above) suit 4 ranks; 16 ranks on
    # 2 cores take several times as long per op, and the spread over --runs launches says more than
    # more repeats inside one.
    parser.add_argument("--repeats", type=int, default=10,
                        help="timed repeats per case in each launch; 0: the bench's own defaults (default 10)")
    parser.add_argument("--round-one", nargs="+", choices=ROUND_ONE_MODES,
                        help="run every setting once per exchange mode (default: the build's own)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per launch")
    parser.add_argument("--mtu", type=int, default=1500, help="MTU of the link between the two hosts (default 1500)")
    parser.add_argument("--rate", help="cap the link between the two hosts, in tc's units (e.g. 1gbit; default: none)")
    parser.add_argument("--save", metavar="PATH", help="also write every run's record there (JSON)")
    parser.add_argument("--from", dest="load", metavar="PATH", help="print the table of a saved sweep and exit")
    args = parser.parse_args()
    if args.load:
        with open(args.load) as f:
            print(table(json.load(f)))
        return
    launcher = _load_launcher()
    settings = [(1, w) for w in args.one_host] + [(2, k) for k in args.two_hosts]
    if any(h == 2 for h, _ in settings):
        reason = launcher.unavailable_reason()
        if reason is not None:
            print(f"two-host settings skipped: {reason}")
            settings = [s for s in settings if s[0] == 1]
    modes = args.round_one or [None]
    link = {"mtu": args.mtu, "rate": args.rate}
    records: list[dict] = []
    failures: list[str] = []
    start = time.monotonic()
    for run in range(args.runs):
        for hosts, per_host in settings:
            for mode in modes:
                label = f"{hosts}x{per_host}" + (f" round 1 {mode}" if mode else "") + f", run {run + 1}/{args.runs}"
                bench_args = ["--sizes", *map(str, args.sizes)]
                bench_args += ["--repeats", str(args.repeats)] if args.repeats else []
                bench_args += ["--round-one", mode] if mode else []
                t0 = time.monotonic()
                try:
                    record = run_once(launcher, hosts, per_host, bench_args, args.timeout, link)
                except launcher.TorchrunError as exc:
                    failures.append(f"{label}: {exc}")
                    print(f"{label}: FAILED", flush=True)
                    continue
                if mode and record["round_one"] != mode:
                    failures.append(f"{label}: this build cannot set the round-1 mode (no torch_shard._testing_C)")
                records.append(record)
                print(f"{label}: {time.monotonic() - t0:.0f} s", flush=True)
    print(f"\nsweep: {len(records)} runs in {(time.monotonic() - start) / 60:.1f} min\n")
    if args.save:
        with open(args.save, "w") as f:
            json.dump(records, f, indent=1)
    if records:
        if any(h == 2 for h, _ in settings):
            cap = f"capped at {args.rate}" if args.rate else "not capped"
            print(f"two hosts: network namespaces joined by a veth pair, MTU {args.mtu}, link {cap}\n")
        print(table(records))
    for failure in failures:
        print(f"\n{failure}")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
