"""How the code under check differs from its base, as the hunks the origin's edit is found
among (issue 74: `parity.origin._edit`): `git diff -U0` of the Python sources the
repository tracks, from a base commit to the working tree or to another commit. Nothing
here writes: git reads the commits and the files, never the user's index
(`parity.machinery._worktree.git`).
"""

from __future__ import annotations

from pathlib import Path

from parity.machinery._worktree import GitError, file_at, git
from parity.origin._hunks import Diff, parse_diff

__all__ = ["source_diff"]

#: The sources a producer imports: Python files (a data file's edit changes an input, which
#: the origin names as one).
_SOURCES = "*.py"


def source_diff(repo: Path, base: str, *, to: str | None = None, between: str = "") -> Diff | None:
    """The hunks of the Python sources from commit `base` to commit `to` (None: the files
    of `repo`'s work tree, edits not committed included; a file git does not track is not
    in it), with the tree's text of each file they touch. None where git cannot say (not
    a repository, a base this clone lacks)."""
    sides = [base] if to is None else [base, to]
    try:
        top = Path(git(repo, "rev-parse", "--show-toplevel"))
        text = git(
            repo, "diff", "-U0", "--no-color", "--no-ext-diff", "--no-renames", *sides,
            "--", _SOURCES,
        )  # fmt: skip
    except GitError:
        return None
    hunks = parse_diff(text)
    sources: dict[str, str] = {}
    for file in {h.file for h in hunks if h.file}:
        if to is None:
            path = top / file
            raw = path.read_bytes() if path.is_file() else None
        else:
            raw = file_at(top, to, top / file)
        if raw is not None:
            sources[file] = raw.decode("utf-8", errors="replace")
    said = between or f"the base {base[:12]} and {'the working tree' if to is None else to[:12]}"
    return Diff(hunks, sources, said)
