"""Run TorchRec's scenarios many times in a row, on torch_shard and on upstream ``torch.distributed._shard``.

    python scripts/stress_torchrec.py                  # 20 runs each, 2 busy processes beside them
    python scripts/stress_torchrec.py --runs 40 --only torch_shard --load 3

Each run is one launch of ``tests/torchrec_scenarios.py`` on 4 gloo ranks under torchrun, as
``tests/test_torchrec.py`` runs it: every scenario (fused-optimizer training, DCP save and load into
another plan with optimizer state, a row-wise Adagrad model loaded into a second trained model, dynamic
resharding and a step after it, an EmbeddingCollection), one after the other. ``--upstream`` runs the
same scenarios without ``torch_shard.compat``, on torch's own ShardedTensor. The busy processes
(``--load``) reproduce a loaded CI machine, where timing-dependent failures show.

Prints one line per run and a summary (runs passed per implementation); exits 1 when any torch_shard
run failed. ``make stress`` runs it. TorchRec must be installed (``make torchrec``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from test_torchrec import WORLD_SIZE, run_isolated, scenarios_command  # noqa: E402 - after the tests folder is on the path

# A run takes 10-30 s on a busy 2-core machine; this only stops a hang the group's timeout missed.
RUN_TIMEOUT_S = 600


def _busy(stop) -> None:
    while not stop.is_set():
        pass


def run_once(upstream: bool) -> tuple[bool, str, float]:
    """One launch: (every scenario passed on every rank, what failed first, seconds)."""
    with tempfile.TemporaryDirectory(prefix="torch_shard_stress_") as results:
        start = time.monotonic()
        proc = run_isolated(scenarios_command(results, upstream), RUN_TIMEOUT_S)
        seconds = time.monotonic() - start
        failures = []
        for rank in range(WORLD_SIZE):
            path = Path(results) / f"rank{rank}.json"
            if not path.exists():
                failures.append(f"rank {rank}: no report")
                continue
            for name, outcome in json.loads(path.read_text()).items():
                if outcome["status"] == "error":
                    last = (outcome["detail"].strip().splitlines() or [""])[-1]
                    failures.append(f"rank {rank}: {name}: {last[:200]}")
        if not failures and proc.returncode != 0:
            failures.append(f"torchrun exited {proc.returncode}: {proc.stdout.strip().splitlines()[-1:]}")
        return not failures, "\n    ".join(failures), seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="runs per implementation (default 20)")
    parser.add_argument("--only", choices=("torch_shard", "upstream"), help="run one implementation only")
    parser.add_argument("--load", type=int, default=2, help="busy processes beside the runs (default 2)")
    args = parser.parse_args(argv)
    kinds = [args.only] if args.only else ["torch_shard", "upstream"]
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=_busy, args=(stop,), daemon=True) for _ in range(args.load)]
    for burner in burners:
        burner.start()
    passed = {kind: 0 for kind in kinds}
    try:
        # Interleaved, so that both see the same machine over the same minutes.
        for run in range(1, args.runs + 1):
            for kind in kinds:
                ok, why, seconds = run_once(upstream=kind == "upstream")
                passed[kind] += ok
                print(f"{kind:<11} run {run:>3}: {'ok' if ok else 'FAILED'} ({seconds:.0f} s)", flush=True)
                if not ok:
                    print(f"    {why}", flush=True)
    finally:
        stop.set()
        for burner in burners:
            burner.join()
    print(f"== {args.runs} runs each, {args.load} busy processes beside them")
    for kind in kinds:
        print(f"{kind:<11} {passed[kind]}/{args.runs} passed")
    return 0 if passed.get("torch_shard", args.runs) == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
