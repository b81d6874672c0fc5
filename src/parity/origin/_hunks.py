"""Which edit of the diff made the origin (issue 74): a named origin held against the
hunks between the base and the tree, so that a constant set in a constructor is named at
the line that sets it, not only where the program uses it.

**Evidence,** asked in this order; the first kind that some hunk bears decides, and every
hunk that bears it is said (the best first):

1. *the constant*: the hunk's added lines write the origin's changed constant as a literal
   (`1e-6` for a recorded `1e-06`; equal as the float32 the program holds), and its
   removed lines the base's where the base had one (such a hunk comes first);
2. *the dtype*: for a changed dtype, the added lines name the new dtype (`bfloat16`,
   `jnp.float16`, `"f32"`), and the removed lines the base's (such a hunk comes first);
3. *a frame*: a line the origin's call chain ran through, or a place its change names (the
   value read, the base's cast not made), lies in the hunk: on the tree's lines it added,
   or on the base's lines it removed;
4. *a function*: the hunk lies inside a function the call chain ran through (the tree's
   source read with `ast`), the innermost first;
5. *the only edit*: the diff holds this one hunk.

Where none bears any, the answer says so: no edit of the diff sets it (the difference came
from elsewhere: a file outside the diff, the environment, the data).

Nothing here imports jax or runs git: a face hands in the diff's text (`git diff -U0`, or
`difflib`'s for two live functions: `parse_diff`) and the tree's text of the files it
touches (`Diff`).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parity.origin._change import frame_parts
from parity.origin._origin import Origin

__all__ = ["Diff", "Edit", "Hunk", "edit_of", "parse_diff", "sources_diff"]

#: At most this many hunks are named where several bear the same evidence.
SHOWN = 3

_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
#: A number as Python writes one (no sign: `-1e-5` is a negation of a literal).
_NUMBER = re.compile(
    r"(?<![\w.])(?:\d[\d_]*\.?[\d_]*(?:[eE][-+]?\d+)?|\.\d[\d_]*(?:[eE][-+]?\d+)?)"
)


@dataclass(frozen=True)
class Hunk:
    """One hunk of a diff with no context lines: `file` (the tree's path) and `start`, the
    tree's first line of `added` (the lines the tree has instead of `removed`);
    `base_file` and `base_start`, the base's path and first line of `removed`. Where the
    hunk only removes, `start` is the tree's line after which the removed lines stood, as
    the diff says; where it only adds, `base_start` is the base's line after which."""

    file: str
    start: int
    added: tuple[str, ...]
    base_file: str
    base_start: int
    removed: tuple[str, ...]

    def holds(self, line: int) -> bool:
        """Whether the tree's `line` is one the hunk wrote (or, for a removal, borders it)."""
        if self.added:
            return self.start <= line < self.start + len(self.added)
        return line in (self.start, self.start + 1)

    def base_holds(self, line: int) -> bool:
        """Whether the base's `line` is one the hunk removed (or, for an addition, borders)."""
        if self.removed:
            return self.base_start <= line < self.base_start + len(self.removed)
        return line in (self.base_start, self.base_start + 1)

    @property
    def place(self) -> str:
        """`file:line`, or `file:first-last` for several lines (the base's where it adds none)."""
        file, start, n = (
            (self.file, self.start, len(self.added))
            if self.added
            else (self.base_file, self.base_start, len(self.removed))
        )
        return f"{file}:{start}" if n <= 1 else f"{file}:{start}-{start + n - 1}"

    @property
    def shown(self) -> str:
        """The hunk in a few words: its first added line, else the first it removes."""
        lines = [ln.strip() for ln in self.added if ln.strip()]
        if lines:
            text = lines[0]
        else:
            gone = [ln.strip() for ln in self.removed if ln.strip()]
            text = f"removes {gone[0]}" if gone else "removes blank lines"
        more = " ..." if len(lines) > 1 else ""
        return f"`{text[:72]}`{more}"


@dataclass(frozen=True)
class Diff:
    """What a face knows of how the tree differs from the base: `hunks` (in the diff's
    order), `sources` (the tree's text of each file they touch, by the tree's path: to find
    the functions a hunk lies in), `between` (the two sides, for the lines: `"the base
    1a2b3c4d5e6f and the working tree"`)."""

    hunks: tuple[Hunk, ...]
    sources: Mapping[str, str] = field(default_factory=dict)
    between: str = "the base and the tree"


@dataclass(frozen=True)
class Edit:
    """The edit of a diff that made an origin: `hunks`, those that bear the strongest
    evidence any hunk bears (best first; none where no hunk does), `evidence` (which kind:
    `constant`, `frame`, `function`, `only` or `none`), `why` (what it is, in one clause),
    `of` (how many hunks the diff holds), `between` (the diff's two sides)."""

    hunks: tuple[Hunk, ...]
    evidence: str
    why: str
    of: int
    between: str = "the base and the tree"

    @property
    def line(self) -> str:
        """The clause the origin's line ends with: `the edit: src/gpt.py:8 `EPS = 1.1e-5`:
        it writes the constant 1.1e-05, where the base's line wrote 1e-05`."""
        if not self.hunks:
            return f"the edit: {self.why}"
        named = ", ".join(f"{h.place} {h.shown}" for h in self.hunks[:SHOWN])
        if len(self.hunks) == 1:
            return f"the edit: {named}: {self.why}"
        more = f" (and {len(self.hunks) - SHOWN} more)" if len(self.hunks) > SHOWN else ""
        return f"the edit: one of {len(self.hunks)} hunks that {self.why}: {named}{more}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, as `from_dict` reads back."""
        return {
            "hunks": [
                vars(h) | {"added": list(h.added), "removed": list(h.removed)} for h in self.hunks
            ],
            "evidence": self.evidence,
            "why": self.why,
            "of": self.of,
            "between": self.between,
            "line": self.line,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Edit:
        """Read back what `to_dict` wrote (after a JSON round trip)."""
        hunks = tuple(
            Hunk(
                str(h["file"]),
                int(h["start"]),
                tuple(h["added"]),
                str(h["base_file"]),
                int(h["base_start"]),
                tuple(h["removed"]),
            )
            for h in data["hunks"]
        )
        return cls(hunks, data["evidence"], data["why"], int(data["of"]), data["between"])


def parse_diff(text: str) -> tuple[Hunk, ...]:
    """The hunks of a unified diff (`git diff -U0`, `difflib.unified_diff(n=0)`), with the
    paths after `a/` and `b/` (or as written; "" for `/dev/null`, a side with no file).
    Each hunk's lines are counted by its header, so a removed line that reads `-- x` is
    never taken for a file's header."""
    hunks: list[Hunk] = []
    base_file = file = ""
    lines = text.splitlines()
    k = 0
    while k < len(lines):
        raw = lines[k]
        k += 1
        if raw.startswith("--- ") and k < len(lines) and lines[k].startswith("+++ "):
            base_file, file = _path(raw[4:], "a/"), _path(lines[k][4:], "b/")
            k += 1
            continue
        found = _HEADER.match(raw)
        if found is None:
            continue
        n_removed = 1 if found.group(2) is None else int(found.group(2))
        n_added = 1 if found.group(4) is None else int(found.group(4))
        removed: list[str] = []
        added: list[str] = []
        while k < len(lines) and (len(removed) < n_removed or len(added) < n_added):
            body = lines[k]
            k += 1
            if body.startswith("-") and len(removed) < n_removed:
                removed.append(body[1:])
            elif body.startswith("+") and len(added) < n_added:
                added.append(body[1:])
            elif not body.startswith("\\"):  # a context line (a diff with context)
                break
        start, base_start = int(found.group(3)), int(found.group(1))
        hunks.append(Hunk(file, start, tuple(added), base_file, base_start, tuple(removed)))
    return tuple(hunks)


def _path(text: str, prefix: str) -> str:
    name = text.split("\t")[0].strip()
    return name.removeprefix(prefix) if name != "/dev/null" else ""


def edit_of(origin: Origin, diff: Diff) -> Edit:
    """The edit of `diff` that made `origin` (the module docstring's evidence, in order)."""
    hunks = [h for h in diff.hunks if h.added or h.removed]
    if not hunks:
        why = f"none: the source does not differ between {diff.between}"
        return Edit((), "none", f"{why} (the difference came from elsewhere)", 0, diff.between)
    asked: Sequence[tuple[str, Callable[[Hunk], float | None], str]] = (
        ("constant", lambda h: _writes(h, origin.constants), _wrote(origin.constants)),
        ("dtype", lambda h: _names_dtype(h, origin.dtypes), _dtype_said(origin.dtypes)),
        ("frame", lambda h: _ran_through(h, origin), "hold a line its call chain ran through"),
        (
            "function",
            lambda h: _inside(h, origin, diff.sources),
            "lie in a function its call chain ran through",
        ),
    )
    for evidence, score, why in asked:
        scored = [(s, k) for k, h in enumerate(hunks) if (s := score(h)) is not None]
        if scored:
            best = tuple(hunks[k] for _, k in sorted(scored))
            said = _one(evidence, best[0], origin, diff.sources) if len(best) == 1 else why
            return Edit(best, evidence, said, len(hunks), diff.between)
    if len(hunks) == 1:
        return Edit(tuple(hunks), "only", f"the only edit between {diff.between}", 1, diff.between)
    writes = f"writes the constant {origin.constants[0]}, " if origin.constants else ""
    writes += f"names the dtype {origin.dtypes[0]}, " if origin.dtypes else ""
    none = (
        f"none of the {len(hunks)} hunks between {diff.between} {writes}"
        "holds a line its call chain ran through or lies in a function it ran through: no "
        "edit of the diff sets it"
    )
    return Edit((), "none", none, len(hunks), diff.between)


def _wrote(constants: Sequence[str]) -> str:
    return f"write the constant {constants[0]}" if constants else "write its constant"


def _one(evidence: str, hunk: Hunk, origin: Origin, sources: Mapping[str, str]) -> str:
    """Why the one hunk that bears `evidence` made the origin, in one clause."""
    if evidence == "constant":
        now, then = (*origin.constants, "none")[:2]
        base = (
            f", where the base's lines wrote {then}"
            if then != "none" and _writes_one(hunk.removed, then)
            else ""
        )
        return f"it writes the constant {now}{base}"
    if evidence == "dtype":
        now, then = (*origin.dtypes, "")[:2]
        base = (
            f", where the base's lines named {then}" if then and _names(hunk.removed, then) else ""
        )
        return f"it names the dtype {now}{base}"
    if evidence == "frame":
        for frame, base in _frames(origin):
            file, line, function = frame_parts(frame)
            if (hunk.base_holds(line) and file == hunk.base_file) if base else hunk.holds(line):
                side = "the base's line " if base else ""
                return (
                    f"it holds {side}{file}:{line} in {function}, where the operation's chain runs"
                )
    scope = _enclosing(hunk, origin, sources)
    return f"inside {scope}, which the operation's call chain runs through"


def _writes(hunk: Hunk, constants: Sequence[str]) -> float | None:
    """0 where `hunk` writes the new constant and removes the base's, 1 where it writes
    the new one only (a small integer alone is too common to be evidence), else None."""
    if not constants or not _writes_one(hunk.added, constants[0]):
        return None
    if any(_writes_one(hunk.removed, then) for then in constants[1:] if then != "none"):
        return 0
    value = _number(constants[0])
    return None if value is not None and value.is_integer() and abs(value) <= 2 else 1


#: Other names a dtype goes by in source (`jnp.float32` and `"float32"` are found as the
#: name itself).
_DTYPE_NAMES = {
    "bfloat16": ("bfloat16", "bf16"),
    "float16": ("float16", "f16", "half"),
    "float32": ("float32", "f32", "single"),
    "float64": ("float64", "f64", "double"),
}


def _dtype_said(dtypes: Sequence[str]) -> str:
    return f"name the dtype {dtypes[0]}" if dtypes else "name its dtype"


def _names(lines: Sequence[str], dtype: str) -> bool:
    """Whether `lines` name `dtype` (or one of its other names) as a word, comments aside."""
    words = _DTYPE_NAMES.get(dtype, (dtype,))
    pattern = re.compile(rf"(?<![\w]){'|'.join(map(re.escape, words))}(?![\w])")
    return any(pattern.search(text.split("#", 1)[0]) for text in lines)


def _names_dtype(hunk: Hunk, dtypes: Sequence[str]) -> float | None:
    """0 where `hunk` names the new dtype and removes a line naming the base's, 1 where it
    names the new one only, else None."""
    if not dtypes or not _names(hunk.added, dtypes[0]):
        return None
    return 0 if len(dtypes) > 1 and _names(hunk.removed, dtypes[1]) else 1


def _writes_one(lines: Sequence[str], constant: str) -> bool:
    """Whether `lines` write `constant` (as recorded: `1e-06`) as a literal, a sign aside:
    equal as a float32 is (`1e-6` and `0.000001`; `1e-05` and `1e-5`)."""
    want = _number(constant)
    if want is None:
        return False
    for text in lines:
        code = text.split("#", 1)[0]
        for literal in _NUMBER.findall(code):
            got = _number(literal.replace("_", ""))
            if got is not None and _same(abs(got), abs(want)):
                return True
    return False


def _number(text: str) -> float | None:
    try:
        value = float(text.strip().strip("[]()"))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _same(a: float, b: float) -> bool:
    """Equal as float32 holds them (a recorded constant is the program's, often float32)."""
    return a == b or abs(a - b) <= 2**-23 * max(abs(a), abs(b))


def _frames(origin: Origin) -> list[tuple[str, bool]]:
    """The frames the origin names, the tree's then the base's, each with whether it is
    the base's: its own place, its chain (innermost first), what its change names."""
    own = f"{origin.file}:{origin.line} in {origin.function}" if origin.file else ""
    tree = [own, *origin.chain, *origin.places]
    if origin.read_by:
        tree.append(origin.read_by.partition(" at ")[2])
    return [(f, False) for f in tree if f] + [(f, True) for f in origin.base_places]


def _ran_through(hunk: Hunk, origin: Origin) -> float | None:
    """The rank among the origin's frames of the first that lies in `hunk`, else None."""
    for k, (frame, base) in enumerate(_frames(origin)):
        file, line, _ = frame_parts(frame)
        if base and file == hunk.base_file and hunk.base_holds(line):
            return k
        if not base and file == hunk.file and hunk.holds(line):
            return k
    return None


def _inside(hunk: Hunk, origin: Origin, sources: Mapping[str, str]) -> float | None:
    """The rank among the origin's tree frames of the innermost whose function holds
    `hunk`'s lines (read from the tree's `sources`), else None."""
    for k, (frame, base) in enumerate(_frames(origin)):
        file, line, _ = frame_parts(frame)
        if base or file != hunk.file:
            continue
        span = _function_span(sources.get(file, ""), line)
        if span is not None and _overlaps(hunk, span):
            return k
    return None


def _enclosing(hunk: Hunk, origin: Origin, sources: Mapping[str, str]) -> str:
    for frame, base in _frames(origin):
        file, line, function = frame_parts(frame)
        span = None if base or file != hunk.file else _function_span(sources.get(file, ""), line)
        if span is not None and _overlaps(hunk, span):
            return f"{function} ({file}:{span[0]}-{span[1]})"
    return "a function"


def _overlaps(hunk: Hunk, span: tuple[int, int]) -> bool:
    last = hunk.start + max(len(hunk.added), 1) - 1
    return hunk.start <= span[1] and last >= span[0]


def _function_span(source: str, line: int) -> tuple[int, int] | None:
    """The first and last line of the innermost function of `source` holding `line`."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    best: tuple[int, int] | None = None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            end = node.end_lineno or node.lineno
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            if first <= line <= end and (best is None or end - first < best[1] - best[0]):
                best = (first, end)
    return best


def sources_diff(new_fn: Any, old_fn: Any, root: str | Path | None = None) -> Diff | None:
    """Two live functions' diff, where their source stands in for a commit's (issue 74's
    third item): two files, diffed whole; one file, the two functions' own lines. None
    where either's source cannot be read, or where it reads the same (the difference is
    then in what they call, which no diff here holds)."""
    try:
        new_file, old_file = (inspect.getsourcefile(inspect.unwrap(f)) for f in (new_fn, old_fn))
        if new_file is None or old_file is None:
            return None
        if new_file != old_file:
            new_text, old_text = Path(new_file).read_text(), Path(old_file).read_text()
            new_lines, new_first = new_text.splitlines(), 1
            old_lines, old_first = old_text.splitlines(), 1
        else:
            new_src, new_first = inspect.getsourcelines(inspect.unwrap(new_fn))
            old_src, old_first = inspect.getsourcelines(inspect.unwrap(old_fn))
            new_text = Path(new_file).read_text()
            new_lines = [ln.rstrip("\n") for ln in new_src]
            old_lines = [ln.rstrip("\n") for ln in old_src]
    except (OSError, TypeError):
        return None
    import difflib  # here: `parity diff` never loads it (tests/parity/test_cli.py)

    names = [_rooted(f, root) for f in (old_file, new_file)]
    text = "\n".join(difflib.unified_diff(old_lines, new_lines, *names, n=0, lineterm=""))
    hunks = tuple(
        dataclasses.replace(
            h, start=h.start + new_first - 1, base_start=h.base_start + old_first - 1
        )
        for h in parse_diff(text)
    )
    if not hunks:
        return None
    return Diff(hunks, {names[1]: new_text}, "the old function and the new")


def _rooted(file: str, root: str | Path | None) -> str:
    """A source file named as an origin's frames name it: relative to `root` where inside."""
    if root is None:
        return file
    try:
        return Path(file).resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return file
