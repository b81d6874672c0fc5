"""The plugin's command-line options and ini value (`--parity-*`, `parity_goldens`)."""

from __future__ import annotations

import pytest

from parity.run.devices import DEFAULT_ISA_CAP

#: The default of `--parity-timeout`: a whole session, not one producer run.
SESSION_TIMEOUT_S = 3600.0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("parity", "differential equivalence testing")
    group.addoption(
        "--parity-devices",
        type=int,
        default=None,
        help="simulated CPU device count, set before jax starts (env PARITY_DEVICES)",
    )
    group.addoption(
        "--parity-processes",
        type=int,
        default=None,
        help="run the session as N processes of one JAX distributed run, --parity-devices "
        "each; checks gather to process 0, which reports",
    )
    group.addoption(
        "--parity-timeout",
        type=float,
        default=SESSION_TIMEOUT_S,
        help="with --parity-processes: seconds the session may take before every worker is "
        f"stopped (default {SESSION_TIMEOUT_S:g})",
    )
    group.addoption(
        "--parity-isa",
        default=None,
        help="XLA CPU ISA cap (--xla_cpu_max_isa) set before jax starts, so bitwise goldens "
        "reproduce across hosts; 'none' leaves it alone (default: [tool.parity] isa, else "
        f"{DEFAULT_ISA_CAP})",
    )
    group.addoption(
        "--parity-cache",
        default=None,
        help="jax persistent compilation cache folder, per xdist worker; 'none' "
        "disables (env PARITY_JAX_CACHE; default .jax_cache under the rootdir)",
    )
    group.addoption(
        "--parity-goldens",
        default=None,
        help="golden folder (default: [tool.parity] goldens, else ini parity_goldens, else "
        "'goldens')",
    )
    group.addoption(
        "--parity-report",
        default=None,
        metavar="DIR",
        help="write the session's comparisons to DIR (report.txt, report.json, HTML)",
    )
    group.addoption(
        "--parity-drift",
        default="warn",
        choices=("warn", "relax", "strict"),
        help="what environment drift does to bitwise classes (default warn)",
    )
    group.addoption(
        "--parity-baseline",
        default=None,
        choices=("auto", "off"),
        help="the second judge off the pin's environment: auto re-produces a golden group at "
        "its base commit here (in a cache) where a key fails its pinned class and judges "
        "against it exactly; off judges by the goldens' calibrated bounds (default: "
        "[tool.parity] baseline, else auto)",
    )
    group.addoption(
        "--parity-unchecked",
        default="warn",
        choices=("ignore", "warn", "fail"),
        help="golden keys no test checked: ignore, list them, or fail the session "
        "(judged against the selected tests)",
    )
    group.addoption(
        "--parity-save-actual",
        default=None,
        metavar="DIR",
        help="when a check fails, write what was produced to DIR/<check>.h5 (golden format)",
    )
    parser.addini("parity_goldens", "golden folder, relative to the rootdir", default="goldens")
