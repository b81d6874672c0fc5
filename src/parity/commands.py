"""`parity repin`, `parity check`, `parity bisect` and `parity calibrate`: the commands
that run producers.

Thin layers over `parity.repin`, `parity.runner` (which checks through `parity.check`),
`parity.bisect` and `parity.calibrate`, configured by `[tool.parity]` (`parity.config`);
each key can be overridden by the flag of the same name (`--goldens`, `--producers`,
`--src`, `--isa`, `--devices`, `--processes`). Exit codes as every parity command: 0 pass,
1 some key breaks its class, 2 a usage or input error, printed as one `parity: error: ...`
line by `parity.cli.main`.

Importing this module imports neither jax nor h5py; each command imports what it needs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from parity.config import ConfigError, ParityConfig, load_config

__all__ = ["COMMANDS", "add_parsers", "run_command"]

_EXIT_OK, _EXIT_FAIL, _EXIT_UNUSABLE = 0, 1, 2


class CommandError(Exception):
    """A one-line usage or input error (exit 2)."""


def _groups(text: str | None) -> list[str]:
    return [g.strip() for g in (text or "").split(",") if g.strip()]


def _config_flags(p: argparse.ArgumentParser, *, goldens: bool = True) -> None:
    g = p.add_argument_group("settings (override [tool.parity] in pyproject.toml)")
    if goldens:
        g.add_argument("--goldens", metavar="DIR", help="golden folder (default: goldens)")
    g.add_argument("--producers", metavar="FILE", help="producers file (GROUPS, CLASS_MAP)")
    g.add_argument(
        "--src", metavar="DIR[,DIR]", help="import root(s) of the code under test (default: src)"
    )
    g.add_argument("--isa", metavar="CAP", help="XLA CPU ISA cap before jax starts (default AVX2)")
    g.add_argument(
        "--devices", type=int, metavar="N", help="simulated CPU devices per process (default 1)"
    )


def _process_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("multi-process runs (JAX's distributed runtime)")
    g.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="run the producers as N processes of one distributed run, --devices each, "
        "outputs gathered to process 0 (default 1)",
    )
    g.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="with --processes: seconds the run may take before every worker is stopped "
        "(default 1800); a worker that fails stops the others at once",
    )
    g.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="on a cluster: where process 0 listens (host 0's address); start the same "
        "command on every host with its --process-id (default: this host, a free port)",
    )
    g.add_argument(
        "--process-id",
        type=int,
        metavar="I",
        help="on a cluster: this host's process id, 0 to N-1; process 0 checks and reports",
    )


def _override_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="PATTERN=CLASS",
        help="check keys matching PATTERN under CLASS, before the pinned class map (repeatable)",
    )


def add_parsers(sub: Any) -> None:
    """Add the `repin`, `check`, `bisect` and `calibrate` subcommands to `sub` (argparse
    subparsers)."""
    fmt = argparse.RawDescriptionHelpFormatter
    repin = sub.add_parser(
        "repin",
        help="pin goldens at a commit (a temporary worktree; your checkout is untouched)",
        description="Run the producers (current tree) against the code of commit REV in a "
        "temporary worktree, in a fresh process, and write one golden file per group; "
        "print what changed. Your working tree, index and branches are not touched.",
        formatter_class=fmt,
    )
    repin.add_argument(
        "--base", metavar="REV", help="commit to pin at (required unless --classes-only)"
    )
    repin.add_argument(
        "--classes-only",
        action="store_true",
        help="give the existing goldens the producers' current CLASS_MAP without producing: "
        "arrays, order and provenance stay byte for byte (a class decision on main)",
    )
    repin.add_argument("--groups", metavar="a,b", help="a subset of the producer groups")
    repin.add_argument(
        "--out", metavar="DIR", help="golden folder (default: [tool.parity] goldens)"
    )
    repin.add_argument("--keep-worktree", action="store_true", help="leave the worktree")
    _config_flags(repin, goldens=False)

    check = sub.add_parser(
        "check",
        help="run the producers on the current tree and check them against the goldens",
        description="Run the producers on the current tree in a fresh process (ISA cap and "
        "device count set before jax starts), compare each group with its golden file, print "
        "the table and the first divergence per group. Exit 0 pass, 1 some key breaks its "
        "class, 2 unusable input.",
        formatter_class=fmt,
    )
    check.add_argument("--groups", metavar="a,b", help="a subset of the producer groups")
    check.add_argument("--json", dest="json_path", metavar="FILE", help="write JSON here")
    check.add_argument(
        "--report", metavar="DIR", help="write report.txt, report.json, index.html to DIR"
    )
    check.add_argument(
        "--save-actual", metavar="DIR", help="write a failing group's arrays to DIR/<group>.h5"
    )
    _override_flag(check)
    _config_flags(check)
    _process_flags(check)

    bisect = sub.add_parser(
        "bisect",
        help="find the first commit between GOOD and BAD that breaks a check",
        description="Pin goldens at GOOD into a temporary folder, confirm GOOD passes and BAD "
        "fails, then binary-search the first-parent commits between them, each checked in a "
        "temporary worktree. A commit whose producers cannot run is skipped, never counted as "
        "bad. Your checkout, goldens and `git bisect` state are not touched. Exit 0 the first "
        "bad commit is named; 1 it lies among commits that could not run (listed); 2 GOOD "
        "does not pass, BAD does not fail, or unusable input.",
        formatter_class=fmt,
    )
    bisect.add_argument("good", metavar="GOOD", help="a commit whose outputs are right")
    bisect.add_argument("bad", metavar="BAD", help="a later commit that fails the check")
    bisect.add_argument("--groups", metavar="a,b", help="a subset of the producer groups")
    bisect.add_argument("--json", dest="json_path", metavar="FILE", help="write steps and answer")
    _override_flag(bisect)
    _config_flags(bisect, goldens=False)

    cal = sub.add_parser(
        "calibrate",
        help="measure the environment's harmless noise against each class's bound",
        description="Run the producers on the current tree under benign perturbations of the "
        "pinned environment, each in a fresh process (every XLA CPU ISA cap this host supports, "
        "simulated device counts 1, 2, 4, process layouts such as 2x2, or the same environment "
        "again), compare every array with its golden under its class, and print per class the "
        "measured spread (max abs, max ulp, max abs over max|golden|) next to the bound, "
        "flagging classes below the noise (false alarms) or more than 100x above it (blunt). "
        "With --write, each key's spread per perturbation is recorded in its golden file: the "
        "bound of the 'calibrated' class, and of every key on a layout, ISA cap or processor "
        "other than the pinned one. Exit 0 when measured, 2 on unusable input.",
        formatter_class=fmt,
    )
    cal.add_argument("--groups", metavar="a,b", help="a subset of the golden groups")
    cal.add_argument(
        "--perturb",
        default="isa,devices",
        metavar="LIST",
        help="comma-separated: isa, isa=CAP, devices, devices=N, processes, processes=PxD, "
        "repeat (default isa,devices)",
    )
    cal.add_argument("--json", dest="json_path", metavar="FILE", help="write the measurement")
    cal.add_argument(
        "--from-json",
        dest="from_json",
        metavar="FILE",
        help="take the measurement a calibrate --json run saved instead of running the producers "
        "(to --write it later: a full calibration takes many minutes)",
    )
    cal.add_argument(
        "--write",
        action="store_true",
        help="record each group's measurement, per key and perturbation, in its golden file's "
        "provenance (arrays unchanged; columns measured before are kept)",
    )
    _override_flag(cal)
    _config_flags(cal)


COMMANDS = ("repin", "check", "bisect", "calibrate")


def _config(args: argparse.Namespace) -> ParityConfig:
    keys = ("goldens", "producers", "src", "isa", "devices", "processes")
    flags = {k: getattr(args, k, None) for k in keys}
    config = load_config().with_overrides(**flags)
    # Before any other complaint: outside a project, "golden folder does not exist" or
    # "no producers file" would send the user to the wrong fix.
    config.need_table()
    return config


def _overrides(args: argparse.Namespace) -> list[tuple[str, str]]:
    from parity.cli import CLIError, parse_override

    try:
        return [parse_override(o) for o in args.override]
    except CLIError as e:
        raise CommandError(str(e)) from None


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _keep_log(output: str) -> str:
    """Write a failed producer run's output to a file that outlives the command."""
    with tempfile.NamedTemporaryFile(
        "w", prefix="parity-producers-", suffix=".log", delete=False
    ) as f:
        f.write(output)
    return f.name


