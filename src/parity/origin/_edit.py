"""Which edit of the diff made the origin (issue 74): a named origin held against the
hunks between the base and the tree, so that a constant set in a constructor is named at
the line that sets it, not only where the program uses it.

**Evidence,** of these kinds:

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

A hunk in a file the origin's frames run in ranks before one elsewhere (a new test file
that writes the same number is not the edit): the tiers, the best first, are what it
writes there, a frame, what it writes with the base's value elsewhere, a function, what it
writes alone elsewhere (`_TIERS`). The hunks of the best tier any reaches, at the best
rank within it (the frame nearest the operation), are said.

Where none bears any, the answer says so: no edit of the diff sets it (the difference came
from elsewhere: a file outside the diff, the environment, the data).

Nothing here imports jax or runs git: a face hands in the diff as data
(`parity.origin._hunks.Diff`: its hunks and the tree's text of the files they touch).
"""

from __future__ import annotations

import ast
import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from parity.origin._change import frame_parts
from parity.origin._hunks import Diff, Hunk
from parity.origin._origin import Origin

__all__ = ["Edit", "edit_of"]

#: At most this many hunks are named where several bear the same evidence.
SHOWN = 3

#: A number as Python writes one (no sign: `-1e-5` is a negation of a literal).
_NUMBER = re.compile(
    r"(?<![\w.])(?:\d[\d_]*\.?[\d_]*(?:[eE][-+]?\d+)?|\.\d[\d_]*(?:[eE][-+]?\d+)?)"
)


@dataclass(frozen=True)
class Edit:
    """The edit of a diff that made an origin: `hunks`, those that bear the strongest
    evidence any hunk bears (none where no hunk does), `evidence` (which kind:
    `constant`, `dtype`, `frame`, `function`, `only` or `none`), `why` (what it is, in one
    clause), `of` (how many hunks the diff holds), `between` (the diff's two sides)."""

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


def edit_of(origin: Origin, diff: Diff) -> Edit:
    """The edit of `diff` that made `origin`: the hunks of the best tier any hunk reaches,
    at the best rank within it (`_tier`: the frame nearest the operation, the innermost
    function), in the diff's order."""
    hunks = [h for h in diff.hunks if h.added or h.removed]
    if not hunks:
        why = f"none: the source does not differ between {diff.between}"
        return Edit((), "none", f"{why} (the difference came from elsewhere)", 0, diff.between)
    frames = _frames(origin)  # once: every hunk is held against the same frames
    scored = [(tier, h) for h in hunks if (tier := _tier(h, origin, frames, diff.sources))]
    if scored:
        best = min(t for t, _ in scored)  # the tier, and the rank within it
        named = tuple(h for t, h in scored if t == best)
        evidence = _TIERS[best[0]]
        if evidence == "written":
            evidence = _written(named[0], origin)
        why = (
            _one(evidence, named[0], origin, frames, diff.sources)
            if len(named) == 1
            else _several(evidence, origin)
        )
        return Edit(named, evidence, why, len(hunks), diff.between)
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


#: The tiers a hunk can reach, the best first: what it writes (the changed constant, or a
#: changed dtype's name) in a file the origin's frames run in, with the base's value in its
#: removed lines (0) or without (1); a line the chain ran through (2); what it writes with
#: the base's in another file (3); the function the chain ran through (4); what it writes,
#: alone, in another file (5). A file the origin's frames run in is the likelier place of
#: its edit: a new test file writing the same number is not.
_TIERS = {0: "written", 1: "written", 2: "frame", 3: "written", 4: "function", 5: "written"}

#: The frames an origin names (`_frames`): each `file:line in function`, and whether it is
#: the base's.
Frames = list[tuple[str, bool]]


def _tier(
    hunk: Hunk, origin: Origin, frames: Frames, sources: Mapping[str, str]
) -> tuple[int, int] | None:
    """The best tier `hunk` reaches (`_TIERS`) and its rank within it, else None."""
    wrote = [
        x
        for x in (_writes(hunk, origin.constants), _names_dtype(hunk, origin.dtypes))
        if x is not None
    ]
    near = any(frame_parts(f)[0] in (hunk.file, hunk.base_file) for f, _ in frames)
    if wrote and near:
        return (min(wrote), 0)
    frame = _ran_through(hunk, frames)
    if frame is not None:
        return (2, frame[0])
    if wrote and min(wrote) == 0:
        return (3, 0)
    inside = _inside(hunk, frames, sources)
    if inside is not None:
        return (4, inside[0])
    return (5, 0) if wrote else None


