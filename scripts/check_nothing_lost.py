"""Check that a move of README text into docs/ lost nothing: every paragraph of README.md as it was
at a git revision must appear, whitespace aside, in today's README.md or a page under docs/.

    python scripts/check_nothing_lost.py REVISION    # exit 1 and list what is missing

A paragraph is a run of non-blank lines (a code block counts as paragraphs too); headings alone
are skipped, as the pages may retitle them. A paragraph edited by additions only (every one of its
lines still present, e.g. a code example with a line added) is reported as edited, not missing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def paragraphs(text: str) -> list[str]:
    """Paragraphs of ``text`` (lines stripped, joined by newlines), headings left out."""
    out, block = [], []
    for line in text.splitlines() + [""]:
        if line.strip():
            block.append(line.strip())
        elif block:
            if not (len(block) == 1 and block[0].startswith("#")):
                out.append("\n".join(block))
            block = []
    return out


def main(rev: str) -> int:
    old = subprocess.run(["git", "show", f"{rev}:README.md"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    today = " ".join(" ".join(p.read_text().split()) for p in pages)
    found = edited = 0
    missing = []
    for p in paragraphs(old):
        if " ".join(p.split()) in today:
            found += 1
        elif all(" ".join(line.split()) in today for line in p.split("\n")):
            edited += 1
            print(f"EDITED (every line kept): {p[:100]}")
        else:
            missing.append(p)
            print(f"MISSING: {p[:160]}")
    print(f"README.md at {rev}: {found} paragraphs found verbatim, {edited} edited, {len(missing)} missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "HEAD"))
