"""`parity diff ACTUAL GOLDEN`: compare every array of two HDF5 files (parity-written or
plain h5py files) and print the report table.

A diff is a check of a file (`parity.check.check_file`, the core a check of a golden group
goes through): GOLDEN is the golden file, with its pinned classes, order, calibration and
provenance; ACTUAL's provenance is the environment judged, so that the drift policy and
the calibrated judgement of another environment apply as in the check that saved ACTUAL
(`--save-actual`). A file that records no provenance (a plain HDF5 file) is not compared
for drift. What a diff adds is reading: both files by role (a read error names ACTUAL or
GOLDEN) and in chunks (`--memory`).

**Classes.** Each key of a diff gets its class by the one precedence of `parity.check`
(the same as the pytest plugin's): `--override PATTERN=CLASS` rules first, then `--class
NAME` (every key), then the GOLDEN's pinned class map (and the class recorded with the
array for a key the map does not cover), then `bitwise` (plain HDF5 files record neither,
so they compare bitwise).

**Order.** Keys are walked in the GOLDEN's pinned forward order; keys without a place
(order -1, plain files, keys only in ACTUAL) come after, by name.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from parity._environment import PolicyMode, environment_difference
from parity._results import CheckError
from parity.check import check_file
from parity.commands._common import (
    EXIT_FAIL,
    EXIT_OK,
    CLIError,
    check_class_name,
    class_flag,
    drift_flag,
    json_flag,
    one_line,
    override_flag,
    overrides_of,
    report_flag,
    subparser,
)
from parity.commands._files import opened, read_errors
from parity.judge._chunks import DEFAULT_BUDGET, Block
from parity.judge._compare import Comparison
from parity.judge._floats import count
from parity.report._session import ReportSession
from parity.store import GoldenFile

__all__ = ["DiffResult", "add_parser", "run", "run_diff"]


@dataclass(frozen=True)
class DiffResult:
    """What `run_diff` found.

    **Fields:**

    - `comparison`: one finding per key of either file, in the GOLDEN's forward order.
    - `header`: lines for the report header: both paths, where the classes came from, then
      the check's (`parity.check.check_file`): the GOLDEN's base SHA, ACTUAL's environment
      drift against GOLDEN's, the order, the calibration and the reference.
    """

    comparison: Comparison
    header: dict[str, str]

    @property
    def exit_code(self) -> int:
        """`EXIT_OK` if every array holds its class, else `EXIT_FAIL`."""
        return EXIT_OK if self.comparison.passed else EXIT_FAIL


def _mebibytes(text: str) -> int:
    """`--memory`: a positive whole number of MiB."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"expected a positive whole number of MiB (such as 512), got {text!r}"
        )
    return value


def _load(gf: GoldenFile, key: str, role: str) -> np.ndarray:
    """`gf[key]` with the checksum verified; store and HDF5 read errors become `CLIError`."""
    with read_errors(gf, key, role):
        return gf[key]


class _RoleSource:
    """`gf.source(key)` whose read errors become a `CLIError` naming the file's role."""

    def __init__(self, gf: GoldenFile, key: str, role: str):
        self._gf, self._key, self._role = gf, key, role
        with read_errors(gf, key, role):
            self._src = gf.source(key)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._src.shape

    @property
    def dtype(self) -> np.dtype:
        return self._src.dtype

    def read(self, block: Block) -> np.ndarray:
        with read_errors(self._gf, self._key, self._role):
            return self._src.read(block)

    def finish(self) -> None:
        with read_errors(self._gf, self._key, self._role):
            self._src.finish()


def _describe(gf: GoldenFile) -> str:
    kind = f"parity schema {gf.schema_version}" if gf.is_parity_file else "plain HDF5"
    return f"{gf.path} ({kind}, {count(len(gf), 'array')})"


