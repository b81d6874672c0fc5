"""`parity check`: run the producers on the current tree and check them against the
goldens; the report table, and the report files on request."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from parity.commands._common import (
    EXIT_FAIL,
    EXIT_OK,
    CLIError,
    check_class_name,
    class_flag,
    config_flags,
    config_of,
    drift_flag,
    groups_flag,
    json_flag,
    override_flag,
    overrides_of,
    process_flags,
    producer_failure,
    report_flag,
    report_progress,
    require_goldens,
    split_groups,
    subparser,
)

if TYPE_CHECKING:
    from parity.report import ReportSession
    from parity.run._tree import TreeCheck

__all__ = ["add_parser", "run"]


def add_parser(sub: Any, help: str) -> None:
    """Add `check` to `sub` (argparse subparsers), `help` its line in `parity --help`."""
    check = subparser(
        sub,
        "check",
        help=help,
        description="Run the producers on the current tree in a fresh process (ISA cap and "
        "device count set before jax starts), compare each group with its golden file, print "
        "the table and the first divergence per group. Exit 0 pass, 1 some key breaks its "
        "class, 2 unusable input.",
    )
    groups_flag(check)
    json_flag(check)
    report_flag(check)
    check.add_argument(
        "--save-actual",
        metavar="DIR",
        help="write a failing group's arrays to DIR/<group>.h5, with the parity diff command "
        "that reproduces its table",
    )
    check.add_argument(
        "--baseline",
        choices=("auto", "require", "off"),
        help="the baseline, the reference off the pin's environment: auto (default, or "
        "[tool.parity] baseline) re-produces a group at its golden's base commit here, in a "
        "cache, where a key fails its pinned class, and compares the tree with it exactly; "
        "require does the same and exits 2 where the baseline cannot be re-produced, rather "
        "than pass a key by calibration alone (for CI); off compares with the goldens under "
        "their calibrated bounds alone",
    )
    origin_flag(check)
    override_flag(check)
    class_flag(check)
    drift_flag(check)
    config_flags(check)
    process_flags(check)


def origin_flag(parser: argparse.ArgumentParser) -> None:
    """`--origin {auto,off}`: name where a failure diverged, at its source line."""
    parser.add_argument(
        "--origin",
        choices=("auto", "off"),
        default="auto",
        help="auto (default): for a group that fails, record its program op by op on both "
        "sides (one more producer run here, one at the base, cached) and print the first "
        "operation that computes what the other never did, at its source line; off: do not "
        "(a failure then costs no more than a pass, but for a key of class op_by_op, whose "
        "proof needs the recordings either way)",
    )


def _write_reports(session: ReportSession, args: argparse.Namespace, out: IO[str]) -> None:
    try:
        if args.json_path:
            session.write_json(Path(args.json_path), session.to_json())
            out.write(f"JSON report written to {args.json_path}\n")
        if args.report:
            folder = Path(args.report)
            session.write_folder(folder, title="parity check")
            out.write(f"report written to {folder} (report.txt, report.json, index.html)\n")
    except OSError as e:
        raise CLIError(f"cannot write the report: {e}") from None


def _check_run_flags(args: argparse.Namespace, processes: int) -> None:
    """`--timeout`, `--coordinator` and `--process-id` against each other and against the
    run's `processes`: a `CLIError` naming the flag and what to pass instead."""
    if args.timeout is not None and args.timeout <= 0:
        raise CLIError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if (args.coordinator is None) != (args.process_id is None):
        raise CLIError(
            "--coordinator and --process-id go together (one process per host of a cluster); "
            "pass both, or neither to run every process here"
        )
    if args.process_id is not None and processes < 2:
        raise CLIError(
            f"--coordinator and --process-id need a run of several processes, got --processes "
            f"{processes}; pass --processes N (the number of hosts)"
        )
    if args.process_id is not None and not 0 <= args.process_id < processes:
        raise CLIError(
            f"--process-id {args.process_id} is not one of the run's processes 0..."
            f"{processes - 1} (--processes {processes})"
        )


def _request(args: argparse.Namespace) -> TreeCheck:
    """The check the flags ask for, each flag refused here (a `CLIError`) before anything
    runs."""
    from parity.machinery._worker import Place
    from parity.run._tree import TreeCheck

    config = config_of(args)
    overrides = overrides_of(args)
    if args.class_name is not None:
        check_class_name(args.class_name)
    require_goldens(config)
    _check_run_flags(args, config.processes)
    mode = args.baseline or config.baseline
    if mode == "require" and args.coordinator is not None:
        raise CLIError(
            "--baseline require cannot be met on a cluster (--coordinator): one host cannot "
            "re-produce a multi-host run's baseline; pass --baseline auto or off there"
        )
    return TreeCheck(
        config=config,
        groups=split_groups(args.groups),
        overrides=overrides,
        class_name=args.class_name,
        baseline=mode,
        origin=args.origin == "auto",
        save_actual=Path(args.save_actual).resolve() if args.save_actual else None,
        timeout=args.timeout,
        place=(
            None
            if args.coordinator is None
            else Place(
                process_id=args.process_id,
                processes=config.processes,
                coordinator=args.coordinator,
            )
        ),
    )


def run(args: argparse.Namespace, out: IO[str]) -> int:
    """`parity check`: the flags read into a `TreeCheck`, the tree checked
    (`parity.run._tree.check_tree`), then the report."""
    from parity.machinery._launcher import ProducerRunError, UnknownGroupsError, UnusableClassError
    from parity.report import ReportSession
    from parity.run._tree import check_tree

    request = _request(args)
    try:
        checked = check_tree(request, progress=report_progress)
    except UnknownGroupsError as e:
        raise CLIError(e.message) from None
    except UnusableClassError as e:
        raise CLIError(str(e)) from None
    except ProducerRunError as e:
        raise producer_failure(e, "the producers cannot run", args.report) from None
    if args.process_id:  # a host other than process 0's: its part is done
        out.write(
            f"process {args.process_id} of {request.config.processes} ran its part; process "
            "0's host checks the outputs and reports\n"
        )
        return EXIT_OK
    session = ReportSession.of(checked.results, checked.header())
    out.write(session.table())
    for r in checked.results:
        if r.saved:
            out.write(f"actual arrays of {r.name} written to {r.saved}; reproduce with:\n")
            out.write(f"  {r.command}\n")
    _write_reports(session, args, out)
    return EXIT_OK if checked.passed else EXIT_FAIL
