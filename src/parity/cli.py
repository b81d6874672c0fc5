"""The command line: `python -m parity` (or the `parity` script).

`repin`, `check`, `bisect` and `calibrate` (which run producers) live in
`parity.commands`. `diff` and `show` are thin layers over `parity.store`, `parity.judge.compare`
and `parity.report`:

- `parity diff ACTUAL GOLDEN [--class NAME] [--json FILE] [--html DIR]` compares every
  array of two HDF5 files (parity-written or plain h5py files) and prints the report table.
- `parity show GOLDEN [--json] [--verify]` prints a file's provenance, class map and
  inventory.

**Classes.** Each key of a diff gets its class by the one precedence of `parity.check`
(the same as the pytest plugin's): `--override PATTERN=CLASS` rules first, then `--class
NAME` (every key), then the GOLDEN's pinned class map (and the class recorded with the
array for a key the map does not cover), then `bitwise` (plain HDF5 files record neither,
so they compare bitwise).

**Order.** Keys are walked in the GOLDEN's pinned forward order; keys without a place
(order -1, plain files, keys only in ACTUAL) come after, by name.

**Exit codes.** 0: every array holds its class. 1: at least one does not (or a key is
missing or unexpected); every failing key is printed. 2: unusable input (a missing,
truncated, corrupt or unsafe file, a checksum mismatch, an unknown class, arrays parity
cannot compare), with a one-line `parity: error: ...` on stderr and no traceback.

This module never imports jax.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import numpy as np

from parity.check import CheckError, bind_calibrated, class_resolver, pinned_class_map, unbound
from parity.commands import CommandError, add_parsers
from parity.config import ConfigError
from parity.judge.chunks import DEFAULT_BUDGET, Block
from parity.judge.compare import Comparison, Finding, compare_arrays, compare_trees
from parity.judge.tolerance import REGISTRY, ToleranceClass, UnknownClassError, get_class
from parity.noise import Spreads
from parity.report import format_table, write_html, write_json
from parity.store import GoldenFile, GoldenStoreError, open_goldens
from parity.store.provenance import bitwise_policy, drift

__all__ = [
    "EXIT_FAIL",
    "EXIT_OK",
    "EXIT_UNUSABLE",
    "CLIError",
    "DiffResult",
    "build_parser",
    "check_class_name",
    "format_inventory",
    "inventory",
    "main",
    "parse_override",
    "run_diff",
    "version",
]

#: Every array holds its class.
EXIT_OK = 0
#: At least one array breaks its class, or is missing or unexpected.
EXIT_FAIL = 1
#: The input cannot be used (also argparse's code for a bad command line).
EXIT_UNUSABLE = 2

_FALLBACK_CLASS = "bitwise"


class CLIError(Exception):
    """Input the CLI cannot use; `main` prints it as one line and exits 2."""


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


# --------------------------------------------------------------------------- helpers


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


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


@contextlib.contextmanager
def _opened(path: str | Path, role: str) -> Iterator[GoldenFile]:
    """Open `path` read-only, turning every refusal into a `CLIError` that names `role`."""
    if role == "ACTUAL" and not Path(path).exists():
        # The store's own message suggests pinning, which is right for goldens only.
        raise CLIError(
            f"ACTUAL: {path} does not exist; expected the HDF5 file the changed code wrote "
            "(check the path, or run the producer first)"
        )
    try:
        gf = open_goldens(path)
    except GoldenStoreError as e:
        raise CLIError(f"{role}: {e}") from None
    except OSError as e:  # a directory, no permission, ...
        raise CLIError(f"{role}: {path} cannot be opened as HDF5: {e}") from None
    try:
        yield gf
    finally:
        gf.close()


@contextlib.contextmanager
def _read_errors(gf: GoldenFile, key: str, role: str) -> Iterator[None]:
    """Store and HDF5 read errors of `gf[key]` become a `CLIError` naming `role`."""
    try:
        yield
    except GoldenStoreError as e:
        raise CLIError(f"{role}: {e}") from None
    except OSError as e:
        # A file truncated after its metadata opens fine and fails only when data is read.
        raise CLIError(
            f"{role}: {gf.path}: array {key!r} cannot be read (truncated or damaged file: {e}); "
            "restore the file or produce it again"
        ) from None


def _load(gf: GoldenFile, key: str, role: str) -> np.ndarray:
    """`gf[key]` with the checksum verified; store and HDF5 read errors become `CLIError`."""
    with _read_errors(gf, key, role):
        return gf[key]


class _RoleSource:
    """`gf.source(key)` whose read errors become a `CLIError` naming the file's role."""

    def __init__(self, gf: GoldenFile, key: str, role: str):
        self._gf, self._key, self._role = gf, key, role
        with _read_errors(gf, key, role):
            self._src = gf.source(key)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._src.shape

    @property
    def dtype(self) -> np.dtype:
        return self._src.dtype

    def read(self, block: Block) -> np.ndarray:
        with _read_errors(self._gf, self._key, self._role):
            return self._src.read(block)

    def finish(self) -> None:
        with _read_errors(self._gf, self._key, self._role):
            self._src.finish()


