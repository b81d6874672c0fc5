"""The command line: `python -m parity` (or the `parity` script).

One argparse tree: `build_parser` adds each subcommand from its module in
`parity.commands` (`diff`, `show`, `repin`, `check`, `bisect`, `calibrate`, `baseline`),
and `main`
runs the one the command line names.

- `parity diff ACTUAL GOLDEN [--class NAME] [--json FILE] [--report DIR]` compares every
  array of two HDF5 files (parity-written or plain h5py files) and prints the report table.
- `parity show GOLDEN [--json FILE|-] [--verify]` prints a file's provenance, class map
  and inventory.

Every subcommand spells one idea one way (docs/design.md, "Vocabulary"): `--goldens DIR`,
`--json FILE` (always a file; `-` is stdout), `--report DIR` (text, JSON and HTML),
`--class NAME`, `--override PATTERN=CLASS`, `--drift`; the shared definitions live in
`parity.commands.common`. Old spellings (`repin --out`, `diff --html`, a bare `show
--json`) work for one release with a one-line warning on stderr.
- `parity repin`, `parity check`, `parity bisect`, `parity calibrate` and `parity baseline
  build` run producers.

**Exit codes.** 0: every array holds its class. 1: at least one does not (or a key is
missing or unexpected); every failing key is printed. 2: unusable input (a missing,
truncated, corrupt or unsafe file, a checksum mismatch, an unknown class, arrays parity
cannot compare), with a one-line `parity: error: ...` on stderr and no traceback. 130:
interrupted (Ctrl-C), one line saying so (`repin`: and what it left in the golden folder).

This module never imports jax.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from parity.commands import baseline, bisect, calibrate, check, diff, repin, show
from parity.commands.common import (
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNUSABLE,
    CLIError,
    check_class_name,
    one_line,
    parse_override,
)
from parity.commands.diff import DiffResult, run_diff
from parity.commands.show import format_inventory, inventory
from parity.run.config import ConfigError

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

#: The subcommands in the order `--help` lists them, each module with `add_parser` and
#: `run`; the last four run producers.
_SUBCOMMANDS = {
    "diff": diff,
    "show": show,
    "repin": repin,
    "check": check,
    "bisect": bisect,
    "calibrate": calibrate,
    "baseline": baseline,
}
_RUN_PRODUCERS = ("repin", "check", "bisect", "calibrate", "baseline")

_DESCRIPTION = """\
Differential equivalence checks on HDF5 array files.

  parity diff ACTUAL GOLDEN      compare every array of ACTUAL against GOLDEN
  parity show GOLDEN             provenance, class map and arrays of a file
  parity repin --base REV        pin goldens at a commit (a temporary worktree)
  parity check                   run the producers on this tree, check against the goldens
  parity bisect GOOD BAD         find the first commit that breaks a check
  parity calibrate               measure the harmless noise against each class's bound
  parity baseline build|list|clear  the goldens' bases re-produced in this environment

repin, check, bisect, calibrate and baseline read [tool.parity] in the nearest
pyproject.toml (goldens, producers, src, isa, devices, processes, baseline,
baseline_cache, drift, jax_cache); the environment variables PARITY_DEVICES,
PARITY_BASELINE_CACHE and PARITY_JAX_CACHE override their key, and a flag of the same
name overrides both (the pytest plugin reads the same, its options prefixed --parity-).

--json FILE writes JSON to FILE (show: '-' prints it); --report DIR writes report.txt,
report.json and index.html.

exit codes: 0 every array holds its class; 1 some array does not (each is printed);
2 unusable input (missing, truncated, corrupt or unsafe file, unknown class).
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

    **Returns:** an `argparse.ArgumentParser` with every subcommand of `parity.commands`.
    """
    parser = argparse.ArgumentParser(
        prog="parity",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _SUBCOMMANDS.values():
        module.add_parser(sub)
    return parser


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
    run = _SUBCOMMANDS[args.command].run
    try:
        if args.command not in _RUN_PRODUCERS:
            return run(args, sys.stdout)
        from parity.run.signals import signals_reach_main_thread

        with signals_reach_main_thread():
            return run(args, sys.stdout)
    except (CLIError, ConfigError) as e:
        sys.stdout.flush()
        print(f"parity: error: {one_line(str(e))}", file=sys.stderr)
        return EXIT_UNUSABLE
    except KeyboardInterrupt:  # `repin` says what it left itself; the others wrote nothing
        sys.stdout.flush()
        print(f"parity: {args.command} interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED
