#!/usr/bin/env python3
"""Run upstream's own ``torch.distributed._shard`` test files through torch_shard's compat alias.

    python tests/upstream/run_upstream.py UPSTREAM_DIR [--against torch_shard|upstream|both]

``UPSTREAM_DIR`` is a folder of upstream test files the user supplies (e.g. a copy of PyTorch's
``test/distributed/_shard``); nothing of upstream's is shipped here. Every ``test_*.py`` under it is
copied to a work folder with the mechanical edits listed in ``EDITS`` (CUDA placements and ``.cuda()``
calls to the CPU, NCCL to gloo, GPU-count and NCCL skip decorators removed; only on a machine with
fewer than 4 GPUs) and run with pytest, one process per file, 4 ranks per test:

* ``--against torch_shard``: ``torch_shard.compat`` is installed at interpreter start, so the files'
  ``torch.distributed._shard`` and test-base imports resolve to torch_shard;
* ``--against upstream``: upstream's library and test base, the test base patched the same way for
  gloo/CPU (``_startup/sitecustomize.py``).

It prints PASS / FAIL / ERROR / SKIP per test method, per mode, the counts and wall time, and with
``--against both`` every method whose outcome differs. ``--json FILE`` writes the results.
Upstream's test base needs the ``expecttest`` package (``pip install expecttest``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
STARTUP = HERE / "_startup"
FILE_TIMEOUT_S = 3600

# Decorators that skip a test for lack of GPUs or of NCCL. On a CPU-only machine they skip every
# test, so they are removed; the tests then run on gloo with CPU placements.
_SKIP_DECORATORS = (
    "skip_if_lt_x_gpu",
    "requires_nccl",
    "requires_accelerator_dist_backend",
    "skip_if_no_gpu",
    "skip_if_rocm_multiprocess",
    "skipIfRocm",
    "requires_cuda",
)


@dataclass
class Edit:
    """One mechanical source edit: a regex and its replacement, with what it is for."""

    name: str
    pattern: str
    replacement: str
    why: str
    flags: int = 0

    def apply(self, text: str) -> tuple[str, int]:
        return re.subn(self.pattern, self.replacement, text, flags=self.flags)


# The only edits applied. Each is textual and local; nothing is rewritten by meaning.
EDITS = [
    Edit(
        "cuda-placement",
        r"/cuda:(?:\d+|\{[^{}\"']*\})",
        "/cpu",
        'placements "rank:N/cuda:M" / "workerN/cuda:M" (also f-string indices) -> ".../cpu"',
    ),
    Edit(
        "accelerator-placement",
        r"/\{(?:DEVICE_TYPE|device_type|self\.device_type)\}:(?:\d+|\{[^{}\"']*\})",
        "/cpu",
        'accelerator-generic placements "rank:N/{device_type}:M" -> "rank:N/cpu" (a "cpu:M" placement '
        "makes tensors on device cpu, which then fail the placement check in both libraries)",
    ),
    Edit(
        "accelerator-device-string",
        r"f([\"'])\{(?:DEVICE_TYPE|device_type|self\.device_type)\}:(?:\d+|\{[^{}\"']*\})\1",
        r"\1cpu\1",
        'accelerator-generic device strings f"{device_type}:{rank}" -> "cpu" (tensors made on "cpu:N" '
        'report device "cpu", so device comparisons with "cpu:N" fail in both libraries)',
    ),
    Edit(
        "accelerator-defaults",
        r"^if torch\.accelerator\.is_available\(\):\n",
        'DEVICE_TYPE, BACKEND = "cpu", "gloo"  # run_upstream.py: CPU defaults\n'
        "if torch.accelerator.is_available():\n",
        "module-level names a file defines only when an accelerator exists get CPU defaults "
        '(DEVICE_TYPE = "cpu", BACKEND = "gloo") before that `if torch.accelerator.is_available():`',
        re.MULTILINE,
    ),
    Edit(
        "cuda-device-string",
        r"([\"'])cuda(?::(?:\d+|\{[^{}\"']*\}))?\1",
        r"\1cpu\1",
        'device strings "cuda", "cuda:N" -> "cpu"',
    ),
    Edit(
        "cuda-call",
        r"\.cuda\((?:[^()]|\([^()]*\))*\)",
        ".cpu()",
        "tensor/module .cuda(...) -> .cpu()",
    ),
    Edit(
        "rank-as-device",
        r"\.to\(self\.rank\)",
        ".cpu()",
        ".to(self.rank) (an int device is a CUDA ordinal) -> .cpu()",
    ),
    Edit(
        "nccl-backend",
        r"([\"'])nccl\1",
        r'\1gloo\1',
        'backend "nccl" -> "gloo"',
    ),
    Edit(
        "gpu-skip-decorator",
        r"^[ \t]*@(?:" + "|".join(_SKIP_DECORATORS) + r")\b[^\n]*\n",
        "",
        "GPU-count / NCCL skip decorators (" + ", ".join(_SKIP_DECORATORS) + ") removed",
        re.MULTILINE,
    ),
]


def edit_source(text: str) -> tuple[str, dict[str, int]]:
    """Apply ``EDITS`` in order; returns the new text and how often each edit applied."""
    counts = {}
    for edit in EDITS:
        text, n = edit.apply(text)
        counts[edit.name] = n
    return text, counts


@dataclass
class FileResult:
    path: str
    seconds: float = 0.0
    outcomes: dict[str, str] = field(default_factory=dict)  # "Class::method" -> PASS/FAIL/ERROR/SKIP
    details: dict[str, str] = field(default_factory=dict)
    problem: str = ""


def _parse_junit(xml_path: Path) -> tuple[dict[str, str], dict[str, str]]:
    outcomes, details = {}, {}
    root = ET.parse(xml_path).getroot()
    for case in root.iter("testcase"):
        cls = case.get("classname", "").rpartition(".")[2]
        key = f"{cls}::{case.get('name')}"
        outcome, detail = "PASS", ""
        for child in case:
            tag = child.tag
            if tag in ("failure", "error", "skipped"):
                outcome = {"failure": "FAIL", "error": "ERROR", "skipped": "SKIP"}[tag]
                detail = (child.text or child.get("message") or "").strip()
                break
        if key in outcomes and outcomes[key] == "FAIL" and outcome == "ERROR":
            continue  # a teardown error after a failure: keep the failure
        outcomes[key] = outcome if key not in outcomes or outcome != "PASS" else outcomes[key]
        details[key] = detail
    return outcomes, details


def _last_line(detail: str) -> str:
    # pytest prefixes failure text with "E   "; rank tracebacks end in "<Type>Error: message".
    lines = [re.sub(r"^E\s+", "", line.strip()) for line in detail.splitlines() if line.strip()]
    interesting = [
        line
        for line in lines
        if re.match(r"^[A-Za-z_.]*(Error|Exception|Exit)\b", line)
        and "ranks failed" not in line
        and "exited with error code" not in line
    ]
    return (interesting or lines or [""])[-1][:200]


def _has_four_gpus() -> bool:
    probe = "import torch; print(torch.cuda.is_available() and torch.cuda.device_count() >= 4)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return out.stdout.strip() == "True"


def prepare(upstream_dir: Path, work: Path, verbose: bool, apply_edits: bool) -> list[Path]:
    """Copy every test file under ``upstream_dir`` to ``work``, with the mechanical edits if asked."""
    files = sorted(p for p in upstream_dir.rglob("test_*.py") if p.is_file())
    if not files:
        raise SystemExit(f"no test_*.py files under {upstream_dir}")
    out = []
    for src in files:
        rel = src.relative_to(upstream_dir)
        dst = work / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        text, counts = edit_source(src.read_text()) if apply_edits else (src.read_text(), {})
        dst.write_text(text)
        out.append(dst)
        if verbose:
            applied = ", ".join(f"{k} x{v}" for k, v in counts.items() if v) or "none"
            print(f"  edits {rel}: {applied}")
    return out


def run_mode(mode: str, files: list[Path], work: Path, extra_path: str, keyword: str | None) -> list[FileResult]:
    env = dict(os.environ)
    env["TORCH_SHARD_UPSTREAM_MODE"] = mode
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("OMP_NUM_THREADS", "1")
    paths = [str(STARTUP), str(REPO)] + ([extra_path] if extra_path else [])
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    results = []
    for path in files:
        rel = str(path.relative_to(work))
        xml = work / f".{mode}.{rel.replace(os.sep, '__')}.xml"
        cmd = [
            sys.executable, "-m", "pytest", str(path), "-q", "-p", "no:cacheprovider",
            "--rootdir", str(path.parent), f"--junitxml={xml}", "-o", "junit_family=xunit1",
        ]
        if keyword:
            cmd += ["-k", keyword]
        start = time.monotonic()
        result = FileResult(rel)
        try:
            proc = subprocess.run(
                cmd, cwd=path.parent, env=env, capture_output=True, text=True, timeout=FILE_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            result.problem = f"timed out after {FILE_TIMEOUT_S} s"
            proc = None
        result.seconds = time.monotonic() - start
        if xml.exists():
            result.outcomes, result.details = _parse_junit(xml)
        if not result.outcomes and proc is not None:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            result.problem = result.problem or "no test results; " + " | ".join(tail)
        for key, outcome in sorted(result.outcomes.items()):
            note = f"  [{_last_line(result.details.get(key, ''))}]" if outcome != "PASS" else ""
            print(f"  {outcome:5} {rel}::{key}{note}", flush=True)
        if result.problem:
            print(f"  ERROR {rel}: {result.problem}", flush=True)
        results.append(result)
    return results


def summarize(mode: str, results: list[FileResult], seconds: float) -> dict[str, str]:
    flat = {f"{r.path}::{k}": v for r in results for k, v in r.outcomes.items()}
    for r in results:
        if r.problem and not r.outcomes:
            flat[f"{r.path}::<file>"] = "ERROR"
    counts = {k: sum(1 for v in flat.values() if v == k) for k in ("PASS", "FAIL", "ERROR", "SKIP")}
    print(
        f"{mode}: {len(flat)} methods: {counts['PASS']} passed, {counts['FAIL']} failed, "
        f"{counts['ERROR']} errors, {counts['SKIP']} skipped in {seconds / 60:.1f} min"
    )
    return flat


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("upstream_dir", type=Path, help="folder of upstream test files (test_*.py, searched recursively)")
    parser.add_argument("--against", choices=["torch_shard", "upstream", "both"], default="torch_shard")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression to select tests")
    parser.add_argument("--work", type=Path, help="folder for the edited copies (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="write the per-method results here")
    parser.add_argument("--python-path", default="", help="extra PYTHONPATH entry (e.g. where expecttest is installed)")
    parser.add_argument("--show-edits", action="store_true", help="print which edits applied to each file")
    args = parser.parse_args(argv)

    if not args.upstream_dir.is_dir():
        parser.error(f"{args.upstream_dir} is not a folder")
    probe = subprocess.run(
        [sys.executable, "-c", "import expecttest"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [args.python_path, os.environ.get("PYTHONPATH", "")]))},
        capture_output=True,
    )
    if probe.returncode != 0:
        print("upstream's test base (torch.testing._internal.common_utils) needs expecttest: pip install expecttest")
        return 2

    work = args.work or Path(tempfile.mkdtemp(prefix="torch_shard_upstream_"))
    if work.exists() and args.work:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    apply_edits = not _has_four_gpus()
    print(f"edited copies in {work} ({'CPU edits applied' if apply_edits else '4 GPUs: files unchanged'})")
    files = prepare(args.upstream_dir.resolve(), work, args.show_edits, apply_edits)

    modes = ["torch_shard", "upstream"] if args.against == "both" else [args.against]
    flat_by_mode, seconds_by_mode = {}, {}
    for mode in modes:
        print(f"== against {mode} ==", flush=True)
        start = time.monotonic()
        results = run_mode(mode, files, work, args.python_path, args.keyword)
        seconds_by_mode[mode] = time.monotonic() - start
        flat_by_mode[mode] = (results, seconds_by_mode[mode])
    print("== summary ==")
    flats = {mode: summarize(mode, *flat_by_mode[mode]) for mode in modes}
    if len(modes) == 2:
        ours, theirs = flats["torch_shard"], flats["upstream"]
        diff = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        print(f"{len(diff)} methods differ (torch_shard / upstream):")
        for key in diff:
            print(f"  {ours.get(key, '-'):5} / {theirs.get(key, '-'):5}  {key}")
        lost = [k for k in diff if theirs.get(k) == "PASS"]
        print(f"{len(lost)} pass on upstream and not on torch_shard")
    if args.json:
        payload = {
            mode: {
                "seconds": seconds_by_mode[mode],
                "results": flats[mode],
                "details": {
                    f"{r.path}::{k}": _last_line(v) for r in flat_by_mode[mode][0] for k, v in r.details.items() if v
                },
            }
            for mode in modes
        }
        args.json.write_text(json.dumps(payload, indent=1, sort_keys=True))
    failed = any(v != "PASS" for flat in flats.values() for v in flat.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
