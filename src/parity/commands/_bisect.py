"""`parity bisect GOOD BAD`: the first commit between GOOD and BAD that breaks a check."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import IO, Any

from parity.commands._check import origin_flag
from parity.commands._common import (
    EXIT_FAIL,
    EXIT_OK,
    CLIError,
    class_flag,
    config_flags,
    config_of,
    groups_flag,
    json_flag,
    override_flag,
    overrides_of,
    split_groups,
    subparser,
)

__all__ = ["add_parser", "run"]


def add_parser(sub: Any, help: str) -> None:
    """Add `bisect` to `sub` (argparse subparsers), `help` its line in `parity --help`."""
    bisect = subparser(
        sub,
        "bisect",
        help=help,
        description="Pin goldens at GOOD into a temporary folder, confirm GOOD passes and BAD "
        "fails, then binary-search the first-parent commits between them, each checked in a "
        "temporary worktree. A commit whose producers cannot run is skipped, never counted as "
        "bad. Your checkout, goldens and `git bisect` state are not touched. Exit 0 the first "
        "bad commit is named; 1 it lies among commits that could not run (listed); 2 GOOD "
        "does not pass, BAD does not fail, or unusable input.",
    )
    bisect.add_argument("good", metavar="GOOD", help="a commit whose outputs are right")
    bisect.add_argument("bad", metavar="BAD", help="a later commit that fails the check")
    groups_flag(bisect)
    json_flag(bisect, what="the steps and the answer")
    origin_flag(bisect)
    override_flag(bisect)
    class_flag(bisect)
    config_flags(bisect, goldens=False)


def run(args: argparse.Namespace, out: IO[str]) -> int:
    from parity.run._bisection import bisect

    config = config_of(args)
    overrides = overrides_of(args, with_class=True)

    def progress(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    t0 = time.perf_counter()
    result = bisect(  # a BisectError is a ParityError: cli.main prints its line, exit 2
        args.good,
        args.bad,
        config=config,
        groups=split_groups(args.groups),
        overrides=overrides,
        progress=progress,
        origin=args.origin == "auto",
    )
    if args.json_path:
        doc = result.to_dict() | {"seconds": round(time.perf_counter() - t0, 2)}
        try:
            Path(args.json_path).write_text(json.dumps(doc, indent=1))
        except OSError as e:
            raise CLIError(f"cannot write {args.json_path}: {e}") from None
    for s in result.skipped:
        out.write(f"skipped (could not run): {s.sha} {s.detail}\n")
    fb = result.first_bad
    if result.status == "found" and fb is not None:
        out.write(f"first bad commit: {fb.sha}\n")
        out.write(f"  group {fb.group}, key {fb.key}, class {fb.class_name}  ({fb.subject})\n")
        if result.origin_line:
            out.write(f"  {result.origin_line}\n")
        return EXIT_OK
    if result.status == "ambiguous" and fb is not None:
        out.write(
            "the first bad commit is one of these (the others could not run the producers):\n"
        )
        out.writelines(f"  {sha}\n" for sha in result.candidates)
        out.write(f"  first known bad: group {fb.group}, key {fb.key}, class {fb.class_name}\n")
        return EXIT_FAIL
    good, bad = result.good[:12], result.bad[:12]
    raise CLIError(
        {
            "good_fails": f"GOOD {good} does not pass against goldens pinned at itself (its "
            "outputs are not reproducible: check the producers for randomness or threads)",
            "bad_passes": f"BAD {bad} passes against goldens pinned at GOOD {good}: nothing "
            "broke between them for these groups; pick a BAD that fails `parity check`",
            "cannot_run": f"the producers cannot run at GOOD {good} or BAD {bad} (see the step "
            "above); pick commits that have what the producers need",
        }[result.status]
    )
