"""Shared fixtures. Nothing here may import jax at module level: the parity plugin must set
the simulated device count before jax starts."""

import contextlib
import functools
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--across-processes",
        choices=("eval", "all"),
        default="eval",
        help="what tests/equivalence/test_across_processes.py runs: the eval group at 2x2 "
        "against its goldens (default), or the trajectories too, and each against a 1x4 "
        "run (all; tox -e equivalence)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `slow` run first, each group in its collected order. xdist hands out work
    in collection order, one unit at a time as a worker frees up: a test of a minute
    collected last keeps one worker busy while the other has nothing left to do, so the
    longest units go out first and the short ones fill in behind them."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def _cpu_seconds() -> float:
    """User + sys seconds of this process and of every process it started and waited for."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Where `PARITY_COMPILE_LOG` names a folder (tools/bench_suite.py), each test's wall and
    CPU seconds (setup, call and teardown; the CPU of this process and of the processes it
    reaped meanwhile: the producers and CLI runs a test starts) are appended to
    `tests-<pid>.jsonl` there, one `[nodeid, wall, cpu]` per line. On a machine whose other
    load moves wall times, the CPU seconds say which tests cost the suite its time."""
    folder = os.environ.get("PARITY_COMPILE_LOG")
    if not folder:
        yield
        return
    t0, cpu0 = time.perf_counter(), _cpu_seconds()
    yield
    row = [item.nodeid, time.perf_counter() - t0, _cpu_seconds() - cpu0]
    with open(Path(folder) / f"tests-{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


@pytest.fixture(scope="session")
def git() -> Callable[..., str]:
    """`git(repo, *args) -> stdout`, with a fixed identity, for throwaway repositories."""
    return _git


def _parity_env(repo: Path) -> dict[str, str]:
    """The environment of `python -m parity` run in `repo` by a test."""
    # A private TMPDIR: what the commands leave behind is visible, and nobody else's
    # cleanup of a shared /tmp can pull a worktree away mid-run.
    tmp = repo.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    # A private cache of baselines too (parity.run._baseline), and a private folder for the
    # logs of failed producer runs (parity.commands._common.log_folder): never the user's.
    # The command line reads PARITY_DEVICES as the plugin does: an outer
    # `PARITY_DEVICES=4 pytest` must not move the layout these projects pin and check.
    return {
        **{k: v for k, v in os.environ.items() if k != "PARITY_DEVICES"},
        "PYTHONWARNINGS": "ignore",
        "TMPDIR": str(tmp),
        "PARITY_BASELINE_CACHE": str(repo.parent / "baselines"),
        "PARITY_LOGS": str(repo.parent / "logs"),
    }


def _run_parity(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "parity", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        env=_parity_env(repo),
        timeout=300,
    )


def _start_parity(repo: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "parity", *args],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_parity_env(repo),
    )


@pytest.fixture(scope="session")
def run_parity() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`run_parity(repo, *args)`: `python -m parity ARGS` in `repo`, TMPDIR beside it."""
    return _run_parity


def _run_pytest(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PARITY_"))}
    paths = [str(repo / "src"), str(repo), *filter(None, [os.environ.get("PYTHONPATH")])]
    env |= {"PYTHONPATH": os.pathsep.join(paths),
            "PARITY_BASELINE_CACHE": str(repo.parent / "baselines")}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=repo, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="session")
def run_pytest() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`run_pytest(repo, *args)`: `python -m pytest -q ARGS` in `repo` as its user runs it
    (its `src` and itself on the path, no outer PYTEST_ or PARITY_ variable), the baselines
    cached beside it."""
    return _run_pytest


@pytest.fixture(scope="session")
def start_parity() -> Callable[..., subprocess.Popen[str]]:
    """`start_parity(repo, *args)`: what `run_parity` runs, started and not waited for (its
    output on pipes)."""
    return _start_parity


def _built_key(
    producers: str | None,
    table: str | None,
    files: Mapping[str, str | Path] | None,
    pin: Sequence[str],
    message: str,
    branch: str | None,
) -> str:
    """What a pinned project was built from, as a folder name under `git_project`'s kept
    projects."""
    h = hashlib.sha256()
    for part in (producers, table, tuple(pin), message, branch, os.environ.get("XLA_FLAGS")):
        h.update(repr(part).encode() + b"\0")
    for rel, content in sorted((files or {}).items()):
        h.update(rel.encode() + b"\0")
        if isinstance(content, Path):  # a folder: its files' paths and bytes
            for f in sorted(content.rglob("*")):
                if f.is_file() and "__pycache__" not in f.parts:
                    h.update(f.relative_to(content).as_posix().encode() + f.read_bytes())
        else:
            h.update(content.encode())
        h.update(b"\0")
    return h.hexdigest()


