"""The suite's scheduling works under the installed pytest and pytest-xdist: tests marked with
one `xdist_group` run on one worker (`--dist loadgroup`, pyproject's addopts), which is what
lets a golden check and a live differential share one computed trajectory, and one walk of
the guide serve two tests. pytest 9.2 with pytest-xdist 3.8 schedules them apart without a
word (constraints.txt)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = """\
import os

import pytest


def _record(name):
    with open(os.environ["WHERE"], "a") as f:
        f.write(f"{name} {os.environ['PYTEST_XDIST_WORKER']}\\n")


@pytest.mark.xdist_group("together")
def test_a():
    _record("a")


@pytest.mark.xdist_group("together")
def test_b():
    _record("b")


@pytest.mark.parametrize("i", range(6))
def test_filler(i):
    _record(f"filler{i}")
"""


def test_an_xdist_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts =\n")
    where = tmp_path / "where.txt"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:parity",
         "-p", "no:cacheprovider", "-q", "test_grouped.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "WHERE": str(where)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = dict(line.split() for line in where.read_text().splitlines())
    assert len(ran) == 8, ran
    assert len(set(ran.values())) == 2, f"one worker ran everything: {ran}"
    assert ran["a"] == ran["b"], (
        f"tests of one xdist_group ran on {ran['a']} and {ran['b']}: --dist loadgroup does not "
        "group under this pytest and pytest-xdist; install under constraints.txt"
    )
