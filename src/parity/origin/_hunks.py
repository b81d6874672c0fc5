"""A diff as data (issue 74): the hunks between the base's source and the tree's, read from
a unified diff with no context lines (`git diff -U0`, `parity.run._diff`; `difflib`'s for
two live functions, `sources_diff`), which the edit that made an origin is found among
(`parity.origin._edit`).

This module imports the standard library and `parity.origin._places` only.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parity.origin._places import relative

__all__ = ["Diff", "Hunk", "parse_diff", "sources_diff"]

_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


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

    names = [relative(f, root) for f in (old_file, new_file)]
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