def _verify(gf: GoldenFile) -> int:
    """`gf.verify()`: every checksum, and the file's index against each array's own
    attributes; store and HDF5 read errors become `CLIError`."""
    try:
        return gf.verify()
    except GoldenStoreError as e:
        raise CLIError(f"GOLDEN: {e}") from None
    except OSError as e:
        raise CLIError(
            f"GOLDEN: {gf.path}: an array cannot be read (truncated or damaged file: {e}); "
            "restore the file or produce it again"
        ) from None


def _class_resolver(
    gf: GoldenFile,
    recorded: dict[str, str],
    *,
    class_name: str | None = None,
    overrides: Sequence[tuple[str, str]] = (),
) -> Callable[[str], str]:
    """key -> class name, by `parity.check.class_resolver`'s precedence."""
    try:
        pinned = pinned_class_map(gf)
    except CheckError as e:
        raise CLIError(f"GOLDEN: {e}") from None
    # A key under `calibrated` is bound to the spread GOLDEN records for it, as in a check.
    bound = bind_calibrated(
        class_resolver(overrides=overrides, class_map=class_name, pinned=pinned, recorded=recorded),
        Spreads.of(gf.provenance),
        gf.path.stem,
        gf.path,
    )

    def resolve(key: str) -> str:
        try:
            return bound(key)
        except CheckError as e:
            raise CLIError(f"GOLDEN: {e}") from None

    return resolve


def parse_override(text: str) -> tuple[str, str]:
    """`PATTERN=CLASS` from the command line as a `(pattern, class)` pair; `CLIError` if
    malformed or the class is unknown. The class may carry parameters
    (`'taps.*=reduction[K=512]'`): the split is at the last `=` outside brackets."""
    head = text[: text.rindex("[")] if text.endswith("]") and "[" in text else text
    pattern, sep, _ = head.rpartition("=")
    name = text[len(pattern) + 1 :] if sep else ""
    if not sep or not pattern or not name:
        raise CLIError(
            f"--override {text!r} is not PATTERN=CLASS; for example "
            "--override 'traj.*=device_count'"
        )
    check_class_name(name)
    return pattern, name


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


def check_class_name(name: str) -> ToleranceClass:
    """The registry's class called `name`; a `CLIError` listing the known names otherwise.

    **Arguments:**

    - `name`: a class name given on the command line.

    **Returns:** the `ToleranceClass`.
    """
    try:
        return get_class(name)
    except UnknownClassError as e:
        raise CLIError(
            f"--class {name!r} is not a usable tolerance class ({e}); expected one of: "
            f"{', '.join(sorted(REGISTRY))}, with parameters where a class needs them"
        ) from None


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


# --------------------------------------------------------------------------- diff


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
    with _opened(golden, "GOLDEN") as gf, _opened(actual, "ACTUAL") as af:
        try:
            infos = {k: gf.info(k) for k in gf}
        except GoldenStoreError as e:
            raise CLIError(f"GOLDEN: {e}") from None
        recorded = {k: i.class_name for k, i in infos.items()}
        resolve = _class_resolver(gf, recorded, class_name=class_name, overrides=overrides)
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
        raise CLIError(_one_line(str(e))) from None


# --------------------------------------------------------------------------- show


