"""What every subcommand shares: the one error class, the exit codes, the flags of
`[tool.parity]`, and the class names given on the command line.

`[tool.parity]`'s reader (`parity.machinery._config`) and the device defaults
(`parity.machinery._devices`) are imported inside the functions that use them, so that a command
that only reads files (`diff`, `show`) loads neither (`tests/parity/test_cli.py`)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity._environment import DRIFT_MODES
from parity._errors import ParityError
from parity.commands._formatter import Formatter
from parity.judge._tolerance import OVERRIDE_HELP, class_help, class_problem, flag_rules
from parity.machinery._logs import KEPT_LOGS, keep_log, log_folder

if TYPE_CHECKING:
    from parity.machinery._config import ParityConfig
    from parity.machinery._launcher import ProducerRunError

__all__ = [
    "DRIFT_MODES",
    "EXIT_FAIL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNUSABLE",
    "KEPT_LOGS",
    "CLIError",
    "check_class_name",
    "class_flag",
    "config_flags",
    "config_of",
    "drift_flag",
    "goldens_flag",
    "groups_flag",
    "json_flag",
    "keep_log",
    "log_folder",
    "one_line",
    "override_flag",
    "overrides_of",
    "process_flags",
    "processes_flag",
    "producer_failure",
    "report_flag",
    "report_progress",
    "require_goldens",
    "split_groups",
    "subparser",
]

#: Every array holds its class.
EXIT_OK = 0
#: At least one array breaks its class, or is missing or unexpected.
EXIT_FAIL = 1
#: The input cannot be used (also argparse's code for a bad command line).
EXIT_UNUSABLE = 2
#: Stopped by Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130


class CLIError(ParityError):
    """Input a command cannot use (a usage or input error): `parity._cli.main` prints it as
    one line and exits 2."""


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def check_class_name(name: str, *, where: str | None = None) -> None:
    """A `CLIError` unless `name` can stand as a class on the command line
    (`parity.judge._tolerance.class_problem`: known, with the parameters its rule needs;
    bare `calibrated` is usable, each key judged by its recorded spread).

    **Arguments:**

    - `name`: a class name given on the command line.
    - `where`: the flag that gave it, for the message (default `--class`).
    """
    problem = class_problem(name, where or "--class")
    if problem is not None:
        raise CLIError(problem)


def subparser(sub: Any, name: str, *, help: str, description: str) -> argparse.ArgumentParser:
    """Add the subcommand `name` to `sub` (argparse subparsers), its description shown as
    written (line breaks kept)."""
    if "\n" not in description:  # one paragraph: wrapped as a terminal shows it
        description = textwrap.fill(description, width=88)
    return sub.add_parser(
        name,
        help=help,
        description=description,
        formatter_class=Formatter,
    )


def split_groups(text: str | None) -> list[str]:
    return [g.strip() for g in (text or "").split(",") if g.strip()]


def groups_flag(p: argparse.ArgumentParser, *, of: str = "producer") -> None:
    """`--groups a,b`: a subset of the producer groups (`of="golden"`: of the golden
    groups); `split_groups` reads it."""
    p.add_argument("--groups", metavar="a,b", help=f"a subset of the {of} groups")


def goldens_flag(p: Any) -> None:
    """`--goldens DIR`, the golden folder."""
    p.add_argument(
        "--goldens",
        metavar="DIR",
        help="golden folder (default: [tool.parity] goldens, else goldens)",
    )


def json_flag(p: argparse.ArgumentParser, *, what: str = "the report") -> None:
    """`--json FILE`: write `what` as JSON to FILE (`-`: to stdout)."""
    p.add_argument("--json", dest="json_path", metavar="FILE", help=f"write {what} as JSON to FILE")


def report_flag(p: argparse.ArgumentParser) -> None:
    """`--report DIR`: the report folder, report.txt, report.json and index.html."""
    p.add_argument(
        "--report",
        metavar="DIR",
        help="write the report to DIR: report.txt (the table), report.json, index.html (plots)",
    )


def class_flag(p: argparse.ArgumentParser) -> None:
    """`--class NAME`: one tolerance class for every key, after `--override`, before the
    goldens' pinned classes."""
    p.add_argument("--class", dest="class_name", metavar="NAME", help=class_help())


def drift_flag(p: argparse.ArgumentParser) -> None:
    """`--drift warn|relax|strict`: the drift policy ([tool.parity] drift)."""
    p.add_argument(
        "--drift",
        choices=DRIFT_MODES,
        help="what a difference that can change bits, between the goldens' environment and "
        "this one, does to bitwise classes: warn (name it in the report), relax (allow 2 ulp), "
        "strict (fail the check) (default: [tool.parity] drift, else warn)",
    )


