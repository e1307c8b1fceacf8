"""``python -m torch_shard.checkpoint verify DIR``: check a whole checkpoint offline.

Exit status: 0 when every check passed, 1 when any item is corrupted, 2 when the checkpoint cannot be
read at all (no ``.metadata``, ...).
"""

from __future__ import annotations

import argparse
import sys

from ._verify import verify_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_shard.checkpoint", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    verify = commands.add_parser("verify", help="check every checksum of a DCP checkpoint")
    verify.add_argument("path", help="the checkpoint directory")
    verify.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show a progress bar (default: for big checkpoints on a terminal)")
    verify.add_argument("-v", "--verbose", action="store_true", help="also list the items without a checksum")
    args = parser.parse_args(argv)

    try:
        report = verify_checkpoint(args.path, progress=args.progress)
    except Exception as e:  # noqa: BLE001 - any failure to read the checkpoint at all
        print(f"{args.path}: cannot be read: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if args.verbose:
        for name in report.unchecked:
            print(f"unchecked: {name}")
    if report.ok:
        kind = "zip CRC-32s and block checksums" if report.has_block_checksums else "zip CRC-32s"
        print(f"{args.path}: OK, {report.items} items checked ({kind}); {len(report.unchecked)} without a checksum")
        return 0
    print(f"{args.path}: CORRUPTED, {len(report.corrupted_items)} of {report.items} items:")
    for name in report.corrupted_items:
        print(f"  {name}")
    for corruption in report.corruptions:
        print(f"    {corruption.describe()}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
