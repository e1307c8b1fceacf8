"""The docs (docs/ and README.md): Sphinx builds them without a warning, and they follow their rules.

- ``sphinx-build -W --keep-going`` of docs/ (the guide's Markdown pages through MyST and the API
  reference from the docstrings, docs/conf.py) succeeds and prints no warning: every page is in the
  table of contents, every link between pages and every reference to a torch_shard object resolves.
  It is ``make docs``'s build, into a temporary folder.
- docs/ holds less than ``DOCS_BUDGET_BYTES`` (its files, conf.py included; no build output).
- No file in docs/, nor README.md, holds a date (``2026-11-28``), an issue number (``issue 26``) or a
  commit-looking hash: a word of 7 to 40 lowercase hex digits with at least one digit and one letter.
  The one exception: docs/performance.md names the commit each table was measured at, written as
  ``Commit: `<hash>``` or ``commit `<hash>``` (the word "commit", then the hash in backticks).
  History belongs to CHANGELOG.md and git.
- Every ``make <target>`` the docs print names a target of the Makefile, every path into the
  repository they name (``examples/demo.py``, ``scripts/gpu_check.sh``, ``docs/howto/train.md``, ...)
  exists, and every ``NOTE [ name ]`` they point at is defined in the code.

``make test`` installs Sphinx into .venv (requirements/docs.txt), and the suite runs with .venv's
Python: there a missing Sphinx or a missing docs/ fails these tests, never skips them. make test's
torch legs (other venvs, no Sphinx: scripts/torch_leg.sh) and its wheel check (copies of tests/ only:
scripts/wheel_check.sh) leave this file out (``--ignore``). Run anywhere else, the checks that lack what
they check say so and skip.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
DOCS_BUDGET_BYTES = 90_000

DATE = re.compile(r"20\d\d-\d\d-\d\d")
ISSUE = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)
HEX_WORD = re.compile(r"\b[0-9a-f]{7,40}\b")
ALLOWED_COMMIT = re.compile(r"\b[Cc]ommit:? `([0-9a-f]{7,40})`")
MAKE_TARGET = re.compile(r"\bmake ([a-z][a-z0-9_.-]*[a-z0-9])")
REPO_PATH = re.compile(r"(?<![\w./~-])(?:bench|build_backend|csrc|docs|examples|requirements|scripts|tests|torch_shard)/[\w./-]*[\w/]")

IN_REPO_VENV = Path(sys.prefix).resolve() == (ROOT / ".venv").resolve()


def require(condition: bool, reason: str) -> None:
    """Fail in the repository's .venv (where `make test` runs the suite), skip elsewhere."""
    if condition:
        return
    if IN_REPO_VENV:
        pytest.fail(f"{reason} (`make test`'s set-up installs what the docs need into .venv)")
    pytest.skip(f"{reason}: outside the repository's .venv the docs are not checked")


def doc_files() -> list[Path]:
    require(DOCS.is_dir(), f"no docs folder at {DOCS}")
    return sorted(p for p in DOCS.rglob("*") if p.is_file() and "_build" not in p.parts and "__pycache__" not in p.parts)


def text_files() -> list[Path]:
    return [p for p in doc_files() if p.suffix in (".md", ".py", ".txt", ".rst")] + ([README] if README.is_file() else [])


def commit_like(word: str) -> bool:
    return any(c.isdigit() for c in word) and any(c in "abcdef" for c in word)


def test_sphinx_build_has_no_warnings(tmp_path):
    doc_files()
    require(importlib.util.find_spec("sphinx") is not None, "Sphinx is not installed (requirements/docs.txt)")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q", str(DOCS), str(tmp_path / "html")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    output = result.stdout + result.stderr
    warnings = [line for line in output.splitlines() if "WARNING" in line or "ERROR" in line]
    assert result.returncode == 0 and not warnings, f"sphinx-build failed (exit {result.returncode}):\n{output}"
    assert (tmp_path / "html" / "reference" / "api.html").is_file()


