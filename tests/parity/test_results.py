"""`parity._results`: what a check hands back. The lines a report of several checks shows
beside its own header (`merged_header_lines`), and the `parity diff` command a failing
check names (`diff_command`), read back by the command line's own parser."""

from __future__ import annotations

import shlex
from pathlib import Path

from parity._cli import build_parser
from parity._results import CheckHeader, CheckResult, diff_command, merged_header_lines
from parity.judge._findings import Comparison
from parity.judge._tolerance import ClassMap


def _result(name: str, header: CheckHeader) -> CheckResult:
    return CheckResult(name=name, comparison=Comparison(()), header=header)


def test_shared_lines_show_once_and_each_check_s_own_lines_under_its_name() -> None:
    drift = ("devices 1 -> 4 (can move bits)",)
    sides = {"pinned_on": "cpu A", "checked_on": "cpu B"}
    a = _result("a", CheckHeader(**sides, drift=drift, reference="the goldens"))
    b = _result("b", CheckHeader(**sides, drift=drift, reference="a baseline"))
    c = _result("c", CheckHeader(pinned_on="tpu", checked_on="cpu B", reference="the goldens"))
    merged = merged_header_lines([a, b, c], {"layout": "1x4"})
    # each side's line and each drift line once, named after the first check that has it;
    # each check's reference under its own name
    assert merged == {
        "pinned on (a)": "cpu A",
        "checked on (a)": "cpu B",
        "drift 0 (a)": drift[0],
        "reference (a)": "the goldens",
        "reference (b)": "a baseline",
        "pinned on (c)": "tpu",
        "reference (c)": "the goldens",
    }
    # a line the report's own header already shows is not shown again
    assert "pinned on (a)" not in merged_header_lines([a], {"pinned on": "cpu A"})


def test_the_diff_command_reads_back_as_the_check_s_classes() -> None:
    caller = ClassMap(rules=(("layers.*", "fp32_reassoc"),), default="device_count")
    command = diff_command(Path("out/g.h5"), Path("goldens/g.h5"), [("head", "bitwise")], caller)
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "parity"]
    args = build_parser().parse_args(argv[3:])
    assert (args.actual, args.golden) == ("out/g.h5", "goldens/g.h5")
    # the check's overrides first, then the caller's rules, then its default as --class
    assert args.override == ["head=bitwise", "layers.*=fp32_reassoc"]
    assert args.class_name == "device_count"