# --------------------------------------------------------------------------- repin


def _cmd_repin(args: argparse.Namespace, out: IO[str]) -> int:
    from parity.repin import RepinError, repin
    from parity.runner import failure_reason
    from parity.worktree import GitError

    config = _config(args)
    target = Path(args.out).resolve() if args.out else config.goldens
    if args.classes_only:
        if args.base or args.keep_worktree:
            raise CommandError("--classes-only produces nothing: drop --base and --keep-worktree")
        return _reclass(config, target, args, out)
    if not args.base:
        raise CommandError("repin needs --base REV (the commit to pin at), or --classes-only")
    try:
        result = repin(
            args.base,
            producers=config.need_producers(),
            out_dir=target,
            repo=config.root,
            device_count=config.devices,
            isa_cap=config.isa,
            groups=_groups(args.groups),
            keep_worktree=args.keep_worktree,
            progress=_progress,
            src=config.src_relative(),
        )
    except GitError as e:
        raise CommandError(str(e)) from None
    except RepinError as e:
        text = str(e)
        head, _, output = text.partition(" Producer output:\n")
        why = failure_reason(output) if output else ""
        log = _keep_log(output or text)
        raise CommandError(f"repin failed: {head} {why} (producer output: {log})") from None
    out.write(f"pinned at {result.sha} into {result.out_dir}\n")
    for change in result.changes:
        out.write(change.describe() + "\n")
    return _EXIT_OK