def _written(hunk: Hunk, origin: Origin) -> str:
    """Which of the origin's values `hunk` writes: `constant` or `dtype`."""
    return "constant" if _writes(hunk, origin.constants) is not None else "dtype"


def _several(evidence: str, origin: Origin) -> str:
    """What several hunks of one tier each bear, as the clause after `hunks that`."""
    if evidence == "constant":
        return _wrote(origin.constants)
    if evidence == "dtype":
        return _dtype_said(origin.dtypes)
    if evidence == "frame":
        return "hold a line its call chain ran through"
    return "lie in a function its call chain ran through"


def _wrote(constants: Sequence[str]) -> str:
    return f"write the constant {constants[0]}" if constants else "write its constant"


def _one(
    evidence: str, hunk: Hunk, origin: Origin, frames: Frames, sources: Mapping[str, str]
) -> str:
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
    found = _ran_through(hunk, frames) if evidence == "frame" else _inside(hunk, frames, sources)
    assert found is not None, evidence  # the tier it was named by found it so
    return found[1]


def _writes(hunk: Hunk, constants: Sequence[str]) -> int | None:
    """0 where `hunk` writes the new constant and removes the base's, 1 where it writes
    the new one only (an integer alone is too common to be evidence), else None."""
    if not constants or not _writes_one(hunk.added, constants[0]):
        return None
    if any(_writes_one(hunk.removed, then) for then in constants[1:] if then != "none"):
        return 0
    value = _number(constants[0])
    return None if value is not None and value.is_integer() else 1


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


def _names_dtype(hunk: Hunk, dtypes: Sequence[str]) -> int | None:
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


def _frames(origin: Origin) -> Frames:
    """The frames the origin names, the tree's then the base's, each with whether it is
    the base's: its own place, its chain (innermost first), what its change names."""
    own = f"{origin.file}:{origin.line} in {origin.function}" if origin.file else ""
    tree = [own, *origin.chain, *origin.places]
    if origin.read_by:
        tree.append(origin.read_by.partition(" at ")[2])
    return [(f, False) for f in tree if f] + [(f, True) for f in origin.base_places]


def _ran_through(hunk: Hunk, frames: Frames) -> tuple[int, str] | None:
    """The first of `frames` that lies in `hunk` (on the tree's lines it added, or on the
    base's it removed): its rank, and the clause that says so; else None."""
    for k, (frame, base) in enumerate(frames):
        file, line, function = frame_parts(frame)
        if (file, hunk.base_holds(line) if base else hunk.holds(line)) == (
            hunk.base_file if base else hunk.file,
            True,
        ):
            side = "the base's line " if base else ""
            return k, f"it holds {side}{file}:{line} in {function}, which the call chain ran"
    return None


def _inside(hunk: Hunk, frames: Frames, sources: Mapping[str, str]) -> tuple[int, str] | None:
    """The first of the tree's `frames` whose function (read from the tree's `sources`)
    holds `hunk`'s lines: its rank, and the clause that says so; else None."""
    for k, (frame, base) in enumerate(frames):
        file, line, function = frame_parts(frame)
        if base or file != hunk.file:
            continue
        span = _function_span(sources.get(file, ""), line)
        if span is not None and _overlaps(hunk, span):
            scope = f"{function} ({file}:{span[0]}-{span[1]})"
            return k, f"inside {scope}, which the call chain ran through"
    return None


def _overlaps(hunk: Hunk, span: tuple[int, int]) -> bool:
    last = hunk.start + max(len(hunk.added), 1) - 1
    return hunk.start <= span[1] and last >= span[0]


def _function_span(source: str, line: int) -> tuple[int, int] | None:
    """The first and last line of the innermost function of `source` holding `line`."""
    best: tuple[int, int] | None = None
    for first, end in _function_spans(source):
        if first <= line <= end and (best is None or end - first < best[1] - best[0]):
            best = (first, end)
    return best


@functools.lru_cache(maxsize=64)
def _function_spans(source: str) -> tuple[tuple[int, int], ...]:
    """Every function's first line (its decorators') and last of `source`, parsed once per
    text however many hunks and frames ask (a diff since an old pin holds thousands)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    spans: list[tuple[int, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            spans.append((first, node.end_lineno or node.lineno))
    return tuple(spans)
