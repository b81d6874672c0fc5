"""`parity repin`, `parity check` as subprocesses on a numpy-only project: options,
outputs and exit codes (tests/tools/test_adopting_guide.py runs a JAX model end to end)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parity.machinery._config import find_pyproject

PRODUCERS = """\
import numpy as np
import tinylib

GROUPS = {"g": lambda: {"layers": [np.full(3, tinylib.VALUE * i, np.float32) for i in range(3)]}}
"""


def _one_line_error(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("parity: error: ")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture
def project(tmp_path: Path, git_project) -> Path:
    """Committed, nothing pinned yet."""
    return git_project(
        tmp_path, PRODUCERS, files={"src/tinylib/__init__.py": "VALUE = 1.0\n"}, pin=None
    )


def test_check_without_goldens_says_how_to_pin(project: Path, run_parity) -> None:
    _one_line_error(run_parity(project, "check"), "parity repin --base")


def test_repin_check_json_report_and_save_actual(project: Path, tmp_path: Path, run_parity) -> None:
    pinned = run_parity(project, "repin", "--base", "HEAD")
    assert pinned.returncode == 0, pinned.stderr
    assert "g: new file, 3 arrays" in pinned.stdout

    ok = run_parity(project, "check", "--json", str(tmp_path / "c.json"), "--report", "rep")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["checks"][0]["passed"] is True
    assert {p.name for p in (project / "rep").iterdir()} >= {"report.txt", "index.html"}

    # Uncommitted work is what `check` runs: the current tree.
    (project / "src" / "tinylib" / "__init__.py").write_text("VALUE = 1.5\n")
    bad = run_parity(project, "check", "--save-actual", "saved")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "first breaking its class: layers.1 [bitwise, fail]" in bad.stdout
    assert (project / "saved" / "g.h5").is_file()
    assert "python -m parity diff" in bad.stdout

    # Flags override [tool.parity]; a producer that cannot run is an input error.
    _one_line_error(run_parity(project, "check", "--groups", "nope"), "no group named 'nope'")
    broken = run_parity(project, "check", "--src", "nowhere")
    _one_line_error(broken, "producers cannot run")


def test_check_class_and_drift_and_repin_goldens_recover_speak_the_vocabulary(
    project: Path, tmp_path: Path, run_parity
) -> None:
    pinned = run_parity(project, "repin", "--base", "HEAD", "--goldens", "pins")
    assert pinned.returncode == 0, pinned.stderr
    assert (project / "pins" / "g.h5").is_file() and not (project / "goldens").exists()
    recovered = run_parity(project, "repin", "--recover", "--goldens", "pins")
    assert recovered.returncode == 0, recovered.stderr
    assert recovered.stdout == f"nothing to recover in {project / 'pins'}\n"
    # --class judges every key under one class; --drift strict passes where nothing drifted.
    c = tmp_path / "c.json"
    args = ("--goldens", "pins", "--class", "fp32_reassoc", "--drift", "strict", "--json", c)
    ok = run_parity(project, "check", *map(str, args))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert {f["class"] for f in json.loads(c.read_text())["findings"]} == {"fp32_reassoc"}
    _one_line_error(
        run_parity(project, "check", "--class", "nope"),
        "--class names the unknown tolerance class 'nope'",
    )


def test_repin_of_a_revision_that_is_not_a_commit_is_one_line(project: Path, run_parity) -> None:
    _one_line_error(run_parity(project, "repin", "--base", "no-such-rev"), "not a commit")


def test_save_actual_records_the_producer_process_environment_so_diff_sees_no_drift(
    project: Path, run_parity, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CLI process sets no XLA flags (the producer process does): a shell without them.
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert run_parity(project, "repin", "--base", "HEAD").returncode == 0
    (project / "src" / "tinylib" / "__init__.py").write_text("VALUE = 1.5\n")
    bad = run_parity(project, "check", "--save-actual", "saved")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    command = next(ln.strip() for ln in bad.stdout.splitlines() if "parity diff" in ln)
    diff = subprocess.run(
        command.replace("python", sys.executable, 1).split(),
        cwd=project,
        capture_output=True,
        text=True,
    )
    assert diff.returncode == 1, diff.stdout + diff.stderr
    assert "this is the environment they were pinned in" in diff.stdout, diff.stdout
    drift = [ln for ln in diff.stdout.splitlines() if "drift" in ln]
    assert not [ln for ln in drift if "isa_cap" in ln or "xla_flags" in ln], drift


def test_check_outside_a_project_says_no_table_was_found_and_where_it_looked(
    tmp_path: Path, run_parity
) -> None:
    outside = tmp_path / "somewhere" / "deep"
    outside.mkdir(parents=True)
    if find_pyproject(outside) is not None:
        pytest.skip(f"a pyproject.toml above {outside}: not outside a project here")
    proc = run_parity(outside, "check")
    _one_line_error(proc, "no [tool.parity] table")
    assert f"{outside}, {outside.parent}, {outside.parent.parent}" in proc.stderr
    assert 'producers = "' in proc.stderr and "pyproject.toml" in proc.stderr
    assert "golden folder" not in proc.stderr

    # A pyproject.toml without the table marks the root: the walk stops there.
    (tmp_path / "somewhere" / "pyproject.toml").write_text('[project]\nname = "x"\n')
    proc = run_parity(outside, "check")
    _one_line_error(proc, "no [tool.parity] table")
    assert f"{outside}, {outside.parent} " in proc.stderr
    assert str(tmp_path / "somewhere" / "pyproject.toml") in proc.stderr


def test_classes_only_on_a_truncated_golden_is_one_line_saying_to_pin_again(
    project: Path, run_parity
) -> None:
    pinned = run_parity(project, "repin", "--base", "HEAD")
    assert pinned.returncode == 0, pinned.stderr
    golden = project / "goldens" / "g.h5"
    data = golden.read_bytes()
    golden.write_bytes(data[: len(data) // 2])
    _one_line_error(run_parity(project, "repin", "--classes-only"), "pin it again")


def test_repin_refuses_a_class_map_naming_an_unknown_class_and_writes_nothing(
    project: Path, run_parity
) -> None:
    """A typo in CLASS_MAP (`fp32_reasoc`) is exit 2 before anything is produced or
    written, by `repin --base` and `repin --classes-only` alike: the rule's pattern, the
    bad name, the nearest known one and every known class are named."""
    assert run_parity(project, "repin", "--base", "HEAD").returncode == 0
    before = {p.name: p.read_bytes() for p in (project / "goldens").iterdir()}
    (project / "producers.py").write_text(
        PRODUCERS + 'CLASS_MAP = [("layers.0", "bitwise"), ("layers.*", "fp32_reasoc")]\n'
    )
    for args in (("--base", "HEAD"), ("--classes-only",)):
        proc = run_parity(project, "repin", *args)
        _one_line_error(proc, "the rule ('layers.*', 'fp32_reasoc') names the unknown tolerance")
        assert "did you mean 'fp32_reassoc'?" in proc.stderr, args
        assert "known classes: bf16_logits, bitwise, calibrated" in proc.stderr
        assert "[1/1] g: running" not in proc.stderr  # refused before any group ran
        assert {p.name: p.read_bytes() for p in (project / "goldens").iterdir()} == before


CRASHING = """\
import numpy as np