def _reclass(config: Any, target: Path, args: argparse.Namespace, out: IO[str]) -> int:
    from parity.repin import RepinError, reclass
    from parity.runner import failure_reason

    try:
        done = reclass(producers=config.need_producers(), out_dir=target, repo=config.root,
                       groups=_groups(args.groups), progress=_progress,
                       src=config.src_relative())  # fmt: skip
    except RepinError as e:
        text = str(e)
        head, _, output = text.partition(" Producer output:\n")
        why = failure_reason(output) if output else ""
        raise CommandError(f"repin --classes-only failed: {head} {why}".strip()) from None
    out.write(f"class map of the current producers written into {target}\n")
    for r in done:
        out.write(r.describe() + "\n")
    return _EXIT_OK if not any(r.moved for r in done) else _EXIT_FAIL


# --------------------------------------------------------------------------- check


def _write_reports(
    results: Sequence[Any], header: dict[str, str], args: argparse.Namespace, out: IO[str]
) -> None:
    from parity.report import format_table, to_json, write_html

    merged = _merged(results)
    checks = [(r.name, r.comparison) for r in results]

    def doc() -> dict[str, Any]:
        d = to_json(merged, header=header, checks=checks)
        for entry, r in zip(d["checks"], results, strict=True):
            entry |= {"group": r.group, "passed": r.passed, "produce_s": r.produce_s,
                      "load_s": r.load_s, "compare_s": r.compare_s, "saved": r.saved}  # fmt: skip
        return d

    try:
        if args.json_path:
            Path(args.json_path).write_text(json.dumps(doc(), indent=1, sort_keys=True))
            out.write(f"JSON report written to {args.json_path}\n")
        if args.report:
            folder = Path(args.report)
            folder.mkdir(parents=True, exist_ok=True)
            text = format_table(merged, header=header, checks=checks)
            (folder / "report.txt").write_text(text + "\n")
            (folder / "report.json").write_text(json.dumps(doc(), indent=1, sort_keys=True))
            write_html(folder, merged, header=header, checks=checks, title="parity check")
            out.write(f"report written to {folder} (report.txt, report.json, index.html)\n")
    except OSError as e:
        raise CommandError(f"cannot write the report: {e}") from None


def _merged(results: Sequence[Any]) -> Any:
    import dataclasses

    from parity.judge.compare import Comparison

    return Comparison(
        tuple(
            dataclasses.replace(f, key=f"{r.name}/{f.key}")
            for r in results
            for f in r.comparison.findings
        )
    )


def _require_goldens(config: Any) -> None:
    """A `CommandError` unless the configured golden folder exists."""
    if not config.goldens.is_dir():
        raise CommandError(
            f"golden folder {config.goldens} does not exist; pin it first with "
            "`parity repin --base <REV>`"
        )


