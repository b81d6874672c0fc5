"""tools/bench_suite.py's CPU seconds per test: what tests/conftest.py records where
`PARITY_COMPILE_LOG` is set, and how the tool adds the rows up."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# tools/ is on sys.path when the tool runs as a script.
sys.path.insert(0, str(ROOT / "tools"))
bench_suite = importlib.import_module("bench_suite")

#: A test that spends its CPU in a process it starts, as a test running the CLI does.
_BURNS_IN_A_CHILD = """
import subprocess, sys

def test_burns_in_a_child():
    code = "import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", code], check=True)

def test_does_nothing():
    pass
"""


def test_the_conftest_records_each_tests_cpu_with_the_processes_it_started(tmp_path):
    (tmp_path / "tests").mkdir()
    target = tmp_path / "tests" / "test_target.py"
    target.write_text(_BURNS_IN_A_CHILD)
    # The repository's conftest, beside the target, as the suite's tests have it.
    (tmp_path / "tests" / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    log = tmp_path / "log"
    log.mkdir()
    env = {**os.environ, "PARITY_COMPILE_LOG": str(log)}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         str(target)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for p in log.glob("tests-*.jsonl") for line in p.open()]
    by_name = {nodeid.split("::")[1]: (wall, cpu) for nodeid, wall, cpu in rows}
    assert set(by_name) == {"test_burns_in_a_child", "test_does_nothing"}
    wall, cpu = by_name["test_burns_in_a_child"]
    assert cpu >= 0.4 and wall >= 0.4, by_name  # the child's 0.4 s of CPU is counted
    assert by_name["test_does_nothing"][1] < 0.2, by_name


def test_rows_add_up_per_test_per_file_and_per_folder_most_cpu_first(tmp_path):
    rows = {
        "tests-1.jsonl": [["tests/a.py::t1", 2.0, 1.0], ["tests/b.py::t3", 1.0, 0.5]],
        "tests-2.jsonl": [["tests/a.py::t2", 3.0, 2.5], ["tests/a.py::t1", 1.0, 1.0],
                          ["tests/sub/c.py::t4", 4.0, 3.5]],
    }  # fmt: skip
    for name, lines in rows.items():
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in lines))
    (tmp_path / "7.json").write_text("{}")  # a compile log beside them is not read here
    by_test, by_file, by_folder = bench_suite._test_cpu(tmp_path)
    assert by_test == [(3.5, 4.0, "tests/sub/c.py::t4"), (2.5, 3.0, "tests/a.py::t2"),
                       (2.0, 3.0, "tests/a.py::t1"), (0.5, 1.0, "tests/b.py::t3")]  # fmt: skip
    assert by_file == [(4.5, 6.0, "tests/a.py"), (3.5, 4.0, "tests/sub/c.py"),
                       (0.5, 1.0, "tests/b.py")]  # fmt: skip
    assert by_folder == [(5.0, 7.0, "tests"), (3.5, 4.0, "tests/sub")]
