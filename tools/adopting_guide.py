#!/usr/bin/env python
"""docs/adopting.md as an executable document: its console blocks are what their commands
print, on a fresh throwaway project built from the guide's own file blocks.

    python tools/adopting_guide.py --check   # exit 1 with a unified diff if the guide drifted
    python tools/adopting_guide.py --write   # rewrite the console blocks from a fresh run
    python tools/adopting_guide.py --check --keep DIR   # leave the project in DIR/tinymlp

**The markers.** An HTML comment on the line before a fenced block says what the block is
(indented blocks, inside a list item, keep their indentation):

- `<!-- guide:file PATH -->`: the block is the whole file PATH of the project, written when
  the walk reaches it.
- `<!-- guide:edit PATH -->`: the block's top-level definitions (functions, classes, and
  assignments such as `CLASS_MAP = ...`) replace those of the same names in PATH.
- `<!-- guide:run NAME -->` ... `<!-- /guide:run -->` around a console block: its `$ `
  lines are run in order, each by bash in the project's folder, and the block is rewritten
  as those commands followed by their merged stdout and stderr. A command that exits non-zero
  must be followed by `echo $?` in the same block (`$?` is the previous command's status),
  so that a failure shows in the guide only where it is meant to; anywhere else it stops the
  walk.
- `<!-- guide:install -->`: the install commands; not run (see below).
- `<!-- guide:figure NAME REGEX -->FIGURE<!-- /guide:figure -->`, inline in prose: a
  figure quoted from what run block NAME printed (group 1 of REGEX's first match there),
  rewritten from every fresh run; so the prose's numbers are its output's, and a committed
  figure that disagrees with the output fails `--check` as a changed output line does.

**One source for the files: the guide.** The tool reads the file contents from the guide's
blocks rather than writing them into it, so the guide reads as prose around code in the
order a user meets it, an edit shows only the function that changes (the `lax.scan`
refactor, the bug, the new class map), and whoever edits a block in the guide changes what
runs: there is no second copy of tinymlp to keep in step. Commands come from the guide as
well, so `--write` only ever replaces output lines.

**The walk.** A temporary folder holds the project (`tinymlp/`, a fresh `git init -b main`)
and `tmp/`, the commands' TMPDIR, which must be empty at the end (nothing left behind). The
commands run in the shell environment of a fresh user: this interpreter's bin folder first
on PATH (the `parity` and `pytest` of the environment that runs the tool, an editable
install of this checkout), and none of the caller's XLA_*, JAX_*, PARITY_*, PYTEST_*, GIT_*,
PYTHONPATH, PYTHONDONTWRITEBYTECODE, PYTHONWARNINGS, CI or BUILD_NUMBER (under either,
pytest prints its summary lines whole), FORCE_COLOR, PY_COLORS or NO_COLOR. Fixed on top: a
git identity and no global or system git configuration, COLUMNS=80 (pytest's rule width),
LC_ALL=C.UTF-8 (git's messages), XDG_CACHE_HOME beside the project (`~/cache`: the
user's cache folder, where `parity` keeps re-produced bases), and PYTHONUNBUFFERED=1, so
that stdout and stderr, read
through one pipe, interleave as on a terminal (where stdout is line-buffered) instead of
stdout arriving last.

**Normalisation** (`normalise`), applied to every command's output before it is shown or
compared, replaces what differs between two runs on the same code and nothing else: the
temporary folder (`~`, so the project reads `~/tinymlp`); commit SHAs (each commit of the
project gets a stand-in derived from its subject, the same at every length git prints, so a
SHA in the bisect's answer matches the one in `git log`); any other hex string of 7+
characters with a letter and a digit (`<hex>`); git's dates (`<date>`, in `git revert`'s
summary); timings (`1.9s`, `12.3 s`, `40ms`: `<t>`); local ports (`localhost:<port>`);
and the host's list of XLA ISA caps in calibrate's header (`host ISA caps <this host's>`),
the one line that depends on the machine rather than the run. Numbers, keys, verdicts and
words are compared as printed; lines lose trailing whitespace. jaxlib's "[Gloo] Rank 0 is
connected to N peer ranks" lines are not normalised away: the multi-process launcher
echoes worker 0's output as it comes, and with jaxlib 0.10.2 it carries none.

**Processors.** Figures (values, ulps, spreads) are XLA's on the processor that ran the
walk: kernels differ between processors, so their last digits do. `--write` records that
processor in a `<!-- guide:host ... -->` line under the title; `--check` on the same
processor compares everything, on another every word, command, key and verdict but no
number (`masked`).

**Install** is not run: a fresh virtual environment would download jax, jaxlib and the rest
(hundreds of MB), which is not cheap enough for the test suite; the walk uses the
environment running this tool instead. The install block and the sentences about it are
checked against pyproject.toml and README.md (`install_problems`): the same pip commands
as README's, the distribution's name, its requirements, the jax floor, the extras, and the
`[tool.parity]` keys of the guide's pyproject against `parity.run.config.KEYS`.

Exit 0: the guide matches (`--check`) or was rewritten (`--write`); 1: it differs, an
install sentence disagrees with pyproject.toml or README.md, or the commands left something
in their TMPDIR; 2: the walk itself failed (a command failed where the guide does not show
it, a marker is malformed).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from parity.run.config import KEYS

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "adopting.md"
PROJECT = "tinymlp"
COMMAND_TIMEOUT_S = 300
PROMPT = "$ "

_MARKER = re.compile(
    r"^(?P<indent> *)<!-- guide:(?P<kind>file|edit|run|install)(?: (?P<arg>\S+))? -->$"
)
_END_RUN = "<!-- /guide:run -->"
_FENCE = "```"
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


class GuideError(Exception):
    """The walk cannot go on: a malformed marker, or a command that failed unannounced."""


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class Block:
    """One marked fenced block of the guide.

    **Fields:** `kind` (file, edit, run, install); `arg` (the path, or the run block's
    name); `line` (1-based line of the marker); `indent` (of marker and fences); `first`
    and `stop` (0-based indices of the first body line and of the closing fence); `body`
    (the body lines without the indentation).
    """

    kind: str
    arg: str
    line: int
    indent: str
    first: int
    stop: int
    body: tuple[str, ...]

    @property
    def commands(self) -> list[str]:
        """A run block's commands: its `$ ` lines, prompt removed."""
        return [ln[len(PROMPT) :] for ln in self.body if ln.startswith(PROMPT)]

    @property
    def text(self) -> str:
        """A file or edit block's content, ending in a newline."""
        return "\n".join(self.body) + "\n"


