"""``python -m torch_shard.checkpoint verify DIR``: check a whole checkpoint offline, as a load would.

Exit status: 0 when every check passed, 1 when anything is damaged (a saved item, a missing or
truncated data file, ``.metadata`` or ``.checksums``), 2 for usage errors (bad arguments, a path that
is not a checkpoint directory).
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
    verify.add_argument("--no-checksums", dest="checksums", action="store_false",
                        help="ignore .checksums: check the data against their zip CRC-32s alone")
    verify.add_argument("-v", "--verbose", action="store_true", help="also list the items without a checksum")
    args = parser.parse_args(argv)

    try:
        report = verify_checkpoint(args.path, progress=args.progress, checksums=args.checksums)
    except FileNotFoundError as e:  # not a checkpoint directory: a usage error
        print(f"{args.path}: not a DCP checkpoint: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a checkpoint that cannot even be checked is damaged
        print(f"{args.path}: DAMAGED, cannot be checked: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if args.verbose:
        for name in report.unchecked:
            print(f"unchecked: {name}")
    if report.ok:
        kind = "data checksums of this save" if report.has_block_checksums else "zip CRC-32s"
        print(f"{args.path}: OK, {report.items} items checked ({kind}); {len(report.unchecked)} without a checksum")
        return 0
    print(f"{args.path}: CORRUPTED, {len(report.corruptions)} check(s) failed ({report.items} items checked):")
    for name in report.corrupted_items:
        print(f"  {name}")
    for corruption in report.corruptions:
        print(f"    {corruption.describe()}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