def _classes_source(
    gf: GoldenFile, class_name: str | None, overrides: Sequence[tuple[str, str]]
) -> str:
    """Where the keys' classes came from, for the header."""
    with read_errors(gf, None, "GOLDEN"):
        recorded = any(gf.info(k).class_name for k in gf)
    if class_name is not None:
        source = f"--class {class_name} for every key"
    elif gf.class_map_json or recorded:
        source = "pinned in GOLDEN (its class map, else the array's class, else bitwise)"
    else:
        source = "bitwise (GOLDEN records no classes)"
    if overrides:
        source = f"--override {', '.join(f'{p}={c}' for p, c in overrides)}; then {source}"
    return source


def _side(gf: GoldenFile, key: str, role: str, other: GoldenFile) -> Any:
    """`gf`'s array `key`, as the check reads it: a `Source` read in chunks where both files
    hold the key; loaded whole (checksum verified) where only `gf` does, so that a damaged
    array is an input error there too. Read errors name `role`."""
    return _RoleSource(gf, key, role) if key in other else _load(gf, key, role)


def run_diff(
    actual: str | Path,
    golden: str | Path,
    *,
    class_name: str | None = None,
    overrides: Sequence[tuple[str, str]] = (),
    budget: int = DEFAULT_BUDGET,
    drift_mode: PolicyMode | Callable[[], PolicyMode] = "warn",
    stack: Sequence[str] = (),
    rename: Sequence[str] = (),
) -> DiffResult:
    """Compare every array of the file `actual` against the file `golden`: a check
    (`parity.check.check_file`) with GOLDEN as the golden file (its pinned classes, forward
    order, calibration and provenance) and ACTUAL's provenance as the environment judged.

    Arrays are read one key at a time and each in chunks of at most `budget` bytes of
    working memory (`parity.judge._chunks`; both checksums verified over the chunks), so memory
    stays bounded whatever the file sizes.

    **Arguments:**

    - `actual`: the HDF5 file the changed code produced (parity-written or plain).
    - `golden`: the pinned HDF5 file; its recorded classes, class map and forward order are
      used.
    - `class_name`: a registry class for every key, before the golden's pinned map.
    - `overrides`: `(pattern, class)` rules tried before everything else.
    - `budget`: bytes one array comparison may hold at once (default 512 MiB).
    - `drift_mode`: the bitwise drift policy (`parity._environment`), over ACTUAL's
      provenance against GOLDEN's; a file that records none is not compared. A callable is
      asked only where the two environments differ in a way that can move bits (the
      command line's reads `[tool.parity]`, which an identical environment never needs).
    - `stack`: stack rules (`"blocks.{i}"`): a stacked key of ACTUAL is compared row by row
      with the per-layer keys of GOLDEN it replaces (`parity.judge._stacking`).
    - `rename`: rename rules (`"encoder=backbone"`): ACTUAL's `backbone.<rest>` is compared
      with GOLDEN's `encoder.<rest>` (`parity.judge._renames`).

    **Returns:** a `DiffResult`. Raises `CLIError` for unusable input: a missing, truncated,
    corrupt or unsafe file, an unknown class, or arrays parity cannot compare.
    """
    if class_name is not None:
        check_class_name(class_name)
    for pattern, name in overrides:
        check_class_name(name, where=f"--override '{pattern}={name}'")
    with opened(golden, "GOLDEN") as gf, opened(actual, "ACTUAL") as af:
        source = _classes_source(gf, class_name, overrides)
        with read_errors(af, None, "ACTUAL"):
            arrays = {k: _side(af, k, "ACTUAL", gf) for k in af}
        # A file that records no provenance (a plain HDF5 file) is not compared.
        pinned, current = (None if f.provenance.is_empty else f.provenance for f in (gf, af))
        difference = environment_difference(pinned, current)
        if callable(drift_mode):
            drift_mode = drift_mode() if difference.moves_bits else "warn"
        try:
            result = check_file(
                arrays,
                gf,
                current=af.provenance,
                difference=difference,
                class_map=class_name,
                overrides=overrides,
                drift_mode=drift_mode,
                budget=budget,
                golden_source=lambda key: _side(gf, key, "GOLDEN", af),
                stack=stack,
                rename=rename,
            )
        except CheckError as e:
            raise CLIError(one_line(str(e))) from None
        header = {"actual": _describe(af), "golden": _describe(gf), "classes": source}
        header |= {k: v for k, v in result.header.items() if k != "golden"}
    return DiffResult(result.comparison, header)