def parse(text: str) -> list[Block]:
    """The marked blocks of a guide, in order. Raises `GuideError` naming the line of a
    marker without its fenced block, a run block without its end marker or first command, a
    file path that leaves the project, or a run name used twice."""
    lines = text.split("\n")
    blocks: list[Block] = []
    for i, line in enumerate(lines):
        m = _MARKER.match(line)
        if m is None:
            continue
        indent, kind, arg = m["indent"], m["kind"], m["arg"] or ""
        where = f"docs/adopting.md:{i + 1}"
        if i + 1 >= len(lines) or not lines[i + 1].startswith(indent + _FENCE):
            raise GuideError(f"{where}: {line.strip()} is not followed by a ``` block")
        stop = next((j for j in range(i + 2, len(lines)) if lines[j] == indent + _FENCE), None)
        if stop is None:
            raise GuideError(f"{where}: the block after {line.strip()} is never closed")
        body = tuple(ln[len(indent) :] for ln in lines[i + 2 : stop])
        if kind in ("file", "edit") and (not arg or arg.startswith("/") or ".." in arg):
            raise GuideError(f"{where}: {kind} needs a path inside the project, got {arg!r}")
        if kind == "run":
            if not arg or any(b.kind == "run" and b.arg == arg for b in blocks):
                raise GuideError(f"{where}: a run block needs a name of its own, got {arg!r}")
            if stop + 1 >= len(lines) or lines[stop + 1] != indent + _END_RUN:
                raise GuideError(f"{where}: run block {arg!r} lacks {_END_RUN} after its ```")
            if not body or not body[0].startswith(PROMPT):
                raise GuideError(f"{where}: run block {arg!r} must start with a $ command")
        blocks.append(Block(kind, arg, i + 1, indent, i + 2, stop, body))
    return blocks