def config_flags(p: argparse.ArgumentParser, *, goldens: bool = True) -> None:
    """The flags of `[tool.parity]`'s keys (`goldens=False`: a command that pins its own)."""
    from parity._xla_env import DEFAULT_ISA_CAP

    g = p.add_argument_group("settings (override [tool.parity] in pyproject.toml)")
    if goldens:
        goldens_flag(g)
    g.add_argument(
        "--producers",
        metavar="FILE",
        help="producers file, defining GROUPS and optionally CLASS_MAP (default: "
        "[tool.parity] producers)",
    )
    g.add_argument(
        "--src",
        metavar="DIR[,DIR]",
        help="import root(s) of the code under test (default: [tool.parity] src, else src)",
    )
    g.add_argument(
        "--isa",
        metavar="CAP",
        help="XLA CPU ISA cap set before jax starts; 'none' leaves it alone (default: "
        f"[tool.parity] isa, else {DEFAULT_ISA_CAP})",
    )
    g.add_argument(
        "--devices",
        type=int,
        metavar="N",
        help="simulated CPU devices per process (default: PARITY_DEVICES, else "
        "[tool.parity] devices, else 1)",
    )


def processes_flag(p: Any) -> None:
    """`--processes N`: the producers as N processes of one distributed run."""
    p.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="run the producers as N processes of one distributed run, --devices each, "
        "outputs gathered to process 0 (default: [tool.parity] processes, else 1)",
    )


def process_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("multi-process runs (JAX's distributed runtime)")
    processes_flag(g)
    g.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="seconds the producer run may take before its process, or every worker of a "
        "--processes run, is stopped (default: no limit for one process, 1800 with "
        "--processes above 1); a worker that fails stops the others at once",
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


def override_flag(p: argparse.ArgumentParser) -> None:
    """`--override PATTERN=CLASS` (repeatable): rules before every other class."""
    p.add_argument(
        "--override", action="append", default=[], metavar="PATTERN=CLASS", help=OVERRIDE_HELP
    )


def config_of(args: argparse.Namespace) -> ParityConfig:
    from parity.machinery._config import load_config

    keys = ("goldens", "producers", "src", "isa", "devices", "processes", "drift")
    flags = {k: getattr(args, k, None) for k in keys}
    config = load_config().with_overrides(**flags)
    # Before any other complaint: outside a project, "golden folder does not exist" or
    # "no producers file" would send the user to the wrong fix.
    config.need_table()
    return config


def overrides_of(args: argparse.Namespace, *, with_class: bool = False) -> list[tuple[str, str]]:
    """The `--override PATTERN=CLASS` flags as `(pattern, class)` pairs; `with_class`: then
    `--class NAME` as the rule `*=NAME` (every key), which is where `--class` stands in
    the precedence, for the commands whose core takes rules only
    (`parity.judge._tolerance.flag_rules`; a `CLIError` for a rule that cannot stand)."""
    name = getattr(args, "class_name", None) if with_class else None
    return flag_rules(args.override, name)  # a RuleError is a ParityError: cli.main says it


def report_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def producer_failure(e: ProducerRunError, what: str, report: Path | str | None = None) -> CLIError:
    """The `CLIError` of a producer run that failed, `what` its opening words (`"the
    producers cannot run"`): the run's output is kept in a log (`keep_log`), the end of
    its traceback (or a worker's last lines) printed on stderr above the one line, which
    gives the reason and says where the log is (or why there is none)."""
    try:
        kept = f"output: {keep_log(e.output or e.head, report)}"
    except OSError as error:  # the failure still says what it is
        kept = f"its output could not be kept: {error}"
    if e.tail:
        print(f"parity: last output lines:\n{e.tail}", file=sys.stderr, flush=True)
    return CLIError(f"{what}: {e.reason} ({kept})")


def require_goldens(config: ParityConfig) -> None:
    """A `CLIError` unless the configured golden folder exists."""
    if not config.goldens.is_dir():
        raise CLIError(
            f"golden folder {config.goldens} does not exist; pin it first with "
            "`parity repin --base <REV>`"
        )


def require_defined_groups(config: ParityConfig, groups: list[str]) -> None:
    """Raise `CLIError` naming the groups of `groups` that the producers do not define, and
    those they do. The producers file is imported in a fresh process (the current tree's
    code, as `repin --classes-only` does); no group runs. A producers file that cannot be
    imported is left to the command's own run to report."""
    import tempfile

    from parity.machinery._launcher import (
        ProducerRun,
        ProducerRunError,
        UnknownGroupsError,
        run_producers,
    )

    with tempfile.TemporaryDirectory(prefix="parity-groups-") as tmp:
        try:
            run = ProducerRun(
                code_root=config.root,
                producers=config.need_producers(),
                out=Path(tmp),
                command="calibrate",
                groups=groups,
                src=config.src_relative(),
                mode="class_map",
            )
            run_producers(run, progress=lambda _: None)
        except UnknownGroupsError as e:
            raise CLIError(e.message) from None
        except ProducerRunError:
            return
