"""`parity baseline build|list|clear`: the cache of baselines, the golden groups re-produced
at their base commit in this environment, which `parity check` and the pytest plugin
compare with off the pin's environment (`parity.run._baseline`)."""

from __future__ import annotations

import argparse
from typing import IO, TYPE_CHECKING, Any

from parity.commands._common import (
    EXIT_OK,
    CLIError,
    config_flags,
    config_of,
    groups_flag,
    processes_flag,
    report_progress,
    require_goldens,
    split_groups,
    subparser,
)
from parity.judge._floats import count

if TYPE_CHECKING:
    from parity.run._baseline import BaselineBuilder

__all__ = ["add_parser", "run"]


def add_parser(sub: Any, help: str) -> None:
    """Add `baseline` to `sub` (argparse subparsers), `help` its line in `parity --help`."""
    p = subparser(
        sub,
        "baseline",
        help=help,
        description="Off the environment the goldens were pinned in, `parity check` and the "
        "pytest plugin re-produce a failing group at its golden's base commit here (a "
        "temporary worktree, a fresh process with this layout and ISA cap), the baseline, and "
        "compare the tree with it exactly. Baselines are cached per (base commit, environment, "
        "producers, group), in PARITY_BASELINE_CACHE, else [tool.parity] baseline_cache, "
        "else the user's cache folder. `build` fills the cache ahead of a check (progress on "
        "stderr), `list` shows it, `clear` empties it.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    build = actions.add_parser(
        "build",
        help="re-produce every golden group (or --groups) at its base commit here",
        description="Re-produce every golden group (or --groups) at the base commit its "
        "golden records, with the configured layout and ISA cap (--devices, --processes, "
        "--isa), into the cache, replacing what it held for this environment.",
    )
    groups_flag(build)
    config_flags(build)
    processes_flag(build)
    actions.add_parser("list", help="list the cached baselines")
    clear = actions.add_parser("clear", help="remove the cached baselines")
    clear.add_argument("--base", metavar="SHA", help="only those of this base commit (a prefix)")


def run(args: argparse.Namespace, out: IO[str]) -> int:
    from parity.machinery._config import load_config
    from parity.run._baseline import BaselineBuilder, BaselineCache, cache_dir

    if args.action == "list":
        cache = BaselineCache(cache_dir(load_config()))
        entries = cache.entries()
        out.write(f"{count(len(entries), 'cached baseline')} in {cache.folder}\n")
        for e in entries:
            out.write(f"  {e.line()}\n")
        return EXIT_OK
    if args.action == "clear":
        cache = BaselineCache(cache_dir(load_config()))
        n = cache.clear(sha=args.base)
        out.write(f"removed {count(n, 'cached baseline')} from {cache.folder}\n")
        return EXIT_OK
    return _build(args, out, BaselineBuilder(config_of(args), progress=report_progress))


def _build(args: argparse.Namespace, out: IO[str], builder: BaselineBuilder) -> int:
    from parity._results import BaselineUnavailable
    from parity.check import GoldenDir
    from parity.store._provenance import digest_sources

    config = builder.config
    require_goldens(config)
    wanted = split_groups(args.groups)
    by_sha: dict[str, list[str]] = {}
    with GoldenDir(config.goldens) as goldens:
        names = wanted or goldens.groups()
        for group in names:
            sha = goldens.open(group).provenance.base_sha or ""
            if not sha:
                raise CLIError(f"golden group {group!r} records no base commit; repin it")
            by_sha.setdefault(sha, []).append(group)
    digest = digest_sources([config.need_producers()])
    for sha, groups in by_sha.items():
        try:
            built = builder.build(groups, sha, digest=digest)
        except BaselineUnavailable as e:
            raise CLIError(f"cannot re-produce {', '.join(groups)}: {e}") from None
        for group, baseline in built.items():
            took = f"{baseline.seconds:.1f}s"
            out.write(f"{group}: base {sha[:12]} re-produced ({took} a group) -> {baseline.path}\n")
    return EXIT_OK
