#!/usr/bin/env python
"""Repin the goldens at a git base commit.

    python tools/repin_goldens.py --base SHA [--out DIR] [--keep-worktree] [--groups a,b]
    python tools/repin_goldens.py --recover [--out DIR]

The producers in tests/equivalence/producers.py (current tree) run in a subprocess against
the code of a detached worktree at SHA in a temporary folder, on 1 simulated CPU device with
the XLA ISA capped at AVX2. Your working tree, index and branches are not touched. The new
files replace the old ones only once every group has been produced; a summary of what
changed is printed. Only one repin of a folder runs at a time (a second one fails at once,
naming the first one's pid). A repin killed at any moment (even SIGKILL) leaves the old
goldens or the complete new ones; the next repin, or `--recover`, finishes its replace and
removes what it left (see src/parity/store/staging.py). Exit 0 on success, 1 if repinning failed
(old goldens untouched), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from parity.run.launcher import RepinError
from parity.run.repin import recover_folder, repin
from parity.run.worktree import GitError

ROOT = Path(__file__).resolve().parents[1]


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--base", help="commit to pin at (SHA or any git revision)")
    p.add_argument(
        "--recover",
        action="store_true",
        help="only finish or clean up after a repin that was killed (every repin does this first)",
    )
    p.add_argument(
        "--out", type=Path, default=ROOT / "goldens", help="golden folder (default: goldens/)"
    )
    p.add_argument(
        "--producers",
        type=Path,
        default=ROOT / "tests" / "equivalence" / "producers.py",
        help="producers file from the current tree",
    )
    p.add_argument("--groups", default="", help="comma-separated subset of producer groups")
    p.add_argument("--devices", type=int, default=1, help="simulated CPU devices (default 1)")
    p.add_argument("--keep-worktree", action="store_true", help="leave the worktree for inspection")
    args = p.parse_args(argv)
    if args.recover:
        try:
            lines = recover_folder(args.out, repo=ROOT)
        except (RepinError, GitError) as e:
            print(f"repin failed: {e}", file=sys.stderr)
            return 1
        print("\n".join(lines) if lines else f"nothing to recover in {args.out}")
        return 0
    if not args.base:
        p.error("--base is required (unless --recover)")
    try:
        result = repin(
            args.base,
            producers=args.producers,
            out_dir=args.out,
            repo=ROOT,
            device_count=args.devices,
            groups=[g for g in args.groups.split(",") if g],
            keep_worktree=args.keep_worktree,
            progress=_progress,
        )
    except (RepinError, GitError) as e:
        print(f"repin failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("repin interrupted; old goldens untouched, worktree removed", file=sys.stderr)
        return 130
    print(f"pinned at {result.sha} into {result.out_dir}")
    for change in result.changes:
        print(change.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
