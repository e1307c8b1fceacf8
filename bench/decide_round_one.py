"""Which of round 1's mechanisms win where: from saved sweeps (bench/sweep.py --round-one ... --save).

For each mechanism, each setting (hosts x ranks per host) and each size, the ratio of torch_shard's
time with the mechanism (variant "auto", the product) to its time without it (the variant that turns
only it off), per op: below 1 the mechanism wins. Times are the median over the runs of each run's
median. The verdict column is the geometric mean over the ops and sizes the mechanism can change
(listed in MECHANISMS), so one noisy cell does not decide.

    python bench/decide_round_one.py sweep.json [more.json ...]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

OPS = {"scatter": "torch_shard scatter", "gather": "torch_shard gather", "reshard": "torch_shard reshard"}
# mechanism -> (variant with it, variant without it, ops it can change, sizes it can change; None: all)
MECHANISMS = {
    "hub": ("auto", "all_to_all", ("scatter", "gather", "reshard"), None),
    "ride": ("auto", "no_ride", ("scatter", "gather"), (512, 2048)),
    "hub at 16 ranks": ("auto", "hub8", ("scatter", "gather", "reshard"), None),
    # The prediction of the next op from the group's history (mode and rooms): it can change every op
    # whose messages do not fit the hub's slot.
    "round 1 predicts the next op": ("auto", "no_prediction", ("scatter", "gather", "reshard"), (512, 2048)),
    # Superseded by the prediction; kept so the sweeps that measured it read.
    "round 1 follows the last op (superseded)": ("auto", "no_follow", ("gather", "reshard"), (512, 2048)),
    # Mechanisms the sweeps decided against (ahead sends, the slot history) and the hub's limit of 16
    # ranks (in those sweeps "auto" meant the hub up to 8): kept so the sweeps that measured them read.
    "ahead (removed)": ("auto", "no_ahead", ("scatter",), (2048,)),
    "slot history (removed)": ("auto", "no_history", ("reshard",), (512,)),
    "hub up to 16 ranks (when auto meant up to 8)": ("hub16", "auto", ("scatter", "gather", "reshard"), None),
}


def load(paths: list[str]) -> dict:
    """(variant, hosts, per_host, size) -> op -> median seconds over the runs."""
    per_run: dict[tuple, dict[str, list[float]]] = {}
    for path in paths:
        with open(path) as f:
            for run in json.load(f):
                for n, seconds in run["seconds"].items():
                    key = (run["round_one"] or "auto", run["hosts"], run["world"] // run["hosts"], int(n))
                    cell = per_run.setdefault(key, {op: [] for op in OPS})
                    for op, case in OPS.items():
                        cell[op].append(seconds[case])
    return {key: {op: statistics.median(v) for op, v in cell.items()} for key, cell in per_run.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args()
    times = load(args.paths)
    settings = sorted({(h, k) for _, h, k, _ in times})
    sizes = sorted({n for *_, n in times})
    for name, (with_it, without, ops, changed_sizes) in MECHANISMS.items():
        rows = []
        for hosts, per_host in settings:
            cells, relevant = [], []
            for n in sizes:
                a, b = times.get((with_it, hosts, per_host, n)), times.get((without, hosts, per_host, n))
                if a is None or b is None:
                    continue
                for op in ops:
                    ratio = a[op] / b[op]
                    cells.append(f"{op[:2]} {n}: {ratio:.2f}")
                    if changed_sizes is None or n in changed_sizes:
                        relevant.append(ratio)
            if relevant:
                mean = math.exp(sum(math.log(r) for r in relevant) / len(relevant))
                verdict = "wins" if mean < 1.0 else "loses"
                rows.append(f"| {hosts}x{per_host} | {hosts * per_host} | {mean:.2f} {verdict} | {', '.join(cells)} |")
        if rows:
            print(f"\n{name}: time with / time without ({with_it} / {without}); < 1: it wins\n")
            print("| setting | W | geo. mean where it can act | every op and size |")
            print("|---|---|---|---|")
            print("\n".join(rows))


if __name__ == "__main__":
    main()
