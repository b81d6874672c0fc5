"""The guide's markers, read: `parse` turns docs/adopting.md into its marked blocks.

An HTML comment on the line before a fenced block says what the block is (indented blocks,
inside a list item, keep their indentation):

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
- `<!-- guide:install -->`: the install commands; not run (`guide.install`).

Figures quoted inline in prose (`<!-- guide:figure NAME REGEX -->`) are `guide.render`'s.
Imports nothing of parity.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GUIDE", "PROJECT", "PROMPT", "ROOT", "Block", "GuideError", "parse"]

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "adopting.md"
PROJECT = "tinymlp"
PROMPT = "$ "

_MARKER = re.compile(
    r"^(?P<indent> *)<!-- guide:(?P<kind>file|edit|run|install)(?: (?P<arg>\S+))? -->$"
)
_END_RUN = "<!-- /guide:run -->"
_FENCE = "```"


class GuideError(Exception):
    """The walk cannot go on: a malformed marker, or a command that failed unannounced."""


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
