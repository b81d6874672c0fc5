"""A copy of this repository's working tree with one deliberate change: the one way the
tests that check the real goldens against a changed subject make their tree
(`tests/equivalence/test_baseline_reference.py`, `tests/equivalence/test_origin_goldens.py`)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from parity.machinery._worktree import git, temporary_worktree

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def changed_tree(
    file: str, before: str, after: str, *, more: Sequence[tuple[str, str, str]] = ()
) -> Iterator[Path]:
    """The working tree's tracked files over a temporary worktree of HEAD (the goldens'
    base commit is in the history, as in a full clone), with `before` replaced by `after`
    in `file` (which must hold it once), then each `(file, before, after)` of `more` in
    turn; the checkout itself is never touched."""
    with temporary_worktree(ROOT, "HEAD") as tree:
        for rel in git(ROOT, "ls-files", "-z").split("\0"):
            if rel and (ROOT / rel).is_file():
                (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, tree / rel)
        for name, was, now in ((file, before, after), *more):
            path = tree / name
            text = path.read_text()
            assert text.count(was) == 1, f"{name} no longer holds {was!r} once"
            path.write_text(text.replace(was, now))
        yield tree
