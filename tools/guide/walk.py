"""The walk: the guide's blocks, in order, on a fresh project (`walk`).

A temporary folder holds the project (`tinymlp/`, a fresh `git init -b main`) and `tmp/`,
the commands' TMPDIR, which must be empty at the end (nothing left behind). The commands
run in the shell environment of a fresh user (`environment`): this interpreter's bin
folder first on PATH (the `parity` and `pytest` of the environment that runs the tool, an
editable install of this checkout), and none of the caller's XLA_*, JAX_*, PARITY_*,
PYTEST_*, GIT_*, PYTHONPATH, PYTHONDONTWRITEBYTECODE, PYTHONWARNINGS, CI or BUILD_NUMBER
(under either, pytest prints its summary lines whole), FORCE_COLOR, PY_COLORS or NO_COLOR.
Fixed on top: a git identity and no global or system git configuration, COLUMNS=80
(pytest's rule width), LC_ALL=C.UTF-8 (git's messages), XDG_CACHE_HOME beside the project
(`~/cache`: the user's cache folder, where `parity` keeps re-produced bases, so every walk
starts with none), PARITY_JAX_CACHE the caller's machine compilation cache (a program
compiled by an earlier walk or test is loaded, with the same bits), and
PYTHONUNBUFFERED=1, so that stdout and stderr, read through one pipe, interleave as on a
terminal (where stdout is line-buffered) instead of stdout arriving last.

Each command's output is normalised (`guide.normalise`) into the lines the guide shows.
Imports nothing of parity.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from guide.normalise import normalise, stand_in
from guide.parse import PROJECT, Block, GuideError

__all__ = ["COMMAND_TIMEOUT_S", "Hook", "Step", "Walk", "apply_edit", "environment", "walk"]

COMMAND_TIMEOUT_S = 300

# What the commands do not inherit from the caller: a fresh user's shell sets none of it.
_DROPPED_PREFIXES = ("XLA_", "JAX_", "PARITY_", "PYTEST_", "GIT_")
#: `CI` and `BUILD_NUMBER`: pytest stops shortening its summary lines when either is set, so
#: a walk under a CI runner printed what a user's terminal does not; the colour switches
#: would put escape codes into pytest's and rich's output.
_DROPPED = (
    "PYTHONPATH",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONWARNINGS",
    "CI",
    "BUILD_NUMBER",
    "FORCE_COLOR",
    "PY_COLORS",
    "NO_COLOR",
)
_IDENTITY = {
    "GIT_AUTHOR_NAME": "A. User",
    "GIT_AUTHOR_EMAIL": "user@example.com",
    "GIT_COMMITTER_NAME": "A. User",
    "GIT_COMMITTER_EMAIL": "user@example.com",
}


@dataclass(frozen=True)
class Step:
    """One command of a run block: `block` (its name), `command` (as the guide shows it),
    `returncode`, `output` (stdout and stderr as printed) and `shown` (normalised, the
    lines the guide shows after the command)."""

    block: str
    command: str
    returncode: int
    output: str
    shown: tuple[str, ...]


@dataclass(frozen=True)
class Walk:
    """A finished walk: `root` (the temporary folder), `project` (root/tinymlp), `tmp` (the
    commands' TMPDIR), `shas` (each commit's SHA to its stand-in) and `steps`, in order."""

    root: Path
    project: Path
    tmp: Path
    shas: Mapping[str, str]
    steps: tuple[Step, ...]

    def step(self, block: str, startswith: str = "") -> Step:
        """The first step of run block `block` whose command starts with `startswith`."""
        for s in self.steps:
            if s.block == block and s.command.startswith(startswith):
                return s
        raise KeyError(f"no command starting {startswith!r} in run block {block!r}")


def environment(tmp: Path) -> dict[str, str]:
    """A fresh user's shell environment for the commands, TMPDIR `tmp` (see the module
    docstring)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_DROPPED_PREFIXES) and k not in _DROPPED
    }
    bin_dir = str(Path(sys.executable).parent)
    env.update(_IDENTITY)
    env.update(
        PATH=os.pathsep.join([bin_dir, env.get("PATH", os.defpath)]),
        TMPDIR=str(tmp),
        COLUMNS="80",
        LC_ALL="C.UTF-8",
        PYTHONUNBUFFERED="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        # A fresh user's cache folder, beside the project: where re-produced bases go.
        XDG_CACHE_HOME=str(tmp.parent / "cache"),
        # The machine's jax compilation cache, the caller's: a cache hit gives the same
        # bits as a compile, so only the plugin's compile count differs (normalised).
        PARITY_JAX_CACHE=_compile_cache(),
    )
    return env


def _compile_cache() -> str:
    """The compilation cache the caller's parity uses (resolved by its plugin, or set by the
    user), else parity's default, `~/.cache/parity/jax`."""
    for name in ("PARITY_RESOLVED_JAX_CACHE", "PARITY_JAX_CACHE"):
        if os.environ.get(name):
            return os.environ[name]
    home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(home) / "parity" / "jax")


