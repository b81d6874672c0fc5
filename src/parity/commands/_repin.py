"""`parity repin --base REV`: pin goldens at a commit, in a temporary worktree;
`parity repin --classes-only`: give the goldens the producers' current class map; and
`parity repin --recover`: finish or clean up after a repin that was killed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import IO, Any

from parity.commands._common import (
    EXIT_FAIL,
    EXIT_OK,
    CLIError,
    config_flags,
    config_of,
    groups_flag,
    producer_failure,
    report_progress,
    split_groups,
    subparser,
)

__all__ = ["add_parser", "run"]


def add_parser(sub: Any, help: str) -> None:
    """Add `repin` to `sub` (argparse subparsers), `help` its line in `parity --help`."""
    repin = subparser(
        sub,
        "repin",
        help=help,
        description="Run the producers (current tree) against the code of commit REV in a "
        "temporary worktree, in a fresh process, and write one golden file per group; "
        "print what changed. Your working tree, index and branches are not touched. The new "
        "files replace the old ones only once every group is produced; a repin killed at any "
        "moment leaves the old goldens or the new ones, and the next repin (or --recover) "
        "finishes its replace. Exit 0 pinned (with --classes-only: classes given, however "
        "many changed), 1 --classes-only found an array's bytes moved (they are kept byte for "
        "byte: never expected), 2 failed (old goldens untouched).",
    )
    repin.add_argument(
        "--base",
        metavar="REV",
        help="commit to pin at, any git revision (required unless --classes-only or --recover)",
    )
    repin.add_argument(
        "--classes-only",
        action="store_true",
        help="give the existing goldens the producers' current CLASS_MAP without producing: "
        "arrays, order and provenance stay byte for byte (a class decision on main)",
    )
    repin.add_argument(
        "--order",
        action="store_true",
        help="with --classes-only: also take each group's forward order from the current "
        "producers (they run; only their key order is kept, every array stays as pinned)",
    )
    repin.add_argument(
        "--recover",
        action="store_true",
        help="only finish or clean up after a repin that was killed (every repin does this first)",
    )
    groups_flag(repin)
    repin.add_argument(
        "--keep-worktree",
        action="store_true",
        help="leave the temporary worktree in place for inspection (its path is printed)",
    )
    config_flags(repin)


def _snapshot(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Each golden file of `folder` by (inode, mtime, size): a replace changes the inode."""
    if not folder.is_dir():
        return {}
    return {
        p.name: (st.st_ino, st.st_mtime_ns, st.st_size)
        for p in folder.glob("*.h5")
        for st in (p.stat(),)
    }


def _interrupted(
    target: Path, before: dict[str, tuple[int, int, int]], e: KeyboardInterrupt
) -> int:
    """One line on stderr saying what a Ctrl-C (exit 130) or a SIGTERM (exit 143) left in
    `target`."""
    from parity.machinery._signals import interruption
    from parity.store._staging import JOURNAL_NAME

    if (target / JOURNAL_NAME).exists():
        state = (
            "the new goldens are complete but only partly moved into place: "
            "`parity repin --recover` (or the next repin) finishes the replace"
        )
    elif _snapshot(target) == before:
        state = f"the goldens in {target} are untouched"
    else:
        state = f"the new goldens were already in place in {target}"
    how, code = interruption(e)
    print(f"parity: repin {how}; {state}", file=sys.stderr, flush=True)
    return code


def run(args: argparse.Namespace, out: IO[str]) -> int:
    """Run `parity repin`; a Ctrl-C (or a SIGTERM) is one line saying what it left (exit
    130, 143), never a traceback: a repin replaces the goldens only once every group is
    produced."""
    config = config_of(args)
    before = _snapshot(config.goldens)
    try:
        return _run(config, args, out)
    except KeyboardInterrupt as e:
        return _interrupted(config.goldens, before, e)


def _run(config: Any, args: argparse.Namespace, out: IO[str]) -> int:
    from parity.machinery._launcher import ProducerRunError, UnknownGroupsError, UnusableClassError
    from parity.machinery._worktree import GitError
    from parity.run._repin import RepinError, RepinRun, repin

    target = config.goldens
    if args.recover:
        if args.base or args.classes_only or args.order or args.keep_worktree:
            raise CLIError("--recover only tidies the golden folder: pass it alone")
        return _recover(config, target, out)
    if args.classes_only:
        if args.base or args.keep_worktree:
            raise CLIError("--classes-only produces nothing: drop --base and --keep-worktree")
        return _reclass(config, target, args, out)
    if args.order:
        raise CLIError("--order rewrites the order of existing goldens: add --classes-only")
    if not args.base:
        raise CLIError("repin needs --base REV (the commit to pin at), or --classes-only")
    try:
        result = repin(
            args.base,
            producers=config.need_producers(),
            out_dir=target,
            repo=config.root,
            progress=report_progress,
            run=RepinRun.of(
                config, groups=split_groups(args.groups), keep_worktree=args.keep_worktree
            ),
        )
    except (GitError, UnusableClassError) as e:
        raise CLIError(str(e)) from None
    except UnknownGroupsError as e:  # a typo in --groups: its one line, no producer log
        raise CLIError(e.message) from None
    except ProducerRunError as e:
        if not e.output:  # nothing ran to log: its sentence says it all
            raise CLIError(f"repin failed: {e.head}") from None
        raise producer_failure(e, f"repin failed: {e.head.rstrip('.')}") from None
    except RepinError as e:
        raise CLIError(f"repin failed: {e}") from None
    out.write(f"pinned at {result.sha} into {result.out_dir}\n")
    for change in result.changes:
        out.write(change.describe() + "\n")
    return EXIT_OK


def _failed(e: Exception) -> tuple[str, str]:
    """What a `repin --classes-only` that failed says (a `ProducerRunError`'s head and the
    reason its output gives, else the `RepinError`'s text), and what its log holds."""
    from parity.machinery._launcher import ProducerRunError

    if not isinstance(e, ProducerRunError):
        return str(e), str(e)
    return (f"{e.head} {e.reason}" if e.output else e.head), e.output or e.head


def _recover(config: Any, target: Path, out: IO[str]) -> int:
    from parity.machinery._worktree import GitError
    from parity.run._repin import RepinError, recover_folder

    try:
        lines = recover_folder(target, repo=config.root)
    except (RepinError, GitError) as e:
        raise CLIError(f"repin --recover failed: {e}") from None
    out.write("\n".join(lines) + "\n" if lines else f"nothing to recover in {target}\n")
    return EXIT_OK


def _reclass(config: Any, target: Path, args: argparse.Namespace, out: IO[str]) -> int:
    from parity.machinery._launcher import ProducerRunError, UnknownGroupsError, UnusableClassError
    from parity.run._repin import RepinError, reclass

    try:
        done = reclass(
            producers=config.need_producers(),
            out_dir=target,
            repo=config.root,
            groups=split_groups(args.groups),
            progress=report_progress,
            src=config.src_relative(),
            reorder=args.order,
        )
    except UnusableClassError as e:
        raise CLIError(str(e)) from None
    except UnknownGroupsError as e:
        raise CLIError(e.message) from None
    except (ProducerRunError, RepinError) as e:
        raise CLIError(f"repin --classes-only failed: {_failed(e)[0]}") from None
    out.write(f"class map of the current producers written into {target}\n")
    for r in done:
        out.write(r.describe() + "\n")
    return EXIT_OK if not any(r.moved for r in done) else EXIT_FAIL