# --------------------------------------------------------------------------- normalising


def stand_in(subject: str) -> str:
    """The 40-hex-digit SHA shown for a commit with this subject (stable across runs)."""
    return hashlib.sha1(subject.encode()).hexdigest()


_HEX = re.compile(r"\b[0-9a-f]{7,40}\b")
_TIMING = re.compile(r"\b\d+(?:\.\d+)? ?(?:ms|s)\b")
_PORT = re.compile(r"\b(localhost|127\.0\.0\.1):\d+\b")
_HOST_CAPS = re.compile(r"host ISA caps [A-Z0-9_]+(?:, [A-Z0-9_]+)*")
# git's default date format, as `git revert` prints it ("Date: Wed Dec 2 06:12:14 2026 +0000")
_DATE = re.compile(
    r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) "
    r"+\d{1,2} \d\d:\d\d:\d\d \d{4} [+-]\d{4}\b"
)


def normalise(text: str, *, root: str | Path, shas: Mapping[str, str]) -> str:
    """What a run printed, with what differs between two runs of the same code replaced.

    **Arguments:**

    - `text`: the output.
    - `root`: the temporary folder of the walk; it reads `~` (its resolved form too).
    - `shas`: each commit's full SHA to its stand-in; every prefix of 7+ hex digits of a
      SHA becomes the stand-in's prefix of the same length.

    **Returns:** the text with the temporary folder, SHAs, other hex strings of 7+ characters
    that hold a letter and a digit, dates, timings, local ports and the host's ISA cap list
    replaced (see the module docstring), and trailing whitespace removed from every line.
    """
    for path in sorted({str(root), os.path.realpath(root)}, key=len, reverse=True):
        text = text.replace(path, "~")

    def sha(m: re.Match[str]) -> str:
        found = m[0]
        for real, shown in shas.items():
            if real.startswith(found):
                return shown[: len(found)]
        if re.search("[a-f]", found) and re.search("[0-9]", found):
            return "<hex>"
        return found

    text = _HEX.sub(sha, text)
    text = _DATE.sub("<date>", text)
    text = _TIMING.sub("<t>", text)
    text = _PORT.sub(r"\1:<port>", text)
    text = _HOST_CAPS.sub("host ISA caps <this host's>", text)
    return "\n".join(line.rstrip() for line in text.split("\n"))


# --------------------------------------------------------------------------- the walk


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
    )
    return env


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


# --------------------------------------------------------------------------- the guide


#: A figure the prose quotes from a run block's output: `<!-- guide:figure BLOCK REGEX -->`
#: then the figure, then `<!-- /guide:figure -->` (both invisible once rendered). `render`
#: puts group 1 of REGEX's first match in what BLOCK printed in its place.
_FIGURE = re.compile(r"<!-- guide:figure (\S+) (.+?) -->(.*?)<!-- /guide:figure -->")


def fill_figures(text: str, done: Walk) -> str:
    """`text` with every figure its prose quotes (`_FIGURE`) taken from what the named run
    block printed in `done`: the prose cannot disagree with its own output, on any
    processor. A figure whose pattern matches nothing, or names a block that printed
    nothing, is a `GuideError`."""
    printed: dict[str, list[str]] = {}
    for step in done.steps:
        printed.setdefault(step.block, []).extend(step.shown)

    def fill(m: re.Match[str]) -> str:
        block, pattern = m.group(1), m.group(2)
        found = re.search(pattern, "\n".join(printed.get(block, ())), re.MULTILINE)
        if found is None:
            raise GuideError(
                f"the prose quotes a figure /{pattern}/ from run block {block!r}, which "
                "printed no such line; fix the pattern or the prose"
            )
        return f"<!-- guide:figure {block} {pattern} -->{found.group(1)}<!-- /guide:figure -->"

    return _FIGURE.sub(fill, text)


def render(text: str, blocks: Sequence[Block], done: Walk) -> str:
    """The guide `text` with each run block's body replaced by its commands and what they
    printed (normalised), and each figure its prose quotes taken from that output
    (`fill_figures`)."""
    lines = text.split("\n")
    for block in sorted((b for b in blocks if b.kind == "run"), key=lambda b: -b.first):
        body: list[str] = []
        for step in (s for s in done.steps if s.block == block.arg):
            body.append(PROMPT + step.command)
            body.extend(step.shown)
        lines[block.first : block.stop] = [block.indent + ln if ln else ln for ln in body]
    return fill_figures("\n".join(lines), done)


