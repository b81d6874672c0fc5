"""The origin of `parity bisect`'s answer: the first bad commit's failing group settled
through the one door every face settles by (`parity.origin.settle_by`), its sides that
group's programs recorded at the first bad commit and at its parent (`CommitSides`), each
in a temporary worktree, with the current tree's producers, in this environment. Nothing
here imports jax.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from parity.judge._compare import Comparison
from parity.machinery._config import ParityConfig
from parity.machinery._worktree import GitError, temporary_worktree
from parity.origin import Localisation
from parity.origin._hunks import Diff
from parity.origin._settling import NotRecorded, Pair, Rules, settle_by
from parity.run._diff import source_diff
from parity.run._origins import read_pair
from parity.run._produced import Checkout
from parity.run._recordings import Made, Replaying, record_groups
from parity.store._staging import owned_tempdir

__all__ = ["CommitSides", "locate_between"]

_PREFIX = "parity-origin-"

Progress = Callable[[str], None]


@dataclass
class CommitSides:
    """The sides of `parity bisect`'s answer (`parity.origin.Sides`): a group's programs
    recorded at the first bad commit `new_sha` and at its parent `old_sha`, each in a
    temporary worktree of `repo`, in this environment, with the current tree's producers.
    The parent is recorded first, with every value's numbers where a key is to be proved
    up to rounding, and the bad commit's recording then replays its programs on them.
    `root` is the bad commit's worktree once recorded (the origins' paths are given
    relative to it: the repository's own paths)."""

    config: ParityConfig
    repo: Path
    new_sha: str
    old_sha: str
    progress: Progress = lambda _: None
    timeout: float | None = None
    root: Path | None = None

    @property
    def against(self) -> str:
        return f"the parent {self.old_sha[:12]}"

    def refuse(self, names: Sequence[str]) -> dict[str, NotRecorded]:
        return {}

    def diff(self, name: str) -> Diff | None:
        """The first bad commit's edits of its parent (`parity.run._diff.source_diff`)."""
        between = f"the parent {self.old_sha[:12]} and the first bad commit {self.new_sha[:12]}"
        return source_diff(self.repo, self.old_sha, to=self.new_sha, between=between)

    def record(self, wanted: Mapping[str, Sequence[str]]) -> Iterator[tuple[str, Pair]]:
        for group, keys in wanted.items():
            with owned_tempdir(_PREFIX) as tmp:
                made: dict[str, Made] = {}
                try:
                    for side, sha in (("old", self.old_sha), ("new", self.new_sha)):
                        made[side] = self._one(group, keys, side, sha, tmp, made.get("old"))
                        if isinstance(made[side].recording, NotRecorded):
                            break
                except GitError as e:
                    why = NotRecorded(f"cannot check out: {' '.join(str(e).split())}")
                    made = {"old": Made(why)}
                old = made["old"].recording
                if "new" in made:
                    pair = read_pair(made["new"], old)
                else:  # the parent could not be recorded, or checked out
                    assert isinstance(old, NotRecorded)
                    pair = Pair(old, old)
            yield group, pair

    def _one(
        self, group: str, keys: Sequence[str], side: str, sha: str, tmp: Path, old: Made | None
    ) -> Made:
        """`group` recorded at `sha` into `tmp/side`: the parent (`old` None) with every
        value's numbers where `keys` are to be proved up to rounding, the bad commit with
        its replay on the parent's."""
        (tmp / side).mkdir()
        self.progress(f"recording {group} at {sha[:12]} to name the origin")
        with temporary_worktree(self.repo, sha) as wt:
            replay = None
            if old is not None:  # the bad commit: the origins' paths are relative to it
                self.root = wt.resolve()
                if keys and isinstance(old.recording, Path):
                    replay = {group: Replaying(old.recording, keys, self.root)}
            return record_groups(
                Checkout(root=wt, drop_paths=self.config.src, name=f"commit {sha[:12]}"),
                self.config,
                [group],
                tmp / side,
                replay=replay,
                arrays=old is None and bool(keys),
                progress=self.progress,
                timeout=self.timeout,
            )[group]


def locate_between(
    config: ParityConfig,
    repo: Path,
    failing: tuple[str, Comparison],
    new_sha: str,
    old_sha: str,
    *,
    rules: Rules,
    progress: Progress = lambda _: None,
    timeout: float | None = None,
) -> Localisation:
    """The origin of a bisection's answer: the first bad commit's failing `(group,
    comparison)` settled through the one door (`parity.origin.settle_by`) against its parent
    (`CommitSides`), by the producers' `rules`: a key proved there (op by op, or up to
    rounding) is not what broke; the origin of the first key still failing is named, with
    file paths relative to the repository. Never raises for a program it cannot record: it
    says why."""
    group, comparison = failing
    sides = CommitSides(config, repo, new_sha, old_sha, progress=progress, timeout=timeout)
    done = settle_by({group: comparison}, sides, rules=rules).get(group)
    if done is None or done.origin is None:
        return Localisation("no_failure", key="", against=sides.against)
    return done.origin