def apply_edit(path: Path, block: str) -> None:
    """Replace each top-level definition of `path` named in `block` (a function, a class,
    or an assignment to one name) by the block's. Raises `GuideError` when the block holds
    anything else or the file does not define the name exactly once."""
    source = path.read_text()
    old, new = ast.parse(source), ast.parse(block)
    lines = source.splitlines(keepends=True)
    block_lines = block.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for stmt in new.body:
        name = _defined_name(stmt)
        if name is None:
            raise GuideError(
                f"an edit of {path.name} may hold only definitions, got "
                f"{ast.get_source_segment(block, stmt)!r}"
            )
        same = [s for s in old.body if _defined_name(s) == name]
        if len(same) != 1:
            raise GuideError(f"{path.name} defines {name!r} {len(same)} times, expected once")
        text = "".join(block_lines[_first_line(stmt) - 1 : stmt.end_lineno])
        edits.append((_first_line(same[0]), same[0].end_lineno or same[0].lineno, text))
    for start, end, text in sorted(edits, reverse=True):
        lines[start - 1 : end] = [text]
    path.write_text("".join(lines))


def _defined_name(stmt: ast.stmt) -> str | None:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return stmt.name
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        return target.id if isinstance(target, ast.Name) else None
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return stmt.target.id
    return None


def _first_line(stmt: ast.stmt) -> int:
    decorators = getattr(stmt, "decorator_list", [])
    return min([stmt.lineno, *(d.lineno for d in decorators)])


def _commits(project: Path, env: Mapping[str, str]) -> dict[str, str]:
    """Every commit of the project (all refs), full SHA to stand-in; {} before the first.
    Raises `GuideError` for two commits with one subject: they would share a stand-in."""
    proc = subprocess.run(
        ["git", "log", "--all", "--format=%H %s"],
        cwd=project,
        env=dict(env),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        return {}
    pairs = [line.split(" ", 1) for line in proc.stdout.splitlines()]
    subjects = [subject for _, subject in pairs]
    twice = sorted({s for s in subjects if subjects.count(s) > 1})
    if twice:
        raise GuideError(f"commits of the walk share the subject(s) {twice}; give each its own")
    return {sha: stand_in(subject) for sha, subject in pairs}


def _run(command: str, previous: int, cwd: Path, env: Mapping[str, str]) -> tuple[int, str]:
    """`command` by bash in `cwd`, `$?` set to `previous`; its status and merged output. The
    command and its children run in a session of their own, killed as a whole at the
    timeout."""
    proc = subprocess.Popen(
        ["bash", "-c", f"(exit {previous}); {command}"],
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=COMMAND_TIMEOUT_S)
    except BaseException as e:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if isinstance(e, subprocess.TimeoutExpired):
            raise GuideError(f"{command!r} ran past {COMMAND_TIMEOUT_S} s and was killed") from None
        raise
    return proc.returncode, out.decode("utf-8", "replace")


Hook = Callable[[str, Path], None]


def walk(
    blocks: Sequence[Block],
    root: Path,
    *,
    before: Hook | None = None,
    after: Hook | None = None,
    echo: Callable[[str], None] | None = None,
) -> Walk:
    """Build the project in `root/tinymlp` and run the guide's blocks in order.

    **Arguments:**

    - `blocks`: the guide's blocks (`parse`).
    - `root`: a new or empty folder; the project and the commands' TMPDIR go there.
    - `before`, `after`: called with each command (as the guide shows it) and the project
      folder, just before and just after the command runs.
    - `echo`: receives one progress line per command.

    **Returns:** the `Walk`. Raises `GuideError` when a command exits non-zero and the
    next command of its block is not `echo $?`.
    """
    project, tmp = root / PROJECT, root / "tmp"
    project.mkdir(parents=True)
    tmp.mkdir()
    env = environment(tmp)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=project, env=env, check=True)
    steps: list[Step] = []
    shas: dict[str, str] = {}
    for block in blocks:
        if block.kind == "file":
            target = project / block.arg
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text)
        elif block.kind == "edit":
            apply_edit(project / block.arg, block.text)
        elif block.kind == "run":
            commands = block.commands
            previous = 0
            for k, command in enumerate(commands):
                if before is not None:
                    before(command, project)
                code, output = _run(command, previous, project, env)
                if after is not None:
                    after(command, project)
                shas.update(_commits(project, env))
                if echo is not None:
                    echo(f"[{block.arg}] $ {command}  (exit {code})")
                announced = k + 1 < len(commands) and commands[k + 1] == "echo $?"
                if code != 0 and not announced:
                    raise GuideError(
                        f"run block {block.arg!r} (docs/adopting.md:{block.line}): "
                        f"{command!r} exited {code}, and the guide does not follow it with "
                        f"`echo $?`; its output:\n{output}"
                    )
                shown = normalise(output, root=root, shas=shas).removesuffix("\n")
                steps.append(
                    Step(
                        block.arg,
                        command,
                        code,
                        output,
                        tuple(shown.split("\n")) if shown else (),
                    )
                )
                previous = code
    return Walk(root, project, tmp, dict(shas), tuple(steps))
