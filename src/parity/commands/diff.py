"""`parity diff ACTUAL GOLDEN`: compare every array of two HDF5 files (parity-written or
plain h5py files) and print the report table.

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
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from parity.calibrated import unbound
from parity.commands.common import (
    EXIT_FAIL,
    EXIT_OK,
    CLIError,
    check_class_name,
    class_flag,
    json_flag,
    one_line,
    override_flag,
    overrides_of,
    report_flag,
    subparser,
)
from parity.commands.files import key_classes, opened, read_errors
from parity.judge.chunks import DEFAULT_BUDGET, Block
from parity.judge.classes import REGISTRY, ToleranceClass
from parity.judge.compare import Comparison, Finding, compare_arrays, compare_trees
from parity.judge.tolerance import UnknownClassError, get_class
from parity.report import format_table, write_html, write_json
from parity.store import GoldenFile, GoldenStoreError
from parity.store.provenance import bitwise_policy, drift

__all__ = ["DiffResult", "add_parser", "run", "run_diff"]


@dataclass(frozen=True)
class DiffResult:
    """What `run_diff` found.

    **Fields:**

    - `comparison`: one finding per key of either file, in the GOLDEN's forward order.
    - `header`: lines for the report header: both paths, where the classes came from, the
      GOLDEN's base SHA and its provenance drift against ACTUAL's.
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


def _tolerance(
    name: str, key: str, gf: GoldenFile, cache: dict[str, ToleranceClass]
) -> ToleranceClass:
    tol = cache.get(name)
    if tol is None:
        try:
            tol = cache[name] = get_class(name)
        except UnknownClassError as e:
            raise CLIError(
                f"GOLDEN: {gf.path} checks {key!r} under tolerance class {name!r}, which this "
                f"parity cannot use ({e}; known: {', '.join(sorted(REGISTRY))}); pass "
                "--class NAME, or upgrade parity"
            ) from None
    return tol


def _drift_header(golden: GoldenFile, actual: GoldenFile) -> dict[str, str]:
    if not golden.provenance or not actual.provenance:
        side = "GOLDEN" if not golden.provenance else "ACTUAL"
        return {"drift": f"not compared ({side} records no provenance)"}
    decision = bitwise_policy(drift(golden.provenance, actual.provenance), "warn")
    if not decision.header:
        return {"drift": "none (ACTUAL was produced in the GOLDEN's environment)"}
    return {f"drift {i}": line for i, line in enumerate(decision.header)}


def _describe(gf: GoldenFile) -> str:
    kind = f"parity schema {gf.schema_version}" if gf.is_parity_file else "plain HDF5"
    return f"{gf.path} ({kind}, {len(gf)} arrays)"


def run_diff(
    actual: str | Path,
    golden: str | Path,
    *,
    class_name: str | None = None,
    overrides: Sequence[tuple[str, str]] = (),
    budget: int = DEFAULT_BUDGET,
) -> DiffResult:
    """Compare every array of the file `actual` against the file `golden`.

    Arrays are read one key at a time and each in chunks of at most `budget` bytes of
    working memory (`parity.judge.chunks`; both checksums verified over the chunks), so memory
    stays bounded whatever the file sizes.

    **Arguments:**

    - `actual`: the HDF5 file the changed code produced (parity-written or plain).
    - `golden`: the pinned HDF5 file; its recorded classes, class map and forward order are
      used.
    - `class_name`: a registry class for every key, before the golden's pinned map.
    - `overrides`: `(pattern, class)` rules tried before everything else.
    - `budget`: bytes one array comparison may hold at once (default 512 MiB).

    **Returns:** a `DiffResult`. Raises `CLIError` for unusable input: a missing, truncated,
    corrupt or unsafe file, an unknown class, or arrays parity cannot compare.
    """
    if class_name is not None:
        check_class_name(class_name)
    for _, name in overrides:
        check_class_name(name)
    with opened(golden, "GOLDEN") as gf, opened(actual, "ACTUAL") as af:
        try:
            infos = {k: gf.info(k) for k in gf}
        except GoldenStoreError as e:
            raise CLIError(f"GOLDEN: {e}") from None
        recorded = {k: i.class_name for k, i in infos.items()}
        resolve = key_classes(gf, recorded, class_name=class_name, overrides=overrides)
        # The forward order: pinned keys by their place, then everything else by name (as
        # `compare_trees` orders them).
        placed = gf.ordered_keys()
        place = {k: n for n, k in enumerate(placed)}
        rest = sorted((set(infos) | set(af.keys())) - set(place))
        tols: dict[str, ToleranceClass] = {}
        findings: list[Finding] = []
        for key in placed + rest:
            tol = _tolerance(resolve(key), key, gf, tols)
            findings.append(unbound(_compare_key(key, af, gf, tol, place.get(key), budget)))
        if class_name is not None:
            source = f"--class {class_name} for every key"
        elif gf.class_map_json or any(recorded.values()):
            source = "pinned in GOLDEN (its class map, else the array's class, else bitwise)"
        else:
            source = "bitwise (GOLDEN records no classes)"
        if overrides:
            source = f"--override {', '.join(f'{p}={c}' for p, c in overrides)}; then {source}"
        header = {"actual": _describe(af), "golden": _describe(gf), "classes": source}
        if gf.provenance.get("base_sha"):
            header["golden base_sha"] = str(gf.provenance["base_sha"])
        header.update(_drift_header(gf, af))
    return DiffResult(Comparison(tuple(findings)), header)