def _cmd_check(args: argparse.Namespace, out: IO[str]) -> int:
    from parity.check import CheckError, GoldenDir, merged_header_lines
    from parity.report import format_table
    from parity.runner import ProducersFailed, check_produced, produce

    config = _config(args)
    overrides = _overrides(args)
    _require_goldens(config)
    if args.timeout is not None and args.timeout <= 0:
        raise CommandError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if (args.coordinator is None) != (args.process_id is None):
        raise CommandError(
            "--coordinator and --process-id go together (one process per host of a cluster); "
            "pass both, or neither to run every process here"
        )
    if args.process_id is not None and config.processes < 2:
        raise CommandError(
            f"--coordinator and --process-id need a run of several processes, got --processes "
            f"{config.processes}; pass --processes N (the number of hosts)"
        )
    if args.process_id is not None and not 0 <= args.process_id < config.processes:
        raise CommandError(
            f"--process-id {args.process_id} is not one of the run's processes 0..."
            f"{config.processes - 1} (--processes {config.processes})"
        )
    try:
        produced = produce(
            config.root,
            config,
            groups=_groups(args.groups),
            progress=_progress,
            timeout=args.timeout,
            coordinator=args.coordinator,
            process_id=args.process_id,
        )
    except ProducersFailed as e:
        log = _keep_log(e.output)
        if e.tail:  # a worker's last lines, before the one-line verdict
            print(f"parity: last output lines:\n{e.tail}", file=sys.stderr, flush=True)
        raise CommandError(f"the producers cannot run: {e.reason} (output: {log})") from None
    if args.process_id:  # a host other than process 0's: its part is done
        out.write(
            f"process {args.process_id} of {config.processes} ran its part; process 0's host "
            "checks the outputs and reports\n"
        )
        return _EXIT_OK
    save = Path(args.save_actual).resolve() if args.save_actual else None
    try:
        with GoldenDir(config.goldens) as goldens:
            results = check_produced(
                produced, goldens, overrides=overrides, save_actual=save, node="parity check"
            )
    except CheckError as e:
        raise CommandError(str(e)) from None
    header = {
        "goldens": str(config.goldens),
        "producers": str(config.producers),
        "src": ", ".join(str(s) for s in config.src),
        "layout": str(produced.layout),
        "xla_flags": produced.xla_flags,
        "produce": f"{produced.seconds:.1f}s in "
        + ("a fresh process" if produced.layout.processes == 1 else "fresh processes"),
    }
    header |= merged_header_lines(results, header)
    for r in results:
        if r.header.get("base_sha"):
            header.setdefault("base_sha", r.header["base_sha"])
    merged = _merged(results)
    checks = [(r.name, r.comparison) for r in results]
    out.write(format_table(merged, header=header, checks=checks))
    for r in results:
        if r.saved:
            out.write(f"obtained arrays of {r.name} written to {r.saved}; reproduce with:\n")
            out.write(f"  {r.command}\n")
    _write_reports(results, header, args, out)
    return _EXIT_OK if all(r.passed for r in results) else _EXIT_FAIL


# --------------------------------------------------------------------------- bisect