def test_docs_fit_their_budget():
    sizes = {p.relative_to(ROOT): p.stat().st_size for p in doc_files()}
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert total < DOCS_BUDGET_BYTES, f"docs/ holds {total} bytes, over {DOCS_BUDGET_BYTES}; largest: {largest}"


def test_no_dates_issue_numbers_or_commit_hashes():
    problems = []
    for path in text_files():
        allowed_here = path == DOCS / "performance.md"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}"
            problems += [f"{where}: date {m.group(0)!r}" for m in DATE.finditer(line)]
            problems += [f"{where}: issue number {m.group(0)!r}" for m in ISSUE.finditer(line)]
            allowed = set(ALLOWED_COMMIT.findall(line)) if allowed_here else set()
            problems += [
                f"{where}: commit-like hash {m.group(0)!r}"
                for m in HEX_WORD.finditer(line)
                if commit_like(m.group(0)) and m.group(0) not in allowed
            ]
    assert not problems, "history belongs to CHANGELOG.md and git:\n" + "\n".join(problems)


def test_the_rules_catch_what_they_are_for():
    assert DATE.search("measured on 2026-11-28") and not DATE.search("1,000,000 x 128")
    assert ISSUE.search("(Issue 41)") and ISSUE.search("issues 32 and 33") and not ISSUE.search("an issue with it")
    hashes = [m.group(0) for m in HEX_WORD.finditer("at 87a9fef, 2591235 and ebfb3f6; float32 4096 deadbeef") if commit_like(m.group(0))]
    assert hashes == ["87a9fef", "ebfb3f6"]
    assert ALLOWED_COMMIT.findall("· Commit: `15763f1`; rows: commit `4d572b0` (carried), at 87a9fef") == ["15763f1", "4d572b0"]


def makefile_targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", makefile, re.MULTILINE))
    for phony in re.findall(r"^\.PHONY:(.*)$", makefile, re.MULTILINE):
        targets.update(phony.split())
    legs = re.search(r"^TORCH_LEGS := (.*)$", makefile, re.MULTILINE)
    if legs:
        targets.update(f"test-leg-{leg}" for leg in legs.group(1).split())
    return targets


def code_of(line: str, in_block: bool) -> str:
    """What a Markdown line shows as code: all of it inside a fenced block, else its inline code spans."""
    return line if in_block else " ".join(re.findall(r"`([^`]+)`", line))


def test_printed_commands_name_what_exists():
    require((ROOT / "Makefile").is_file(), "no Makefile beside the tests")
    targets = makefile_targets()
    problems = []
    for path in text_files():
        in_block = False
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}"
            if line.lstrip().startswith("```"):
                in_block = not in_block
                continue
            code = code_of(line, in_block) if path.suffix == ".md" else ""
            problems += [f"{where}: no Makefile target {t!r}" for t in MAKE_TARGET.findall(code) if t not in targets]
            problems += [f"{where}: no such path {p!r}" for p in sorted(set(REPO_PATH.findall(line))) if not (ROOT / p).exists()]
    assert not problems, "\n".join(problems)


def test_named_notes_exist_in_the_code():
    """Every ``NOTE [ name ]`` the docs point at is defined in csrc/ or torch_shard/ (a renamed or
    removed NOTE must take its pointers along)."""
    require((ROOT / "csrc").is_dir() and (ROOT / "torch_shard").is_dir(), "no source tree beside the tests")
    code = "\n".join(
        p.read_text(encoding="utf-8", errors="replace")
        for folder in ("csrc", "torch_shard")
        for p in (ROOT / folder).rglob("*")
        if p.suffix in (".cpp", ".h", ".py")
    )
    missing = []
    for path in text_files():
        text = " ".join(path.read_text(encoding="utf-8").split())
        for name in re.findall(r"NOTE \\?\[ ([^]\"`]+?) \\?\]", text):
            if name != "..." and f"NOTE [ {name} ]" not in code:
                missing.append(f"{path.relative_to(ROOT)}: NOTE [ {name} ]")
    assert not missing, "the docs name NOTEs the code does not define:\n" + "\n".join(missing)
