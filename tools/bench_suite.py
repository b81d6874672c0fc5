"""Wall time and XLA compilations of the test suite and of the main job, cold and warm.

    python tools/bench_suite.py                        # both, on a fresh clone of HEAD
    python tools/bench_suite.py --target suite --warm 2 --json suite.json

Each target runs in a fresh clone of this repository's HEAD (`git clone`: committed work
only), as CI does:

- `suite`: `bash .ci/run` (a fresh venv, the install, `pytest -n 2`), the README's test
  command;
- `equivalence`: `tox -e equivalence` (its own venv under `.tox`), the README's main job,
  with each layout's pytest time read from its output.

*Cold* is the first run: a fresh clone and an empty cache folder (`XDG_CACHE_HOME` points at
a new folder, so the jax compilation cache and the bases start empty; pip keeps the user's
download cache, `PIP_CACHE_DIR`). *Warm* runs again in the same clone with the same cache
folder. Every process parity starts writes how many programs it compiled and how many it
loaded from the cache (`PARITY_COMPILE_LOG`, `parity.machinery._compile_count`): the pytest
processes, xdist workers, the workers of a distributed session and the producer processes.
Subprocesses of the tests that are not parity's (a test's own `python -c` script) are not
counted. Prints, per run: seconds, CPU seconds (user + sys of every process it started:
less moved than the wall time by other load on a shared machine), the tests' outcome line,
compiles and cache loads, and the 20 slowest tests (pytest's `--durations`), and where XLA's
compile seconds went: the 20 tests and the 20 program names with the most (each with how
many programs were compiled and in how many processes: a name compiled in several processes
is a program compiled again that a shared cache or a shared fixture could have served), and
the 20 tests and 10 test files with the most CPU seconds, and every test folder's (the
pytest process's own and those of the processes it started and reaped during the test:
producers, CLI runs, compiles; recorded by tests/conftest.py where `PARITY_COMPILE_LOG` is
set). The folders say whose cost it is: the subject's tests (tests/decomp,
tests/equivalence), the harness's (tests/parity/...) or the tools' (tests/tools).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from parity.machinery._compile_count import LOG_VAR, Compiled, read_compiles, read_log

ROOT = Path(__file__).resolve().parents[1]

COMMANDS = {
    "suite": ["bash", ".ci/run"],
    "equivalence": [sys.executable, "-m", "tox", "-e", "equivalence"],
}

_OUTCOME = re.compile(r"^=+ (.*\b(?:passed|failed|error)\b.*) in ([\d.]+)s")
#: How many tests and program names the compile tables list.
TOP = 20
_DURATION = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)")


@dataclass
class Run:
    """One run of a target. `layouts`: each pytest session's outcome and seconds, in order."""

    target: str
    kind: str
    seconds: float
    returncode: int
    compiled: int
    loaded: int
    processes: int
    #: user + sys seconds of every process the run started (`RUSAGE_CHILDREN`): less moved by
    #: other load on a shared machine than the wall time, which waits for it.
    cpu_seconds: float = 0.0
    layouts: list[tuple[str, float]] = field(default_factory=list)
    slowest: list[tuple[float, str]] = field(default_factory=list)
    by_test: list[Compiled] = field(default_factory=list)
    by_program: list[Compiled] = field(default_factory=list)
    #: `(CPU seconds, wall seconds, test)` of the tests with the most CPU, then of the files,
    #: then of every test folder (whose test is it: the subject's, the harness's, the tools').
    cpu_by_test: list[tuple[float, float, str]] = field(default_factory=list)
    cpu_by_file: list[tuple[float, float, str]] = field(default_factory=list)
    cpu_by_folder: list[tuple[float, float, str]] = field(default_factory=list)


def _parse(output: str) -> tuple[list[tuple[str, float]], list[tuple[float, str]]]:
    layouts, slowest = [], []
    for line in output.splitlines():
        line = line.strip()
        if m := _OUTCOME.match(line):
            layouts.append((m.group(1), float(m.group(2))))
        elif m := _DURATION.match(line):
            slowest.append((float(m.group(1)), f"{m.group(2)} {m.group(3)}"))
    slowest.sort(reverse=True)
    return layouts, slowest[:20]


