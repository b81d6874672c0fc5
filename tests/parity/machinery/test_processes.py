"""`parity check --processes N --devices M` on a throwaway project with a tiny JAX producer:
the run passes over 2 processes x 2 devices with the layout in its header, and every fault
(a producer raising on one process, a worker killed mid-run, a hang past the timeout, a
value that differs between processes) ends with exit 2 naming the worker, with no worker
process, coordinator port or temporary folder left behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

#: One worker runs this module, in file order: the waits at its end overlap the rest.
pytestmark = pytest.mark.xdist_group("processes")

PRODUCERS = '''\
"""A batch split over every process, doubled, and its sum; mode.txt picks a fault."""

import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

HERE = Path(__file__).parent
LATE_S = 40  # past gloo's fixed 30 s wait for a communicator's first collective


def g():
    mode = (HERE / "mode.txt").read_text().strip() if (HERE / "mode.txt").exists() else ""
    mesh = Mesh(np.array(jax.devices()), ("dp",))
    rows = 2 * jax.local_device_count()
    start = jax.process_index() * rows
    local = np.arange(start, start + rows, dtype=np.float32)
    x = jax.make_array_from_process_local_data(
        NamedSharding(mesh, PartitionSpec("dp")), local, (rows * jax.process_count(),)
    )
    if jax.process_index() == 1:
        if mode == "raise":
            raise RuntimeError("deliberate failure on process 1")
        if mode == "late":  # reaches the first collective long after process 0 does
            time.sleep(LATE_S)
        if mode in ("hang", "kill"):
            (HERE / "pid.txt").write_text(str(os.getpid()))
            time.sleep(3600)
    total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))(x)
    out = {"doubled": jax.jit(lambda x: 2.0 * x)(x), "total": total}
    if mode == "per_process":
        out["drawn"] = np.float32(jax.process_index())
    else:
        out["drawn"] = np.float32(0.0)
    return out


GROUPS = {"g": g}
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, git_project) -> Path:
    """A project pinned on 1 process x 4 devices."""
    files = {".gitignore": "mode.txt\npid.txt\n"}
    return git_project(
        tmp_path_factory.mktemp("mp"), PRODUCERS, files=files, pin=("--devices", "4")
    )


@pytest.fixture
def mode(project: Path):
    """Set the fault the producer injects; cleared after the test."""

    def set_mode(name: str) -> None:
        (project / "mode.txt").write_text(name)

    yield set_mode
    for name in ("mode.txt", "pid.txt"):
        (project / name).unlink(missing_ok=True)


def _workers_of(project: Path) -> list[int]:
    """Live processes whose command line names this project's producers (the workers)."""
    needle = str(project / "producers.py").encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline and b"_producer_runner" in cmdline:
            pids.append(int(entry.name))
    return pids


def _assert_nothing_left(project: Path, stderr: str) -> None:
    assert _workers_of(project) == [], "worker processes outlived the run"
    tmp = project.parent / "tmp"
    left = sorted(p.name for p in tmp.iterdir() if not p.name.startswith("parity-producers-"))
    assert left == [], f"temporary files left behind: {left}"
    logs = re.findall(r"\(output: (\S+)\)", stderr)
    assert logs, stderr
    port = re.search(r"joined the run at localhost:(\d+)", Path(logs[-1]).read_text())
    assert port, "the kept log does not name the coordinator"
    with socket.socket() as s:
        # Nobody listens on the coordinator's port any more (SO_REUSEADDR: connections of
        # the run may linger in TIME_WAIT, which is the kernel's, not a leftover).
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("localhost", int(port.group(1))))
        s.listen()


def _fault(stderr: str, needle: str) -> None:
    errors = [ln for ln in stderr.splitlines() if ln.startswith("parity: error: ")]
    assert len(errors) == 1 and needle in errors[0], stderr


