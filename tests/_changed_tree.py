"""A copy of this repository's working tree with one deliberate change: the one way the
tests that check the real goldens against a changed subject make their tree
(`tests/equivalence/test_baseline_reference.py`, `tests/equivalence/test_origin_goldens.py`)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from parity.machinery.worktree import git, temporary_worktree

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def changed_tree(file: str, before: str, after: str) -> Iterator[Path]:
    """The working tree's tracked files over a temporary worktree of HEAD (the goldens'
    base commit is in the history, as in a full clone), with `before` replaced by `after`
    in `file` (which must hold it once); the checkout itself is never touched."""
    with temporary_worktree(ROOT, "HEAD") as tree:
        for rel in git(ROOT, "ls-files", "-z").split("\0"):
            if rel and (ROOT / rel).is_file():
                (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, tree / rel)
        path = tree / file
        text = path.read_text()
        assert text.count(before) == 1, f"{file} no longer holds {before!r} once"
        path.write_text(text.replace(before, after))
        yield tree