def _inner(x):
    raise ValueError(f"kaboom-48 on {x.shape}")


def _outer():
    return {"a": _inner(np.zeros(2))}


GROUPS = {"g": _outer}
"""


def test_a_producer_that_raises_shows_its_last_frames_and_where_its_log_is_kept(
    project: Path, run_parity
) -> None:
    """The producer's traceback, which was only in a log in the temp folder: its last
    frames and exception are printed above the one line, and the log is kept in the report
    folder where one is given, else in the one log folder (`PARITY_LOGS` here)."""
    import re

    assert run_parity(project, "repin", "--base", "HEAD").returncode == 0
    (project / "producers.py").write_text(CRASHING)
    logs, tmp = project.parent / "logs", project.parent / "tmp"
    for args, folder in (((), logs), (("--report", "rep"), project / "rep")):
        proc = run_parity(project, "check", *args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        *above, error = proc.stderr.rstrip("\n").splitlines()
        assert error.startswith("parity: error: the producers cannot run: group 'g' raised "
                                "ValueError: kaboom-48 on (2,)"), error  # fmt: skip
        frames = "\n".join(above)
        assert 'File "' in frames and "in _inner" in frames and "in _outer" in frames, frames
        assert 'raise ValueError(f"kaboom-48' in frames, frames
        named = re.search(r"\(output: (\S+)\)$", error)
        assert named, error
        log = Path(named.group(1))
        assert log.parent == folder and "Traceback (most recent call last)" in log.read_text()
        assert not [p.name for p in tmp.iterdir() if p.suffix == ".log"]
    assert (project / "rep" / "producers.log").is_file()
    # A repin says the same, and keeps its log in the log folder.
    proc = run_parity(project, "repin", "--base", "HEAD")
    assert proc.returncode == 2 and "in _inner" in proc.stderr, proc.stderr
    assert f"(output: {logs}/producers-" in proc.stderr


def test_the_log_folder_keeps_the_newest_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from parity.commands._common import KEPT_LOGS, keep_log

    monkeypatch.setenv("PARITY_LOGS", str(tmp_path / "logs"))
    made = []
    for i in range(KEPT_LOGS + 3):
        made.append(keep_log(f"run {i}"))
        time.sleep(0.002)  # distinct modification times
        monkeypatch.setattr("os.getpid", lambda i=i: 10_000 + i)  # distinct names
    kept = sorted(p.read_text() for p in (tmp_path / "logs").iterdir())
    assert len(set(made)) == KEPT_LOGS + 3
    assert kept == sorted(f"run {i}" for i in range(3, KEPT_LOGS + 3))


INNER_TEST = """\
import numpy as np