@pytest.mark.usefixtures("waiting_runs")  # start the waits (end of the module) first
def test_check_over_two_processes_passes_and_records_the_layout(
    project: Path, run_parity, tmp_path: Path
) -> None:
    ok = run_parity(
        project, "check", "--processes", "2", "--devices", "2", "--report", str(tmp_path)
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert re.search(r"layout\s+2 processes x 2 devices \(4 in all\)", ok.stdout), ok.stdout
    assert "no array was sharded" not in ok.stderr  # the batch is split over the processes
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["header"]["layout"] == "2 processes x 2 devices (4 in all)"
    assert doc["checks"][0]["passed"] is True
    assert _workers_of(project) == []


def test_a_producer_raising_on_one_process_ends_the_run_naming_it(
    project: Path, run_parity, mode
) -> None:
    mode("raise")
    proc = run_parity(project, "check", "--processes", "2", "--devices", "2")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    _fault(proc.stderr, "process 1 of 2 exited with status 1")
    assert "RuntimeError: deliberate failure on process 1" in proc.stderr
    _assert_nothing_left(project, proc.stderr)


SLEEPING_PRODUCERS = """\
import time


def g():
    time.sleep(3600)


GROUPS = {"g": g}
"""


def test_a_hanging_single_process_producer_is_stopped_at_the_timeout(tmp_path: Path) -> None:
    """One producer process runs under the same supervisor as the workers of a
    multi-process run: given a timeout, a hang ends with the supervisor's verdict (as a
    `ProducerRunError`, the one error of a producer run) saying so, and no process is left."""
    from parity.machinery._launcher import ProducerRun, ProducerRunError, run_producers

    (tmp_path / "src").mkdir()
    (tmp_path / "out").mkdir()
    producers = tmp_path / "producers.py"
    producers.write_text(SLEEPING_PRODUCERS)
    with pytest.raises(ProducerRunError) as failed:
        run = ProducerRun(code_root=tmp_path, producers=producers, out=tmp_path / "out",
                          command="check", timeout=2.0)  # fmt: skip
        run_producers(run, progress=print)
    assert failed.value.worker == 0
    assert failed.value.reason.startswith("the run timed out after 2 s"), failed.value.reason
    assert "they were stopped" in failed.value.reason
    assert _workers_of(tmp_path) == [], "the producer process outlived the run"


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=lambda s: s.name)
def test_a_worker_killed_mid_run_ends_the_run_naming_it(project: Path, mode, signum) -> None:
    """SIGTERM as SIGKILL: jax's runtime takes SIGTERM for a preemption notice and would
    let the worker sleep on; `parity.machinery._worker.initialize` gives it back."""
    mode("kill")
    tmp = project.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "parity", "check", "--processes", "2", "--devices", "2"],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "TMPDIR": str(tmp)},
    )
    try:
        pid_file = project / "pid.txt"
        deadline = time.monotonic() + 240
        while not pid_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pid_file.exists(), "process 1 never reached its producer"
        time.sleep(0.2)  # the file is written before the sleep begins
        os.kill(int(pid_file.read_text()), signum)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2, stderr
    _fault(stderr, f"process 1 of 2 was killed by {signum.name}")
    _assert_nothing_left(project, stderr)