def inventory(golden: str | Path, *, verify: bool = False) -> dict[str, Any]:
    """What `parity show --json` prints: provenance, class map and arrays of a file.

    **Arguments:**

    - `golden`: an HDF5 file (parity-written or plain).
    - `verify`: also load every array and verify its checksum, and check that the file's
      index agrees with every array's own attributes.

    **Returns:** a JSON-safe dict with `path`, `format` (`"parity"` or `"plain"`),
    `schema_version` (null for plain files), `provenance` (a dict, empty if none),
    `class_map` (the pinned map as parsed JSON, or null), `arrays` (a list of `{key, shape,
    dtype, class, order}`, sorted by key; `class` is the one `diff` would use without
    `--class`, `order` the pinned forward place or -1) and `verified` (how many arrays were
    read and, in a parity file, checksum-verified; null without `verify`). Raises
    `CLIError` for unusable input.
    """
    with _opened(golden, "GOLDEN") as gf:
        try:
            infos = [gf.info(k) for k in gf]
        except GoldenStoreError as e:
            raise CLIError(f"GOLDEN: {e}") from None
        class_map = None
        if gf.class_map_json:
            try:
                class_map = json.loads(gf.class_map_json)
            except json.JSONDecodeError as e:
                raise CLIError(
                    f"GOLDEN: {gf.path}: the pinned class map is not JSON ({e}); repin the file"
                ) from None
        resolve = _class_resolver(gf, {i.key: i.class_name for i in infos})
        verified = _verify(gf) if verify else None
        return {
            "path": str(gf.path),
            "format": "parity" if gf.is_parity_file else "plain",
            "schema_version": gf.schema_version,
            "provenance": gf.provenance,
            "class_map": class_map,
            "arrays": [
                {
                    "key": i.key,
                    "shape": list(i.shape),
                    "dtype": i.dtype.name,
                    "class": resolve(i.key),
                    "order": i.order,
                }
                for i in infos
            ],
            "verified": verified,
        }