def test_g(parity_check):
    parity_check({"layers": [np.full(3, 1.0 * i, np.float32) for i in range(3)]}, "g")
"""


def test_check_and_the_plugin_refuse_a_class_map_naming_an_unknown_class(
    project: Path, run_parity
) -> None:
    """The CLASS_MAP typo a repin refuses is refused by `parity check` too (exit 2, one
    line, before any group runs) and by the pytest plugin (a usage error at session start,
    no test run), though both judge by the goldens' pinned map, which it leaves stale."""
    import os

    assert run_parity(project, "repin", "--base", "HEAD").returncode == 0
    (project / "test_g.py").write_text(INNER_TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PARITY_"))}
    inner = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--parity-jax-cache",
             "none", "-q", "test_g.py"]  # fmt: skip
    clean = subprocess.run(inner, cwd=project, env=env, capture_output=True, text=True)
    assert clean.returncode == 0, clean.stdout + clean.stderr  # the test itself passes
    (project / "producers.py").write_text(PRODUCERS + 'CLASS_MAP = [("layers.*", "fp32_reasoc")]\n')
    proc = run_parity(project, "check")
    _one_line_error(proc, "the rule ('layers.*', 'fp32_reasoc') names the unknown tolerance")
    assert "did you mean 'fp32_reassoc'?" in proc.stderr
    assert "[1/1] g: running" not in proc.stderr  # refused before any group ran
    plugin = subprocess.run(inner, cwd=project, env=env, capture_output=True, text=True)
    assert plugin.returncode == pytest.ExitCode.USAGE_ERROR, plugin.stdout + plugin.stderr
    errors = [ln for ln in plugin.stderr.splitlines() if ln.startswith("ERROR: ")]
    assert len(errors) == 1 and "'fp32_reasoc'" in errors[0], plugin.stderr
    assert "Traceback" not in plugin.stdout + plugin.stderr
    assert "passed" not in plugin.stdout
    # A producers file the table names but that is missing is not the session's concern
    # until something needs the producers: the golden check runs, as before.
    table = (project / "pyproject.toml").read_text()
    (project / "pyproject.toml").write_text(table.replace("producers.py", "missing.py"))
    missing = subprocess.run(inner, cwd=project, env=env, capture_output=True, text=True)
    assert missing.returncode == 0, missing.stdout + missing.stderr