def _git_project(
    kept_root: Path,
    root: Path,
    producers: str | None = None,
    table: str | None = 'producers = "producers.py"\n',
    files: Mapping[str, str | Path] | None = None,
    *,
    pin: Sequence[str] | None = (),
    message: str = "one",
    branch: str | None = "main",
) -> Path:
    repo = root / "proj"
    # A pinned project is kept as it was right after its pin, under what it was built from:
    # a test asking for the same project again gets a copy (the same commit, the same golden
    # files), not another `parity repin` (a process that imports jax, a worktree, a
    # producer process).
    kept = None
    if pin is not None:
        kept = kept_root / _built_key(producers, table, files, pin, message, branch) / "proj"
    if kept is not None and kept.is_dir():
        shutil.copytree(kept, repo, symlinks=True)
        # The copy's files have new inodes and times: git refreshes its index now, as it
        # would have after a commit in place, so no later status rewrites it.
        _git(repo, "update-index", "-q", "--refresh")
        return repo
    repo.mkdir()
    if producers is not None:
        (repo / "producers.py").write_text(producers)
    for rel, content in (files or {}).items():
        if isinstance(content, Path):
            shutil.copytree(content, repo / rel, ignore=shutil.ignore_patterns("__pycache__"))
            continue
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(content)
    if table is not None:
        (repo / "pyproject.toml").write_text(f"[tool.parity]\n{table}")
    _git(repo, "init", "-q", *(("-b", branch) if branch else ()))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", message)
    if pin is not None:
        pinned = _run_parity(repo, "repin", "--base", "HEAD", *pin)
        assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    if kept is not None:  # copied aside, then renamed: a kept project is whole or absent
        partial = kept.parent / "partial"
        shutil.copytree(repo, partial, symlinks=True)
        partial.rename(kept)
    return repo


@pytest.fixture(scope="session")
def git_project(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`git_project(root, producers=None, table=..., files=None, *, pin=(), message="one",
    branch="main") -> root/proj`: a git repository with one commit (`message`, on `branch`;
    None: git's default) of a producers file (None: none), a `[tool.parity]` table (its body
    `table`; None: no pyproject.toml) and `files` (relative path -> text, or a folder that is
    copied without its `__pycache__`), then goldens pinned at that commit by `parity repin
    --base HEAD *pin` (None: nothing pinned). Session-scoped, so a module-scoped fixture can
    build its project under `tmp_path_factory`. A project pinned before in this process from
    the same producers, table, files, pin arguments, message, branch and `XLA_FLAGS` is
    copied, not pinned again (kept under this session's `pinned-projects`, `_built_key`)."""
    return functools.partial(_git_project, tmp_path_factory.mktemp("pinned-projects"))


def _checkout_snapshot(repo: Path) -> dict[str, str]:
    out = {}
    for p in sorted(repo.rglob("*")):
        rel = p.relative_to(repo).as_posix()
        if p.is_file() and not rel.startswith(".git/logs"):
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    out["<head>"] = _git(repo, "rev-parse", "HEAD")
    out["<status>"] = _git(repo, "--no-optional-locks", "status", "--porcelain")
    out["<branches>"] = _git(repo, "branch", "-a", "-v")
    out["<worktrees>"] = _git(repo, "worktree", "list", "--porcelain")
    return out


@pytest.fixture(scope="session")
def checkout_snapshot() -> Callable[[Path], dict[str, str]]:
    """`checkout_snapshot(repo)`: every file of the checkout (working tree and .git, minus
    reflogs) by hash, plus HEAD, status, branches and worktrees: a tool that must not touch
    the user's checkout leaves it equal."""
    return _checkout_snapshot


_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


@contextlib.contextmanager
def _compile_events() -> Iterator[list[str]]:
    import jax

    events: list[str] = []

    def listener(event: str, duration: float, **kwargs: Any) -> None:
        if event in _COMPILE_EVENTS:
            events.append(f"{event} {kwargs.get('fun_name', '')}")

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


@pytest.fixture(scope="session")
def compile_events() -> Callable[[], contextlib.AbstractContextManager[list[str]]]:
    """`with compile_events() as events:` collects the trace, lowering and backend-compile
    events jax raises inside the block (a step that reuses its program raises none)."""
    return _compile_events