def run_once(target: str, kind: str, clone: Path, cache_home: Path, logs: Path) -> Run:
    log = logs / f"{target}-{kind}"
    log.mkdir(parents=True)
    env = dict(os.environ)
    for name in list(env):
        if name.startswith(("PARITY_", "JAX_", "PYTEST_", "TOX_")) or name == "VIRTUAL_ENV":
            env.pop(name)
    env["PIP_CACHE_DIR"] = env.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip"))
    env |= {"XDG_CACHE_HOME": str(cache_home), LOG_VAR: str(log)}
    t0, cpu0 = time.perf_counter(), _children_cpu()
    done = subprocess.run(
        COMMANDS[target], cwd=clone, env=env, capture_output=True, text=True, check=False
    )
    seconds, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    (logs / f"{target}-{kind}.out").write_text(done.stdout + done.stderr)
    counts = read_log(log)
    layouts, slowest = _parse(done.stdout)
    by_test, by_program = (read_compiles(log, by=by)[:TOP] for by in ("test", "program"))
    cpu_by_test, cpu_by_file, cpu_by_folder = _test_cpu(log)
    return Run(target, kind, round(seconds, 1), done.returncode, counts.compiled,
               counts.loaded, counts.processes, round(cpu, 1), layouts, slowest, by_test,
               by_program, cpu_by_test[:TOP], cpu_by_file[:10], cpu_by_folder)  # fmt: skip


def _test_cpu(log: Path) -> tuple[list[tuple[float, float, str]], ...]:
    """`(CPU seconds, wall seconds, name)` per test, per test file and per test folder, most
    CPU first, from the `tests-<pid>.jsonl` rows tests/conftest.py writes (a test run in
    several sessions, as the main job's layouts, adds up)."""
    tests: dict[str, list[float]] = {}
    files: dict[str, list[float]] = {}
    folders: dict[str, list[float]] = {}
    for path in sorted(log.glob("tests-*.jsonl")):
        for line in path.read_text().splitlines():
            nodeid, wall, cpu = json.loads(line)
            file = nodeid.split("::")[0]
            for table, key in ((tests, nodeid), (files, file), (folders, file.rpartition("/")[0])):
                sums = table.setdefault(key, [0.0, 0.0])
                sums[0] += cpu
                sums[1] += wall
    by_cpu = [
        sorted(((round(c, 1), round(w, 1), k) for k, (c, w) in table.items()), reverse=True)
        for table in (tests, files, folders)
    ]
    return by_cpu[0], by_cpu[1], by_cpu[2]


def _children_cpu() -> float:
    """User + sys seconds of this process's children so far: every process they started
    too, once each was waited for (a run's processes all are by the time it returns)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _print(run: Run) -> None:
    status = "ok" if run.returncode == 0 else f"EXIT {run.returncode}"
    cpu = f"{run.cpu_seconds:.0f} CPU-s"
    print(f"\n== {run.target}, {run.kind}: {run.seconds:.0f} s ({status}), {cpu}")
    print(
        f"   XLA: {run.compiled} compiled, {run.loaded} loaded from the cache, "
        f"over {run.processes} counted processes"
    )
    for outcome, seconds in run.layouts:
        print(f"   pytest: {outcome} in {seconds:.0f} s")
    if run.slowest:
        print("   slowest tests:")
        for seconds, name in run.slowest:
            print(f"   {seconds:8.1f} s  {name}")
    cpu_tables = (
        ("tests", run.cpu_by_test),
        ("test files", run.cpu_by_file),
        ("test folders", run.cpu_by_folder),
    )
    for title, cpu_rows in cpu_tables:
        if cpu_rows:
            print(f"   CPU seconds by {title} (with the processes each started; wall beside):")
            for cpu, wall, name in cpu_rows:
                print(f"   {cpu:8.1f} s  {wall:7.1f} s  {name}")
    for title, rows in (("tests", run.by_test), ("programs", run.by_program)):
        if rows:
            print(f"   compile seconds by {title} (programs compiled, in how many processes):")
            for r in rows:
                where = f"{r.programs:4d} in {r.processes:3d}"
                print(f"   {r.seconds:8.1f} s  {where}  {r.name or '-'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--target", choices=[*COMMANDS, "both"], default="both")
    p.add_argument("--warm", type=int, default=1, help="warm runs after the cold one")
    p.add_argument("--keep", action="store_true", help="keep the clone, caches and outputs")
    p.add_argument("--json", type=Path, help="write every run's figures here")
    args = p.parse_args(argv)
    targets = list(COMMANDS) if args.target == "both" else [args.target]
    work = Path(tempfile.mkdtemp(prefix="parity-bench-suite-"))
    runs: list[Run] = []
    for target in targets:
        clone, cache_home = work / f"{target}-clone", work / f"{target}-cache"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        for i in range(1 + args.warm):
            kind = "cold" if i == 0 else f"warm{i}"
            run = run_once(target, kind, clone, cache_home, work / "logs")
            runs.append(run)
            _print(run)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))
    if args.keep:
        print(f"\nkept: {work}")
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r.returncode == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