_DIFF_DESCRIPTION = """\
Compare every array of ACTUAL against GOLDEN and print a table per tolerance class, the
first divergence in forward order and every failing key.

Each key's class: the first --override PATTERN=CLASS that matches, else --class NAME,
else GOLDEN's pinned class map (else the class recorded with the array), else bitwise:
the same precedence as the pytest plugin's. Both files may be written by
parity (checksums are verified) or be plain h5py files (every dataset is a key, its path
with '/' -> '.').

Memory stays within --memory MiB per array whatever the files' sizes: an array larger
than that is read and compared in chunks along its leading axes, with the same figures
(max |a-b|, max ulp, worst index, first differing element) as a whole-array comparison.
"""


def add_parser(sub: Any, help: str) -> None:
    """Add `diff` to `sub` (argparse subparsers), `help` its line in `parity --help`."""
    diff = subparser(
        sub,
        "diff",
        help=help,
        description=_DIFF_DESCRIPTION,
    )
    diff.add_argument("actual", metavar="ACTUAL", help="HDF5 file from the changed code")
    diff.add_argument("golden", metavar="GOLDEN", help="pinned HDF5 file to compare against")
    override_flag(diff)
    class_flag(diff)
    drift_flag(diff)
    diff.add_argument(
        "--memory",
        type=_mebibytes,
        default=DEFAULT_BUDGET // 2**20,
        metavar="MIB",
        help=(
            "working memory of one array comparison, in MiB (default "
            f"{DEFAULT_BUDGET // 2**20}); larger arrays are compared in chunks"
        ),
    )
    diff.add_argument(
        "--stack",
        action="append",
        default=[],
        metavar="TEMPLATE",
        help=(
            "a stack rule, repeatable: 'blocks.{i}' compares ACTUAL's stacked blocks.<rest> "
            "row by row with GOLDEN's per-layer blocks.<i>.<rest>"
        ),
    )
    diff.add_argument(
        "--rename",
        action="append",
        default=[],
        metavar="OLD=NEW",
        help=(
            "a rename rule, repeatable: 'encoder=backbone' compares ACTUAL's backbone.<rest> "
            "with GOLDEN's encoder.<rest>"
        ),
    )
    json_flag(diff)
    report_flag(diff)


def _project_drift() -> PolicyMode:
    from parity.machinery._config import load_config

    return load_config().drift


def run(args: argparse.Namespace, out: IO[str]) -> int:
    overrides = overrides_of(args)
    result = run_diff(
        args.actual,
        args.golden,
        class_name=args.class_name,
        overrides=overrides,
        budget=args.memory * 2**20,
        # ACTUAL's environment against GOLDEN's, as in a check: the project's policy, if any
        drift_mode=args.drift or _project_drift,
        stack=args.stack,
        rename=args.rename,
    )
    session = ReportSession.whole(result.comparison, result.header)
    out.write(session.table())
    _write_reports(session, args, out)
    return result.exit_code


def _write_reports(session: ReportSession, args: argparse.Namespace, out: IO[str]) -> None:
    """`--json FILE` and `--report DIR`, through the report session (which loads the JSON
    writer only here, the HTML page's only for `--report`)."""
    try:
        if args.json_path:
            path = Path(args.json_path)
            session.write_json(path, session.to_json())
            out.write(f"JSON report written to {path}\n")
        if args.report:
            folder = Path(args.report)
            session.write_folder(folder, title=f"parity diff: {args.actual} against {args.golden}")
            out.write(f"report written to {folder} (report.txt, report.json, index.html)\n")
    except OSError as e:
        raise CLIError(f"cannot write the report: {e}") from None