def _cmd_bisect(args: argparse.Namespace, out: IO[str]) -> int:
    from parity.bisection import BisectError, bisect

    config = _config(args)
    overrides = _overrides(args)

    def progress(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    t0 = time.perf_counter()
    try:
        result = bisect(
            args.good,
            args.bad,
            config=config,
            groups=_groups(args.groups),
            overrides=overrides,
            progress=progress,
        )
    except BisectError as e:
        raise CommandError(str(e)) from None
    if args.json_path:
        doc = result.to_dict() | {"seconds": round(time.perf_counter() - t0, 2)}
        try:
            Path(args.json_path).write_text(json.dumps(doc, indent=1))
        except OSError as e:
            raise CommandError(f"cannot write {args.json_path}: {e}") from None
    for s in result.skipped:
        out.write(f"skipped (could not run): {s.sha} {s.detail}\n")
    fb = result.first_bad
    if result.status == "found" and fb is not None:
        out.write(f"first bad commit: {fb.sha}\n")
        out.write(f"  group {fb.group}, key {fb.key}, class {fb.class_name}  ({fb.subject})\n")
        return _EXIT_OK
    if result.status == "ambiguous" and fb is not None:
        out.write(
            "the first bad commit is one of these (the others could not run the producers):\n"
        )
        out.writelines(f"  {sha}\n" for sha in result.candidates)
        out.write(f"  first known bad: group {fb.group}, key {fb.key}, class {fb.class_name}\n")
        return _EXIT_FAIL
    good, bad = result.good[:12], result.bad[:12]
    raise CommandError(
        {
            "good_fails": f"GOOD {good} does not pass against goldens pinned at itself (its "
            "outputs are not reproducible: check the producers for randomness or threads)",
            "bad_passes": f"BAD {bad} passes against goldens pinned at GOOD {good}: nothing "
            "broke between them for these groups; pick a BAD that fails `parity check`",
            "cannot_run": f"the producers cannot run at GOOD {good} or BAD {bad} (see the step "
            "above); pick commits that have what the producers need",
        }[result.status]
    )


# --------------------------------------------------------------------------- calibrate


def _saved_calibration(path: Path, groups: Sequence[str], goldens: Mapping[str, Any]) -> Any:
    """A measurement saved by `calibrate --json`, limited to `groups`; every key of each
    group's golden must be in it (else the file is of other goldens)."""
    from parity.calibrate import Calibration

    try:
        cal = Calibration.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CommandError(f"--from-json {path}: not a calibrate --json file ({e})") from None
    for group in groups:
        measured = {k.key for k in cal.keys if k.group == group}
        missing = sorted(set(goldens[group]) - measured)
        if missing:
            raise CommandError(
                f"--from-json {path} does not measure group {group!r} in full ({len(missing)} "
                f"key(s) missing, e.g. {missing[0]!r}); calibrate that group again"
            )
    keys = tuple(k for k in cal.keys if k.group in groups)
    return dataclasses.replace(cal, keys=keys)


def _cmd_calibrate(args: argparse.Namespace, out: IO[str]) -> int:
    from parity.calibrate import CalibrationError, calibrate, format_calibration, perturbations
    from parity.calibrate import record as record_calibration
    from parity.check import CheckError, GoldenDir
    from parity.runner import ProducersFailed
    from parity.store import GoldenStoreError

    config = _config(args)
    overrides = _overrides(args)
    _require_goldens(config)
    if args.write and overrides:
        raise CommandError(
            "--write records the measurement of the pinned classes in the golden files; "
            "drop --override to record, or drop --write to measure a candidate class"
        )
    try:
        perturbs = [] if args.from_json else perturbations(_groups(args.perturb), config)
    except CalibrationError as e:
        raise CommandError(str(e)) from None
    folder = GoldenDir(config.goldens)
    groups = _groups(args.groups) or folder.groups()
    unknown = [g for g in groups if g not in folder.groups()]
    if unknown:
        raise CommandError(
            f"no golden file for group(s) {unknown} in {config.goldens} (it holds "
            f"{folder.groups()}); pin them first with `parity repin --base <REV> --groups ...`"
        )
    try:
        goldens = {g: folder.open(g) for g in groups}
        if args.from_json:
            cal = _saved_calibration(Path(args.from_json), groups, goldens)
        else:
            cal = calibrate(config, goldens, perturbs, overrides=overrides, progress=_progress)
    except (GoldenStoreError, CheckError) as e:
        folder.close()
        raise CommandError(str(e)) from None
    except ProducersFailed as e:
        folder.close()
        log = _keep_log(e.output)
        raise CommandError(f"the producers cannot run: {e.reason} (output: {log})") from None
    except KeyError as e:  # an unknown or incomplete class in an override or the pinned map
        folder.close()
        raise CommandError(str(e)) from None
    out.write(format_calibration(cal))
    if args.json_path:
        try:
            Path(args.json_path).write_text(json.dumps(cal.to_dict(), indent=1))
        except OSError as e:
            raise CommandError(f"cannot write {args.json_path}: {e}") from None
        out.write(f"JSON written to {args.json_path}\n")
    if args.write:
        for group in groups:
            path = record_calibration(cal, goldens[group], group)
            out.write(f"calibration recorded in {path} (provenance 'calibration')\n")
    folder.close()
    return _EXIT_OK


def run_command(args: argparse.Namespace, out: IO[str]) -> int:
    """Run `args.command` (one of `COMMANDS`).

    **Returns:** the exit code. Raises `CommandError` or `ConfigError` for input errors
    (one line; `parity.cli.main` prints it and exits 2).
    """
    command = {
        "repin": _cmd_repin,
        "check": _cmd_check,
        "bisect": _cmd_bisect,
        "calibrate": _cmd_calibrate,
    }[args.command]
    return command(args, out)


__all__ += ["CommandError", "ConfigError"]