def format_inventory(doc: dict[str, Any]) -> str:
    """`inventory`'s dict as text for a terminal.

    **Arguments:**

    - `doc`: the output of `inventory`.

    **Returns:** the text: the file and its format, provenance, class map, then one row per
    array (key, shape, dtype, class, order).
    """
    arrays = doc["arrays"]
    if doc["format"] == "parity":
        kind = f"parity schema {doc['schema_version']}"
    else:
        kind = "plain HDF5 (no parity attributes: no checksums, every key compares bitwise)"
    lines = [f"golden: {doc['path']}", f"format: {kind}, {len(arrays)} arrays"]
    if doc["verified"] is not None:
        verified = "none to verify (plain HDF5)" if doc["format"] != "parity" else "all verified"
        lines.append(f"checksums: {verified} ({doc['verified']} arrays read)")
    prov = doc["provenance"]
    lines.append("provenance:" + ("" if prov else " none recorded"))
    if prov:
        width = max(len(k) for k in prov)
        for k in sorted(prov):
            value = prov[k]
            if isinstance(value, dict) and "summary" in value:  # a calibration: its one line
                value = cast(dict[str, Any], value)["summary"]
            lines.append(f"  {k.ljust(width)}  {value}")
    cmap = doc["class_map"]
    if not isinstance(cmap, dict):
        lines.append("class map: none pinned")
    else:
        lines.append("class map (first matching rule wins):")
        lines += [f"  {rule[0]}  ->  {rule[1]}" for rule in cmap.get("rules", [])]
        # What parity check does with a key no rule matches (`parity.check`'s precedence):
        # the class recorded with its array, else bitwise. The class column shows each.
        fallback = "none pinned: an unmatched key takes its array's recorded class, else bitwise"
        lines.append(f"  default  ->  {cmap.get('default') or f'({fallback})'}")
    lines += ["", f"arrays ({len(arrays)}):"]
    rows = [["key", "shape", "dtype", "class", "order"]] + [
        [
            a["key"],
            str(tuple(a["shape"])),
            a["dtype"],
            a["class"],
            str(a["order"]) if a["order"] >= 0 else "-",
        ]
        for a in arrays
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        lines.append(
            "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        )
        if n == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main

_DESCRIPTION = """\
Differential equivalence checks on HDF5 array files.

  parity diff ACTUAL GOLDEN      compare every array of ACTUAL against GOLDEN
  parity show GOLDEN             provenance, class map and arrays of a file
  parity repin --base REV        pin goldens at a commit (a temporary worktree)
  parity check                   run the producers on this tree, check against the goldens
  parity bisect GOOD BAD         find the first commit that breaks a check
  parity calibrate               measure the harmless noise against each class's bound

repin, check, bisect and calibrate read [tool.parity] in the nearest pyproject.toml
(goldens, producers, src, isa, devices, processes); a flag of the same name overrides
each key.

exit codes: 0 every array holds its class; 1 some array does not (each is printed);
2 unusable input (missing, truncated, corrupt or unsafe file, unknown class).
"""

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

_SHOW_DESCRIPTION = """\
Print a file's provenance, its pinned class map and every array (key, shape, dtype, the
class `parity diff` would check it under, forward order) without loading the data.
"""


def version() -> str:
    """The installed distribution's version (`parity-harness`), else the package's own
    (`parity.__version__`, a source tree on the path without an install)."""
    from importlib import metadata

    try:
        return metadata.version("parity-harness")
    except metadata.PackageNotFoundError:
        import parity

        return parity.__version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `python -m parity`.

    **Returns:** an `argparse.ArgumentParser` with the `diff` and `show` subcommands.
    """
    known = ", ".join(sorted(REGISTRY))
    parser = argparse.ArgumentParser(
        prog="parity",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    diff = sub.add_parser(
        "diff",
        help="compare two HDF5 files array by array",
        description=_DIFF_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    diff.add_argument("actual", metavar="ACTUAL", help="HDF5 file from the changed code")
    diff.add_argument("golden", metavar="GOLDEN", help="pinned HDF5 file to compare against")
    diff.add_argument(
        "--class",
        dest="class_name",
        metavar="NAME",
        help=f"check every key under this tolerance class ({known}) instead of GOLDEN's",
    )
    diff.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="PATTERN=CLASS",
        help="check keys matching PATTERN under CLASS, before anything else (repeatable)",
    )
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
        "--json", dest="json_path", metavar="FILE", help="also write the report as JSON"
    )
    diff.add_argument(
        "--html", dest="html_dir", metavar="DIR", help="also write index.html with plots to DIR"
    )

    show = sub.add_parser(
        "show",
        help="provenance, class map and arrays of a file",
        description=_SHOW_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    show.add_argument("golden", metavar="GOLDEN", help="HDF5 file to describe")
    show.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    show.add_argument(
        "--verify", action="store_true", help="also load every array and verify its checksum"
    )
    add_parsers(sub)
    return parser


def _cmd_diff(args: argparse.Namespace, out: IO[str]) -> int:
    overrides = [parse_override(o) for o in args.override]
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
        if args.html_dir:
            path = write_html(args.html_dir, result.comparison, header=result.header, title=title)
            out.write(f"HTML report written to {path}\n")
    except OSError as e:
        raise CLIError(f"cannot write the report: {e}") from None
    return result.exit_code


def _cmd_show(args: argparse.Namespace, out: IO[str]) -> int:
    doc = inventory(args.golden, verify=args.verify)
    if args.json:
        out.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    else:
        out.write(format_inventory(doc))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    **Arguments:**

    - `argv`: the arguments after the program name; `sys.argv[1:]` by default.

    **Returns:** the exit code: `EXIT_OK` (0), `EXIT_FAIL` (1) or `EXIT_UNUSABLE` (2).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a bad command line (2); argparse printed why
        return e.code if isinstance(e.code, int) else EXIT_UNUSABLE
    try:
        if args.command in ("diff", "show"):
            return (_cmd_diff if args.command == "diff" else _cmd_show)(args, sys.stdout)
        from parity.commands import run_command
        from parity.signals import signals_reach_main_thread

        with signals_reach_main_thread():
            return run_command(args, sys.stdout)
    except (CLIError, CommandError, ConfigError) as e:
        sys.stdout.flush()
        print(f"parity: error: {_one_line(str(e))}", file=sys.stderr)
        return EXIT_UNUSABLE