#: The marker naming the processor whose run wrote the guide's console blocks.
HOST_MARKER = re.compile(r"^<!-- guide:host (.*) -->$", re.MULTILINE)
#: A number as the commands print it (not a digit inside a key such as `acts.1`).
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w])")


def this_host() -> str:
    """The processor of this machine as provenance records it (vendor, family, model and
    vector instruction sets): what XLA's kernels, and so the printed figures, depend on."""
    from parity.store.provenance import collect_provenance

    return str(collect_provenance()["cpu"])


def written_on(text: str) -> str | None:
    """The processor the guide's `<!-- guide:host ... -->` marker names, if any."""
    found = HOST_MARKER.search(text)
    return found.group(1) if found else None


def with_host(text: str, host: str) -> str:
    """`text` with its host marker naming `host` (added after the title if missing)."""
    line = f"<!-- guide:host {host} -->"
    if HOST_MARKER.search(text):
        return HOST_MARKER.sub(lambda _: line, text, count=1)
    title, _, rest = text.partition("\n")
    return f"{title}\n{line}\n{rest}"


def masked(text: str) -> str:
    """`text` with every printed number `<n>` and runs of spaces as one (table columns
    widen with their numbers): what a run on another processor must still print alike."""
    out = []
    for line in text.splitlines(keepends=True):
        out.append(re.sub(r" {2,}", " ", _NUMBER.sub("<n>", line)))
    return "".join(out)


def difference(committed: str, fresh: str, *, numbers: bool = True) -> str:
    """A unified diff from the committed guide to the freshly rendered one ('' if equal).

    With `numbers` False (a run on another processor than the one that wrote the guide:
    XLA's kernels, and so the last digits of every figure, differ between processors),
    numbers are left out of the comparison; commands, words, keys and verdicts are not."""
    if not numbers:
        committed, fresh = masked(committed), masked(fresh)
    return "".join(
        difflib.unified_diff(
            committed.splitlines(keepends=True),
            fresh.splitlines(keepends=True),
            "docs/adopting.md (committed)",
            "docs/adopting.md (fresh run)",
        )
    )


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------- install


def _names(listing: str) -> set[str]:
    """'jax, jaxlib, numpy and ml_dtypes' -> {'jax', 'jaxlib', 'numpy', 'ml-dtypes'}."""
    parts = re.split(r",\s*|\s+and\s+", listing.strip())
    return {p.strip("` ").lower().replace("_", "-") for p in parts if p.strip()}


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ @]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _pip_commands(block: str) -> set[str]:
    """Each `pip install ...` of a bash block (comments included), `<placeholders>` as
    `<…>` and spacing collapsed."""
    found = re.findall(r"pip install [^#\n]*", block)
    return {re.sub(r"<[^>]*>", "<…>", " ".join(c.split())) for c in found}


def _bash_block_after(text: str, heading: str) -> str:
    """The first ```bash block after the line `heading`."""
    start = text.index(heading)
    fence = text.index("```bash\n", start) + len("```bash\n")
    return text[fence : text.index("```", fence)]


_REPOSITORY_EXTRAS = {"test", "dev"}  # this repository's own (pyproject.toml says why)