@pytest.mark.parametrize(
    ("signum", "exit_code", "how"),
    [(signal.SIGINT, 130, "interrupted (Ctrl-C)"), (signal.SIGTERM, 143, "terminated (SIGTERM)")],
    ids=["SIGINT", "SIGTERM"],
)
def test_ctrl_c_or_sigterm_during_a_repin_is_one_line_and_the_goldens_untouched(
    project: Path, run_parity, git, signum: int, exit_code: int, how: str
) -> None:
    """SIGINT while the producers run (the user's Ctrl-C), or SIGTERM (`timeout N parity
    repin`): one line saying the repin was stopped and the goldens are untouched, no
    traceback, exit 130 or 143, no worktree left behind."""
    assert run_parity(project, "repin", "--base", "HEAD").returncode == 0
    before = {p.name: p.read_bytes() for p in (project / "goldens").iterdir()}
    marker = project.parent / "producing"
    (project / "producers.py").write_text(
        "import pathlib, time\n"
        + PRODUCERS.replace(
            "GROUPS = {",
            f"def _slow():\n    pathlib.Path({str(marker)!r}).touch()\n    time.sleep(120)\n\n\n"
            "GROUPS = {'slow': _slow, ",
        )
    )
    # SIGINT raising KeyboardInterrupt, as in the user's terminal (a background CI shell
    # hands its children SIGINT ignored: parity.machinery._signals).
    code = (
        "import signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from parity._cli import main\nsys.exit(main(['repin', '--base', 'HEAD']))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=project, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == exit_code, out + err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if not ln.startswith(("[producers]", "repin at"))]
    assert lines == [f"parity: repin {how}; the goldens in {project / 'goldens'} are untouched"], (
        err
    )
    assert {p.name: p.read_bytes() for p in (project / "goldens").iterdir()} == before
    worktrees = git(project, "worktree", "list", "--porcelain").splitlines()
    assert [ln for ln in worktrees if ln.startswith("worktree ")] == [f"worktree {project}"]


def test_check_finds_a_truncated_golden_before_the_producers_run(project: Path, run_parity) -> None:
    """A damaged golden file is exit 2 with the check's own message, found before the
    producers start (as `show` finds it), not after they ran."""
    assert run_parity(project, "repin", "--base", "HEAD").returncode == 0
    golden = project / "goldens" / "g.h5"
    data = golden.read_bytes()
    golden.write_bytes(data[: len(data) // 2])
    ran = project.parent / "producers-ran"
    (project / "producers.py").write_text(
        f"import pathlib\npathlib.Path({str(ran)!r}).touch()\n" + PRODUCERS
    )
    for args in ((), ("--groups", "g")):
        proc = run_parity(project, "check", *args)
        _one_line_error(proc, "golden group 'g' is unusable")
        assert "truncated" in proc.stderr and "[producers]" not in proc.stderr
        assert not ran.exists()


CALIBRATED = """\
import numpy as np

GROUPS = {"g": lambda: {"x": np.linspace(0, 1, 5, dtype=np.float32), "y": np.ones(3, np.float32)}}
CLASS_MAP = [("*", "calibrated")]
"""


def test_a_repin_of_unchanged_arrays_keeps_the_calibration_and_show_always_shows(
    tmp_path: Path, run_parity, git_project
) -> None:
    """After `calibrate --write`, a repin whose arrays are unchanged keeps every key's
    spread (and says so), so `check` and `show` work as before; `show` of a file whose
    calibrated keys have no spread still shows it, with the check's refusal as a note
    (issue 29)."""
    repo = git_project(tmp_path, CALIBRATED)
    uncalibrated = run_parity(repo, "show", "goldens/g.h5", "--json", "-")
    assert uncalibrated.returncode == 0, uncalibrated.stderr
    doc = json.loads(uncalibrated.stdout)
    assert {a["class"] for a in doc["arrays"]} == {"calibrated (no spread recorded)"}
    assert len(doc["notes"]) == 1 and "parity calibrate" in doc["notes"][0]
    _one_line_error(run_parity(repo, "check"), "parity calibrate")

    measured = run_parity(repo, "calibrate", "--groups", "g", "--perturb", "repeat", "--write")
    assert measured.returncode == 0, measured.stdout + measured.stderr
    assert run_parity(repo, "check").returncode == 0

    repinned = run_parity(repo, "repin", "--base", "HEAD")
    assert repinned.returncode == 0, repinned.stdout + repinned.stderr
    assert "g: 2 arrays, unchanged" in repinned.stdout
    assert "calibration kept: 2 keys' spreads, their arrays unchanged" in repinned.stdout
    checked = run_parity(repo, "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shown = run_parity(repo, "show", "goldens/g.h5", "--json", "-")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["notes"] == []


def test_bisect_and_calibrate_of_a_group_that_does_not_exist_name_it_and_list_the_groups(
    project: Path, run_parity, git
) -> None:
    """Not "pick commits that have what the producers need", nor "pin them first": the
    group does not exist, and the groups that do are listed (issue 29)."""
    pinned = run_parity(project, "repin", "--base", "HEAD")
    assert pinned.returncode == 0, pinned.stderr
    first = git(project, "rev-parse", "HEAD")
    (project / "src" / "tinylib" / "__init__.py").write_text("VALUE = 2.0\n")
    git(project, "commit", "-qam", "two")
    wanted = "no group named 'forwrd': the producers"
    for args in (("bisect", first, "HEAD"), ("calibrate", "--perturb", "repeat")):
        proc = run_parity(project, *args, "--groups", "forwrd")
        _one_line_error(proc, wanted)
        assert "define g; pass one of them to --groups" in proc.stderr


def test_repin_of_a_group_that_does_not_exist_says_so_once(project: Path, run_parity) -> None:
    """`repin --groups nope`: the one line naming the group and those defined, once (not
    followed by the runner's own log line run into it), and no producer log to look at."""
    proc = run_parity(project, "repin", "--base", "HEAD", "--groups", "nope")
    _one_line_error(proc, "no group named 'nope': the producers")
    error = next(ln for ln in proc.stderr.splitlines() if ln.startswith("parity: error: "))
    assert error.count("'nope'") == 1 and "unknown group(s)" not in error, error
    assert "producer output" not in error


PRODUCERS_BAC = (
    "import numpy as np\n\n"
    "GROUPS = {{'g': lambda: {{'b': {b}, 'a': np.zeros(3), 'c': np.arange(4.0)}}}}\n"
)
PRODUCERS_ABC = (
    "import numpy as np\n\n"
    "GROUPS = {{'g': lambda: {{'a': np.zeros(3), 'b': {b}, 'c': np.arange(4.0)}}}}\n"
)


def test_classes_only_with_order_rewrites_the_order_and_keeps_every_array(
    tmp_path: Path, run_parity, git_project
) -> None:
    """`repin --classes-only --order` takes the current producers' key order and nothing
    else: every array's checksum and the provenance's environment stay as pinned."""
    first = PRODUCERS_BAC.format(b="np.ones(2)")
    repo = git_project(tmp_path, first)
    before = json.loads(run_parity(repo, "show", "goldens/g.h5", "--json", "-").stdout)
    # The producers now return the same keys in another order (and another value, which
    # must not reach the golden: only the order is taken).
    (repo / "producers.py").write_text(PRODUCERS_ABC.format(b="np.full(2, 7.0)"))
    done = run_parity(repo, "repin", "--classes-only", "--order")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "g: 3 arrays, unchanged; 0 changed class; 2 changed place" in done.stdout
    after = json.loads(run_parity(repo, "show", "goldens/g.h5", "--json", "-", "--verify").stdout)
    assert after["verified"] == 3

    def places(doc: dict) -> list[str]:
        return [a["key"] for a in sorted(doc["arrays"], key=lambda a: a["order"])]

    assert places(before) == ["b", "a", "c"] and places(after) == ["a", "b", "c"]
    assert {k: v for k, v in after["provenance"].items() if k != "order"} == {
        k: v for k, v in before["provenance"].items() if k != "order"
    }
    # Each array's stored checksum is still that of the array first pinned (computed here
    # from the values, not read from a file).
    import numpy as np

    from parity.store import open_goldens
    from parity.store._dtypes import digest, to_storage

    pinned = {"b": np.ones(2), "a": np.zeros(3), "c": np.arange(4.0)}
    with open_goldens(repo / "goldens" / "g.h5") as gf:
        assert {k: gf.info(k).sha256 for k in gf} == {
            k: digest(to_storage(k, v)[0]) for k, v in pinned.items()
        }

    (repo / "producers.py").write_text(first.replace("'c'", "'d'"))
    _one_line_error(run_parity(repo, "repin", "--classes-only", "--order"), "--order only reorders")


def test_classes_only_that_changes_a_class_exits_as_its_help_says(project: Path, run_parity):
    # Issue 57: the help said exit 1 for a class moved, the command exits 0 (1 is kept for
    # an array whose bytes moved, which --classes-only never does).
    assert run_parity(project, "repin", "--base", "HEAD").returncode == 0
    producers = project / "producers.py"
    producers.write_text(PRODUCERS + 'CLASS_MAP = [("layers.*", "fp32_reassoc")]\n')
    done = run_parity(project, "repin", "--classes-only")
    assert "3 keys bitwise -> fp32_reassoc" in done.stdout, done.stdout + done.stderr
    helped = run_parity(project, "repin", "--help").stdout
    said = " ".join(helped.split())
    assert "Exit 0 pinned (with --classes-only: classes given, however many changed)" in said
    assert done.returncode == 0, done.stdout + done.stderr
