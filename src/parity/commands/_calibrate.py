"""`parity calibrate`: measure the harmless noise of the environment against each class's
bound, and record it in the golden files on request."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from parity.commands._common import (
    EXIT_OK,
    CLIError,
    class_flag,
    config_flags,
    config_of,
    groups_flag,
    json_flag,
    override_flag,
    overrides_of,
    producer_failure,
    report_progress,
    require_defined_groups,
    require_goldens,
    split_groups,
    subparser,
)
from parity.judge._floats import count

__all__ = ["add_parser", "run"]


def add_parser(sub: Any, help: str) -> None:
    """Add `calibrate` to `sub` (argparse subparsers), `help` its line in `parity --help`."""
    cal = subparser(
        sub,
        "calibrate",
        help=help,
        description="Run the producers on the current tree under benign perturbations of the "
        "pinned environment, each in a fresh process (every XLA CPU ISA cap this host supports, "
        "simulated device counts 1, 2, 4, process layouts such as 2x2, or the same environment "
        "again), compare every array with its golden under its class, and print per class the "
        "measured spread (max abs, max ulp, max abs over max|golden|) next to the bound, "
        "flagging classes below the noise (false alarms) or more than 100x above it (blunt). "
        "With --write, each key's spread per perturbation is recorded in its golden file: the "
        "bound of the 'calibrated' class, and of every key on a layout, ISA cap or processor "
        "other than the pinned one. Exit 0 when measured, 2 on unusable input.",
    )
    groups_flag(cal, of="golden")
    cal.add_argument(
        "--perturb",
        default="isa,devices",
        metavar="LIST",
        help="comma-separated: isa, isa=CAP, devices, devices=N, processes, processes=PxD, "
        "repeat (default isa,devices)",
    )
    json_flag(cal, what="the measurement")
    cal.add_argument(
        "--from-json",
        dest="from_json",
        metavar="FILE",
        help="read the measurement a calibrate --json run saved instead of running the producers "
        "(to --write it later: a full calibration takes many minutes)",
    )
    cal.add_argument(
        "--write",
        action="store_true",
        help="record each group's measurement, per key and perturbation, in its golden file's "
        "provenance (arrays unchanged; columns measured before are kept)",
    )
    override_flag(cal)
    class_flag(cal)
    config_flags(cal)


def _saved_calibration(path: Path, groups: Sequence[str], goldens: Mapping[str, Any]) -> Any:
    """A measurement saved by `calibrate --json`, limited to `groups`; every key of each
    group's golden must be in it (else the file is of other goldens)."""
    from parity.calibration._calibrate import Calibration

    try:
        cal = Calibration.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CLIError(f"--from-json {path}: not a calibrate --json file ({e})") from None
    for group in groups:
        measured = {k.key for k in cal.keys if k.group == group}
        missing = sorted(set(goldens[group]) - measured)
        if missing:
            raise CLIError(
                f"--from-json {path} does not measure group {group!r} in full "
                f"({count(len(missing), 'key')} missing, e.g. {missing[0]!r}); calibrate that "
                "group again"
            )
    keys = tuple(k for k in cal.keys if k.group in groups)
    return dataclasses.replace(cal, keys=keys)


def run(args: argparse.Namespace, out: IO[str]) -> int:
    from parity._environment import backend_of
    from parity._results import CheckError
    from parity.calibration._calibrate import calibrate, format_calibration
    from parity.calibration._perturbations import (
        available,
        backend_here,
        perturbations,
    )
    from parity.calibration._write import write_calibration
    from parity.check import GoldenDir
    from parity.machinery._launcher import ProducerRunError
    from parity.store import GoldenStoreError

    config = config_of(args)
    overrides = overrides_of(args, with_class=True)
    require_goldens(config)
    if args.write and overrides:
        raise CLIError(
            "--write records the measurement of the pinned classes in the golden files; "
            "drop --override and --class to record, or drop --write to measure a candidate "
            "class"
        )
    perturbs = [] if args.from_json else perturbations(split_groups(args.perturb), config)
    here, skipped = None, []
    if perturbs:  # what this backend cannot run is skipped, one line each
        here = backend_here()
        perturbs, skipped = available(perturbs, here)
        if not perturbs:
            raise CLIError(f"nothing to calibrate on this backend: {'; '.join(skipped)}")
    folder = GoldenDir(config.goldens)
    groups = split_groups(args.groups) or folder.groups()
    unknown = [g for g in groups if g not in folder.groups()]
    if unknown:
        require_defined_groups(config, unknown)  # a typo is not a group to pin
        raise CLIError(
            f"no golden file for group(s) {unknown} in {config.goldens} (it holds "
            f"{folder.groups()}); pin them first with `parity repin --base <REV> --groups ...`"
        )
    try:
        goldens = {g: folder.open(g) for g in groups}
        across = here is not None and any(
            backend_of(gf.provenance) != here.backend for gf in goldens.values()
        )
        if across and args.write:
            folder.close()
            raise CLIError(
                f"the goldens were pinned on another backend than this one ({here}): their "
                "calibration records that backend's noise, so this one's is measured and "
                "printed here, never written; drop --write"
            )
        if args.from_json:
            cal = _saved_calibration(Path(args.from_json), groups, goldens)
        else:
            cal = calibrate(
                config,
                goldens,
                perturbs,
                overrides=overrides,
                progress=report_progress,
                skipped=skipped,
                reference_here=across,
            )
    except (GoldenStoreError, CheckError) as e:
        folder.close()
        raise CLIError(str(e)) from None
    except ProducerRunError as e:
        folder.close()
        raise producer_failure(e, "the producers cannot run") from None
    except KeyError as e:  # an unknown or incomplete class in an override or the pinned map
        folder.close()
        raise CLIError(str(e)) from None
    out.write(format_calibration(cal))
    if args.json_path:
        try:
            Path(args.json_path).write_text(json.dumps(cal.to_dict(), indent=1))
        except OSError as e:
            raise CLIError(f"cannot write {args.json_path}: {e}") from None
        out.write(f"JSON written to {args.json_path}\n")
    if args.write:
        for group in groups:
            path = write_calibration(cal, goldens[group], group)
            out.write(f"calibration recorded in {path} (provenance 'calibration')\n")
    folder.close()
    return EXIT_OK