def install_problems(guide: str, readme: str, pyproject: Mapping[str, object]) -> list[str]:
    """What section 1 of the guide says about installing that pyproject.toml or README.md
    contradicts, one sentence each ([] when they agree)."""
    project = pyproject["project"]
    assert isinstance(project, dict)
    problems: list[str] = []
    blocks = parse(guide)
    install = [b for b in blocks if b.kind == "install"]
    if len(install) != 1:
        return [f"the guide needs one <!-- guide:install --> block, found {len(install)}"]
    ours = _pip_commands(install[0].text)
    theirs = _pip_commands(_bash_block_after(readme, "## In your own project"))
    if ours != theirs:
        problems.append(
            f"the guide installs with {sorted(ours)}, README.md's 'In your own project' "
            f"with {sorted(theirs)}"
        )
    name = re.search(r"the distribution is `([^`]+)`", guide)
    if name is None or name[1] != project["name"]:
        problems.append(
            f"the guide should name the distribution `{project['name']}` "
            "('the distribution is `...`')"
        )
    required = {_requirement_name(r) for r in project["dependencies"]}
    for where, text in (("the guide", guide), ("README.md", readme)):
        said = re.search(r"requires\s+((?:[\w`]+,\s+)*[\w`]+\s+and\s+[\w`]+)", text)
        if said is None or _names(said[1]) != required:
            problems.append(
                f"{where} should say the distribution requires {sorted(required)} "
                f"(pyproject.toml), says {said[1] if said else 'nothing'!r}"
            )
    jax_floor = next(
        r.split(">=", 1)[1] for r in project["dependencies"] if _requirement_name(r) == "jax"
    )
    if f"{jax_floor} or newer" not in guide:
        problems.append(f"the guide should say jax {jax_floor} or newer (pyproject.toml)")
    extras = set(project["optional-dependencies"]) - _REPOSITORY_EXTRAS
    said_extras = re.search(r"optional extras: ([^.]*)\.", guide)
    named = set(re.findall(r"`([^`]+)`", said_extras[1])) if said_extras else set()
    if named != extras:
        problems.append(
            f"the guide's optional extras are {sorted(named)}, pyproject's {sorted(extras)}"
        )
    table = [b for b in blocks if b.kind == "file" and b.arg == "pyproject.toml"]
    keys = set()
    if table:
        parity_table = table[0].text.split("[tool.parity]", 1)[-1]
        keys = set(re.findall(r"^#? ?(\w+) = ", parity_table, re.MULTILINE))
    if keys != set(KEYS):
        problems.append(
            f"the guide's [tool.parity] shows the keys {sorted(keys)}; parity knows {sorted(KEYS)}"
        )
    return problems


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="docs/adopting.md's console blocks, checked against or rewritten from a "
        "fresh run of their commands on a throwaway project"
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff if it drifted")
    mode.add_argument("--write", action="store_true", help="rewrite the console blocks")
    parser.add_argument(
        "--keep", metavar="DIR", type=Path, help="walk in DIR (empty or new) and leave it"
    )
    args = parser.parse_args(argv)

    committed = GUIDE.read_text()
    try:
        blocks = parse(committed)
        problems = install_problems(
            committed,
            (ROOT / "README.md").read_text(),
            tomllib.loads((ROOT / "pyproject.toml").read_text()),
        )
        if problems:
            for p in problems:
                print(f"adopting_guide: {p}", file=sys.stderr)
            return 1
        root = args.keep or Path(tempfile.mkdtemp(prefix="adopting-guide-"))
        root.mkdir(parents=True, exist_ok=True)
        try:
            done = walk(blocks, root.resolve(), echo=lambda s: print(s, file=sys.stderr))
            left = sorted(p.name for p in done.tmp.iterdir())
        finally:
            if args.keep is None:
                shutil.rmtree(root, ignore_errors=True)
    except GuideError as e:
        print(f"adopting_guide: {e}", file=sys.stderr)
        return 2
    if left:
        print(f"adopting_guide: the commands left {left} in their TMPDIR", file=sys.stderr)
        return 1
    host = this_host()
    fresh = with_host(render(committed, blocks, done), host)
    same = written_on(committed) == host
    diff = difference(committed, fresh, numbers=same or args.write)
    if not same and not args.write:
        print(
            f"adopting_guide: written on another processor ({written_on(committed)}), so its "
            "figures are not compared here; commands, words, keys and verdicts are",
            file=sys.stderr,
        )
    if args.write:
        if diff:
            _write_atomically(GUIDE, fresh)
        state = "rewritten" if diff else "unchanged"
        print(f"docs/adopting.md: {state} ({len(done.steps)} commands)")
        return 0
    if diff:
        sys.stdout.write(diff)
        print(
            "adopting_guide: docs/adopting.md differs from a fresh run; if the new output is "
            "right, run python tools/adopting_guide.py --write and fix the prose around it",
            file=sys.stderr,
        )
        return 1
    print(f"docs/adopting.md matches a fresh run ({len(done.steps)} commands)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