def test_workers_die_with_a_launcher_killed_by_sigkill(project: Path, mode, tmp_path: Path) -> None:
    """A launcher killed with SIGKILL runs no cleanup: the workers go by themselves (the
    kernel's parent-death signal), leaving no process behind. (Its temporary folder stays:
    this TMPDIR is the test's own, not the one the other tests inspect.)"""
    mode("hang")
    tmp = tmp_path
    launcher = subprocess.Popen(
        [sys.executable, "-m", "parity", "check", "--processes", "2", "--devices", "2"],
        cwd=project,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "TMPDIR": str(tmp)},
    )
    try:
        deadline = time.monotonic() + 240
        while not (project / "pid.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_workers_of(project)) == 2, "the two workers never started"
    finally:
        launcher.kill()
        launcher.wait()
    deadline = time.monotonic() + 60
    while _workers_of(project) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _workers_of(project) == [], "workers outlived their launcher"


def test_a_value_that_differs_between_processes_is_named(project: Path, run_parity, mode) -> None:
    mode("per_process")
    proc = run_parity(project, "check", "--processes", "2", "--devices", "2")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "process 1 holds other values for key 'drawn' than process 0" in proc.stderr
    _assert_nothing_left(project, proc.stderr)


def test_one_process_per_host_with_the_coordinator_of_host_0(project: Path) -> None:
    """The cluster form, both "hosts" on this machine: the same command on each, with the
    coordinator's address and the host's process id; process 0 checks and reports."""
    from parity.machinery._processes import free_port

    tmp = project.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TMPDIR": str(tmp)}
    base = [sys.executable, "-m", "parity", "check", "--processes", "2", "--devices", "2"]
    base += ["--coordinator", f"localhost:{free_port()}", "--process-id"]
    hosts = [
        subprocess.Popen([*base, str(i)], cwd=project, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
        for i in (1, 0)
    ]  # fmt: skip
    try:
        (out1, err1), (out0, err0) = (h.communicate(timeout=240) for h in hosts)
    finally:
        for h in hosts:
            if h.poll() is None:
                h.kill()
                h.communicate()
    assert [h.returncode for h in hosts] == [0, 0], err1 + err0
    assert "process 1 of 2 ran its part; process 0's host checks the outputs" in out1
    assert re.search(r"layout\s+2 processes x 2 devices", out0), out0
    assert "PASS g (0 of 3 arrays fail)" in out0, out0
    assert _workers_of(project) == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--processes", "2", "--process-id", "0"], "--coordinator and --process-id go together"),
        (["--coordinator", "h:1", "--process-id", "0"], "need a run of several processes"),
        (["--processes", "2", "--coordinator", "h:1", "--process-id", "2"], "not one of"),
        (["--processes", "2", "--timeout", "0"], "--timeout must be a positive number"),
        (["--processes", "0"], "processes must be a whole number of processes, at least 1"),
    ],
)
def test_multi_process_flags_are_checked_before_anything_runs(
    project: Path, run_parity, args: list[str], needle: str
) -> None:
    proc = run_parity(project, "check", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    _fault(proc.stderr, needle)
    assert "[producers]" not in proc.stderr


NUMPY_PRODUCERS = """\
import numpy as np

GROUPS = {"plain": lambda: {"x": np.arange(4, dtype=np.float32)}}
"""


def test_a_group_with_nothing_sharded_over_processes_says_so(
    tmp_path: Path, run_parity, git_project
) -> None:
    repo = git_project(tmp_path, NUMPY_PRODUCERS)
    proc = run_parity(repo, "check", "--processes", "2", "--devices", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hint = [ln for ln in proc.stderr.splitlines() if "no array was sharded" in ln]
    assert len(hint) == 1, proc.stderr
    assert "group 'plain'" in hint[0] and "2 processes" in hint[0]
    assert "docs/adopting.md section 7" in hint[0]


# --------------------------------------------------------------------------- the plugin

PLUGIN_TESTS = """\
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def _batch():
    mesh = Mesh(np.array(jax.devices()), ("dp",))
    host = np.arange(8, dtype=np.float32)
    sharding = NamedSharding(mesh, PartitionSpec("dp"))
    return jax.make_array_from_callback(host.shape, sharding, lambda i: host[i])


def test_sharded_over_processes(parity_check):
    assert jax.process_count() == 2 and jax.device_count() == 4
    y = jax.jit(lambda x: jnp.cumsum(x) * 0.5)(_batch())
    assert not y.is_fully_addressable
    parity_check({"y": y}, {"y": np.cumsum(np.arange(8, dtype=np.float32)) * 0.5},
                 name="sharded", class_map="bitwise")


def test_per_process_value(parity_check):
    if os.environ.get("PLUGIN_MODE") != "per_process":
        return
    parity_check({"v": np.float32(jax.process_index())}, {"v": np.float32(0)}, name="drawn")


def test_crash(parity_check):
    if os.environ.get("PLUGIN_MODE") == "crash" and jax.process_index() == 1:
        os._exit(3)
"""


def _pytest_in(project: Path, *args: str, mode: str = "") -> subprocess.CompletedProcess[str]:
    tmp = project.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARITY_", "PYTEST_"))}
    env |= {"PYTHONWARNINGS": "ignore", "TMPDIR": str(tmp), "PLUGIN_MODE": mode}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--parity-jax-cache", "none", *args],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.fixture(scope="module")
def plugin_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("mp_plugin") / "proj"
    repo.mkdir()
    (repo / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = ''\n")
    (repo / "test_sharded.py").write_text(PLUGIN_TESTS)
    return repo


def test_the_plugin_runs_a_session_over_two_processes_and_process_0_reports(
    plugin_project: Path,
) -> None:
    proc = _pytest_in(
        plugin_project, "--parity-processes", "2", "--parity-devices", "2",
        "--parity-report", "rep",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout  # process 0's session, shown
    doc = json.loads((plugin_project / "rep" / "report.json").read_text())
    assert doc["header"]["layout"] == "2 processes x 2 devices (4 in all)"
    assert [c["name"] for c in doc["checks"]] == ["sharded"]  # one report, process 0's
    assert doc["checks"][0]["passed"] is True


def test_the_plugin_takes_processes_from_tool_parity_as_the_command_line_does(
    plugin_project: Path, tmp_path: Path
) -> None:
    """`[tool.parity] processes` (and devices) resolve for the plugin by the path of the
    command line's: no option, the table's layout."""
    repo = tmp_path / "proj"
    repo.mkdir()
    (repo / "pyproject.toml").write_text(
        "[tool.pytest.ini_options]\naddopts = ''\n\n[tool.parity]\nprocesses = 2\ndevices = 2\n"
    )
    (repo / "test_sharded.py").write_text((plugin_project / "test_sharded.py").read_text())
    proc = _pytest_in(repo, "-k", "sharded", "--parity-report", "rep")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((repo / "rep" / "report.json").read_text())
    assert doc["header"]["layout"] == "2 processes x 2 devices (4 in all)"


def test_the_plugin_names_a_value_that_differs_between_processes(plugin_project: Path) -> None:
    proc = _pytest_in(
        plugin_project, "--parity-processes", "2", "--parity-devices", "2", mode="per_process"
    )
    # Process 0 compares its own value (0 against 0) and passes; process 1 takes that
    # verdict, finds its own arrays judged otherwise, and fails saying so.
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ended with different statuses [0, 1]" in proc.stderr


def test_the_plugin_ends_the_session_when_a_worker_dies(plugin_project: Path) -> None:
    proc = _pytest_in(
        plugin_project, "--parity-processes", "2", "--parity-devices", "2", mode="crash"
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "process 1 of 2 exited with status 3" in proc.stderr
    log = re.search(r"every process's output: (\S+)", proc.stderr)
    assert log and "--- process 1 ---" in Path(log.group(1)).read_text(), proc.stderr
    left = [p.name for p in (plugin_project.parent / "tmp").iterdir()]
    assert left == [Path(log.group(1)).name], f"temporary files left: {left}"


# --------------------------------------------------------------------------- the waits

#: The two runs that wait (gloo's 30 s, a 25 s timeout), each in its own copy of the pinned
#: project. They start with this module's first test and run in the background while the
#: module's other tests run on the same worker (the module is one `xdist_group`, its tests
#: in file order), so that their 40 s and 25 s overlap the rest instead of adding up on one
#: worker; the two tests at the end read their results.
WAITS = {
    "late": ("check", "--processes", "2", "--devices", "2"),
    "hang": ("check", "--processes", "2", "--devices", "2", "--timeout", "25"),
}


@pytest.fixture(scope="module")
def waiting_runs(
    project: Path, tmp_path_factory: pytest.TempPathFactory, start_parity
) -> Iterator[dict[str, tuple[Path, subprocess.Popen[str]]]]:
    """Each of `WAITS` started in the background on its own copy of `project` with its fault
    set: `{fault: (copy, the running command)}`. A run that no test read (its test was not
    selected) is stopped with SIGTERM at the end of the module, as a user's Ctrl-C would."""
    runs = {}
    for fault, args in WAITS.items():
        copy = tmp_path_factory.mktemp(f"mp-{fault}") / "proj"
        shutil.copytree(project, copy)
        (copy / "mode.txt").write_text(fault)
        runs[fault] = (copy, start_parity(copy, *args))
    try:
        yield runs
    finally:
        for _, proc in runs.values():
            if proc.poll() is None:
                proc.terminate()
            proc.communicate()


def _finished(run: subprocess.Popen[str]) -> tuple[int, str, str]:
    stdout, stderr = run.communicate(timeout=300)
    return run.returncode, stdout, stderr


def test_a_process_reaching_the_first_collective_40_s_late_is_waited_for(waiting_runs) -> None:
    """gloo waits 30 s at a communicator's first collective; the workers build the one over
    every device as they join (`parity.machinery._worker._open_communicator`), so a producer's
    first sum, reached 40 s apart (as when one process compiles a large program far
    behind the other), is waited for instead of ending the run."""
    copy, run = waiting_runs["late"]
    code, stdout, stderr = _finished(run)
    assert code == 0, stdout + stderr
    assert _workers_of(copy) == [], "worker processes outlived the run"


def test_a_hanging_worker_is_stopped_at_the_timeout(waiting_runs) -> None:
    copy, run = waiting_runs["hang"]
    code, stdout, stderr = _finished(run)
    assert code == 2, stdout + stderr
    _fault(stderr, "timed out after 25 s")
    assert "process 1:" in stderr  # the still-running workers' last lines
    _assert_nothing_left(copy, stderr)
