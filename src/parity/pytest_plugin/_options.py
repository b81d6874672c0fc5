"""The plugin's command-line options and ini value (`--parity-*`, `parity_goldens`).

Each option is the `parity` command line's flag of the same idea with a `--parity-` prefix
(docs/design.md, "Vocabulary"): `--parity-goldens` is `--goldens`, `--parity-drift` is
`--drift`, and so on. Their defaults come from `[tool.parity]` and the `PARITY_*`
environment variables through `parity.machinery._config` (`configure.session_config`), as for
the command line.
"""

from __future__ import annotations

import pytest

from parity._xla_env import DEFAULT_ISA_CAP
from parity.judge._tolerance import OVERRIDE_HELP, class_help
from parity.machinery._config import BASELINE_MODES, DRIFT_MODES

#: The default of `--parity-timeout`: a whole session, not one producer run.
SESSION_TIMEOUT_S = 3600.0


#: `--parity-origin`'s help.
ORIGIN_HELP = (
    "where a golden check fails, name the first operation that computes what the golden's "
    "base never did, at its source line: the group's programs recorded op by op here and at "
    "its base, once per group per session (auto, the default); off skips it"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("parity", "differential equivalence testing")
    group.addoption(
        "--parity-goldens",
        default=None,
        metavar="DIR",
        help="golden folder (default: [tool.parity] goldens, else ini parity_goldens, else "
        "goldens; relative to the rootdir)",
    )
    group.addoption(
        "--parity-report",
        default=None,
        metavar="DIR",
        help="write the session's report to DIR: report.txt (the table), report.json, "
        "index.html (plots)",
    )
    group.addoption(
        "--parity-override",
        action="append",
        default=[],
        metavar="PATTERN=CLASS",
        help=OVERRIDE_HELP,
    )
    group.addoption("--parity-class", default=None, metavar="NAME", help=class_help("--parity-"))
    group.addoption(
        "--parity-drift",
        default=None,
        choices=DRIFT_MODES,
        help="what a difference that can change bits, between the goldens' environment and "
        "this one, does to bitwise classes: warn (name it in the report), relax (allow 2 "
        "ulp), strict (fail the check) (default: [tool.parity] drift, else warn)",
    )
    group.addoption(
        "--parity-baseline",
        default=None,
        choices=BASELINE_MODES,
        help="the baseline, the reference off the pin's environment: auto re-produces a "
        "golden group at its base commit here (in a cache) where a key fails its pinned "
        "class and compares with it exactly; require does the same and fails the check (an "
        "input error) where the baseline cannot be re-produced; off compares with the "
        "goldens under their calibrated bounds (default: [tool.parity] baseline, else auto)",
    )
    group.addoption("--parity-origin", default="auto", choices=("auto", "off"), help=ORIGIN_HELP)
    group.addoption(
        "--parity-save-actual",
        default=None,
        metavar="DIR",
        help="when a check fails, write what was produced to DIR/<check>.h5 (golden format), "
        "with the parity diff command that reproduces its table",
    )
    group.addoption(
        "--parity-unchecked",
        default="warn",
        choices=("ignore", "warn", "fail"),
        help="golden keys no test checked: ignore, list them, or fail the session "
        "(judged against the selected tests) (default warn)",
    )
    group.addoption(
        "--parity-isa",
        default=None,
        metavar="CAP",
        help="XLA CPU ISA cap (--xla_cpu_max_isa) set before jax starts, so bitwise goldens "
        "reproduce across hosts; 'none' leaves it alone (default: [tool.parity] isa, else "
        f"{DEFAULT_ISA_CAP})",
    )
    group.addoption(
        "--parity-devices",
        type=int,
        default=None,
        metavar="N",
        help="simulated CPU devices per process, set before jax starts (default: "
        "PARITY_DEVICES, else [tool.parity] devices, else jax's own)",
    )
    group.addoption(
        "--parity-processes",
        type=int,
        default=None,
        metavar="N",
        help="run the session as N processes of one JAX distributed run, --parity-devices "
        "each; checks gather to process 0, which reports (default: [tool.parity] processes, "
        "else 1)",
    )
    group.addoption(
        "--parity-timeout",
        type=float,
        default=SESSION_TIMEOUT_S,
        metavar="S",
        help="with --parity-processes: seconds the session may take before every worker is "
        f"stopped (default {SESSION_TIMEOUT_S:g})",
    )
    group.addoption(
        "--parity-jax-cache",
        default=None,
        metavar="DIR",
        help="jax's persistent compilation cache folder, one per machine, shared by the xdist "
        "workers and every process the tests start; 'none' turns it off (default: "
        "PARITY_JAX_CACHE, else [tool.parity] jax_cache, else ~/.cache/parity/jax)",
    )
    parser.addini("parity_goldens", "golden folder, relative to the rootdir", default="goldens")