def _compare_key(
    key: str,
    af: GoldenFile,
    gf: GoldenFile,
    tol: ToleranceClass,
    place: int | None,
    budget: int = DEFAULT_BUDGET,
) -> Finding:
    in_a, in_g = key in af, key in gf
    try:
        if in_a and in_g:
            return compare_arrays(
                key,
                _RoleSource(af, key, "ACTUAL"),
                _RoleSource(gf, key, "GOLDEN"),
                tol,
                order=place,
                budget=budget,
            )
        # One side only: `compare_trees` writes the "missing"/"unexpected" finding; the
        # array is still read, so that a damaged one is an input error.
        one = {key: _load(af, key, "ACTUAL")} if in_a else {}
        other = {key: _load(gf, key, "GOLDEN")} if in_g else {}
        finding = compare_trees(one, other, tol.name, registry={tol.name: tol}).findings[0]
        return dataclasses.replace(finding, order=place)
    except TypeError as e:  # object, string or datetime arrays from a plain HDF5 file
        raise CLIError(one_line(str(e))) from None


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


def add_parser(sub: Any) -> None:
    """Add `diff` to `sub` (argparse subparsers)."""
    diff = subparser(
        sub,
        "diff",
        help="compare two HDF5 files array by array",
        description=_DIFF_DESCRIPTION,
    )
    diff.add_argument("actual", metavar="ACTUAL", help="HDF5 file from the changed code")
    diff.add_argument("golden", metavar="GOLDEN", help="pinned HDF5 file to compare against")
    override_flag(diff)
    class_flag(diff)
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
    json_flag(diff)
    report_flag(diff, old="--html")


def run(args: argparse.Namespace, out: IO[str]) -> int:
    overrides = overrides_of(args)
    result = run_diff(
        args.actual,
        args.golden,
        class_name=args.class_name,
        overrides=overrides,
        budget=args.memory * 2**20,
    )
    out.write(format_table(result.comparison, header=result.header))
    title = f"parity diff: {args.actual} against {args.golden}"
    try:
        if args.json_path:
            path = write_json(args.json_path, result.comparison, header=result.header)
            out.write(f"JSON report written to {path}\n")
        if args.report:
            folder = Path(args.report)
            folder.mkdir(parents=True, exist_ok=True)
            table = format_table(result.comparison, header=result.header)
            (folder / "report.txt").write_text(table + "\n")
            write_html(folder, result.comparison, header=result.header, title=title)
            write_json(folder / "report.json", result.comparison, header=result.header)
            out.write(f"report written to {folder} (report.txt, report.json, index.html)\n")
    except OSError as e:
        raise CLIError(f"cannot write the report: {e}") from None
    return result.exit_code
