"""The command line: `python -m parity` (or the `parity` script).

One argparse tree: `COMMANDS` declares each subcommand (its name, its module in
`parity.commands`, its `--help` line): `diff`, `show`, `repin`, `check`, `bisect`,
`calibrate`, `baseline`. `main` imports the module of the one the command line names and
no other, and builds that one's parser only (`build_parser(built=...)`; with none named,
`--help` or a usage error, every subcommand gets an empty parser carrying its `--help`
line), so that `parity diff` starts in the time a diff needs; `build_parser()` builds the
whole tree. Every parser formats its help with `parity.commands._formatter.Formatter`.

- `parity diff ACTUAL GOLDEN [--class NAME] [--json FILE] [--report DIR]` compares every
  array of two HDF5 files (parity-written or plain h5py files) and prints the report table.
- `parity show GOLDEN [--json FILE|-] [--verify]` prints a file's provenance, class map
  and inventory.

Every subcommand spells one idea one way (docs/design.md, "Vocabulary"): `--goldens DIR`,
`--json FILE` (always a file; `-` is stdout), `--report DIR` (text, JSON and HTML),
`--class NAME`, `--override PATTERN=CLASS`, `--drift`; the shared definitions live in
`parity.commands._common`.
- `parity repin`, `parity check`, `parity bisect`, `parity calibrate` and `parity baseline
  build` run producers.

**Exit codes.** 0: every array holds its class. 1: at least one does not (or a key is
missing or unexpected); every failing key is printed. 2: unusable input (a missing,
truncated, corrupt or unsafe file, a checksum mismatch, an unknown class, arrays parity
cannot compare), with a one-line `parity: error: ...` on stderr and no traceback. 130:
interrupted (Ctrl-C), 143: terminated (SIGTERM, while a temporary worktree is open), one
line saying so (`repin`: and what it left in the golden folder).

This module never imports jax; importing it imports no subcommand (the names it re-exports
load their module on first use). `script` is the process's entry point (`python -m parity`,
the `parity` script): `main`, then the exit, which it keeps from spending longer than a small
diff's comparison on the garbage collector.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from parity.commands._formatter import Formatter

if TYPE_CHECKING:
    from parity.commands._common import EXIT_OK, EXIT_UNUSABLE
    from parity.commands._diff import run_diff

__all__ = [
    "COMMANDS",
    "EXIT_OK",
    "EXIT_UNUSABLE",
    "Command",
    "build_parser",
    "main",
    "run_diff",
    "script",
    "version",
]


@dataclass(frozen=True)
class Command:
    """One subcommand of `parity`, declared without importing it.

    **Fields:**

    - `name`: the word on the command line (`diff`).
    - `module`: the module that defines it (`parity.commands._diff`): `add_parser(sub, help)`
      adds its subparser, `run(args, out)` runs it; imported only when this subcommand is
      the one the command line names (or when `build_parser` builds the whole tree).
    - `help`: its line in `parity --help` (and the subparser's `help`).
    - `runs_producers`: it starts producer processes, so SIGINT/SIGTERM must reach the main
      thread while it runs (`parity.machinery._signals`).
    """

    name: str
    module: str
    help: str
    runs_producers: bool = False


#: The subcommands in the order `--help` lists them.
COMMANDS: tuple[Command, ...] = (
    Command("diff", "parity.commands._diff", "compare two HDF5 files array by array"),
    Command("show", "parity.commands._show", "provenance, class map and arrays of a file"),
    Command(
        "repin",
        "parity.commands._repin",
        "pin goldens at a commit (a temporary worktree; your checkout is untouched)",
        runs_producers=True,
    ),
    Command(
        "check",
        "parity.commands._check",
        "run the producers on the current tree and check them against the goldens",
        runs_producers=True,
    ),
    Command(
        "bisect",
        "parity.commands._bisect",
        "find the first commit between GOOD and BAD that breaks a check",
        runs_producers=True,
    ),
    Command(
        "calibrate",
        "parity.commands._calibrate",
        "measure the environment's harmless noise against each class's bound",
        runs_producers=True,
    ),
    Command(
        "baseline",
        "parity.commands._baseline",
        "build, list or clear the baselines: golden groups re-produced at their base here",
        runs_producers=True,
    ),
)
_BY_NAME = {c.name: c for c in COMMANDS}

#: The names `parity._cli` re-exports, name -> the module that defines it; each loads its
#: module on first use (`__getattr__`), so that importing `parity._cli` loads no command.
_REEXPORTS = {
    "EXIT_OK": "parity.commands._common",
    "EXIT_UNUSABLE": "parity.commands._common",
    "run_diff": "parity.commands._diff",
}


def __getattr__(name: str) -> Any:
    module = _REEXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'parity._cli' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


_DESCRIPTION = """\
Differential equivalence checks on HDF5 array files.

  parity diff ACTUAL GOLDEN      compare every array of ACTUAL against GOLDEN
  parity show GOLDEN             provenance, class map and arrays of a file
  parity repin --base REV        pin goldens at a commit (a temporary worktree)
  parity check                   run the producers on this tree, check against the goldens
  parity bisect GOOD BAD         find the first commit that breaks a check
  parity calibrate               measure the harmless noise against each class's bound
  parity baseline build|list|clear  the baselines: goldens re-produced at their base here

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


class _Version(argparse.Action):
    """`--version`: prints `parity X.Y.Z` and exits, the version read only then (reading an
    installed distribution's metadata imports `importlib.metadata`, which no other command
    needs)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show program's version number and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"{parser.prog} {version()}", flush=True)
        parser.exit()


def build_parser(built: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser of `python -m parity`.

    **Arguments:**

    - `built`: the subcommands whose parser is built (importing their module). Naming one
      subcommand, the parser holds that one only: it reads a command line naming it, and
      nothing else needs the others (its `--help` and its errors print its own usage).
      Naming none (`()`): every subcommand gets an empty parser that carries its `--help`
      line and nothing else, for `--help`, `--version` and a usage error that lists them.
      `None` (the default): the whole tree, every module of `COMMANDS` imported.

    **Returns:** an `argparse.ArgumentParser`.
    """
    parser = argparse.ArgumentParser(
        prog="parity",
        description=_DESCRIPTION,
        formatter_class=Formatter,
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        if built is None or command.name in built:
            importlib.import_module(command.module).add_parser(sub, command.help)
        elif not built:
            sub.add_parser(command.name, help=command.help, formatter_class=Formatter)
    return parser


def _named_command(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names: its first word that is not an option (the top-level
    options, `--help` and `--version`, take no value), or `None`."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line: build the parser of the subcommand it names only
    (`build_parser(built=...)`), so that a command imports its own module and nothing of the
    others'.

    **Arguments:**

    - `argv`: the arguments after the program name; `sys.argv[1:]` by default.

    **Returns:** the exit code: `EXIT_OK` (0), `EXIT_FAIL` (1) or `EXIT_UNUSABLE` (2).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    named = _named_command(argv)
    parser = build_parser(built=(named,) if named in _BY_NAME else ())
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a bad command line (2); argparse printed why
        from parity.commands._common import EXIT_UNUSABLE

        return e.code if isinstance(e.code, int) else EXIT_UNUSABLE
    command = _BY_NAME[args.command]
    run = importlib.import_module(command.module).run
    from parity._errors import ParityError

    try:
        if not command.runs_producers:
            return run(args, sys.stdout)
        from parity.machinery._signals import signals_reach_main_thread

        with signals_reach_main_thread():
            return run(args, sys.stdout)
    except ParityError as e:  # every error a user can meet: its one line, its exit code
        sys.stdout.flush()
        print(f"parity: error: {e.line}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:  # `repin` says what it left itself; the others wrote nothing
        from parity.machinery._signals import interruption

        how, code = interruption(e)
        sys.stdout.flush()
        print(f"parity: {args.command} {how}", file=sys.stderr)
        return code


#: `script`'s threshold of the collector's youngest generation (Python's default: 700).
_GC_YOUNGEST = 50_000


def script() -> NoReturn:
    """The process's entry point (`python -m parity`, the `parity` script): `main` on
    `sys.argv`, then exit with its code.

    Before exiting it freezes every object the garbage collector tracks (`gc.freeze`), so
    that the interpreter's shutdown skips them: it would otherwise run full collections over
    everything numpy, h5py and parity built (tens of thousands of objects; ~15 ms, more than
    a small diff compares for) to find next to no garbage. What the exit owes still happens:
    `atexit` handlers run, the standard streams are flushed, the commands have closed their
    files; only objects in reference cycles are left to the operating system, whose
    `__del__` Python never promises to run at exit. `main` alone, called in a process that
    goes on (a test, a tool), freezes nothing.

    While `main` runs, the youngest generation is collected every 50,000 allocations rather
    than every 700: importing a subcommand and its judge (dozens of dataclasses, argparse,
    numpy and h5py's objects) otherwise triggers a dozen collections that find nothing, ~4
    ms of a small diff. Garbage in cycles is still collected, in larger batches.
    """
    gc.set_threshold(_GC_YOUNGEST, *gc.get_threshold()[1:])
    code = main()
    gc.freeze()
    sys.exit(code)
