"""Find the first commit that broke a golden check, like `git bisect run`, without
touching the user's repository state.

`bisect(good, bad, config=...)` pins goldens at GOOD into a temporary folder (the user's
goldens are never written), each given the calibration GOOD's own golden file records (else
the project's: `good_calibration`, so a `calibrated` class judges), confirms that GOOD
passes against them and that BAD fails, then binary-searches the first-parent commits
between them. Each commit is checked out as a temporary detached worktree
(`parity.machinery._worktree.temporary_worktree`), the current tree's producers run against
its code in a fresh process (`parity.run._produced.producing`), and
the arrays are checked against GOOD's goldens (`parity.check.check_group`). Three outcomes
per commit, as `git bisect run` has (exit 125 there), each judged as `parity check` judges
(a key of a class that proves, `op_by_op`, whose bits moved is proved op by op against GOOD's
programs, `parity.run._origins.FailureSettler`, and is bad only where it is not):

- `good`: every key of every group holds its class;
- `bad`: some key breaks its class (the step names the group, key and class);
- `skip`: the producers cannot run there (a symbol they need is missing, a crash): the
  commit is reported and never counted as bad; the search continues around it.

Where one first bad commit is found, its failing group is recorded op by op there and at
its parent and settled through the door every face settles by
(`parity.run._between.locate_between`, by the producers' `STACK` and `RENAME`, a key of
class `up_to_rounding` replayed on the parent's values), and the answer names the origin:
the first operation of the bad commit's program that computes what its parent's never did,
at its source line.

The user's checkout, index, branches and `git bisect` state are never touched: only
`git worktree add/remove/prune` and read-only git commands run. Nothing here imports jax.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from parity._errors import ParityError
from parity._results import CheckError
from parity.check import GoldenDir
from parity.judge._compare import Comparison
from parity.judge._floats import count
from parity.machinery._config import ParityConfig
from parity.machinery._launcher import ProducerRunError, UnknownGroupsError
from parity.machinery._worktree import (
    GitError,
    file_at,
    git,
    repo_root,
    resolve_sha,
    temporary_worktree,
)
from parity.origin._localisation import Localisation
from parity.origin._settling import Rules
from parity.report._summary import arrays_failing
from parity.run._between import locate_between
from parity.run._origins import FailureSettler, rules_of
from parity.run._produced import Checkout, check_produced, producing
from parity.run._repin import RepinError, RepinRun, repin
from parity.store import GoldenStoreError, open_goldens, write_goldens

__all__ = ["BisectError", "BisectResult", "Step", "bisect", "first_parent_commits"]

Outcome = Literal["good", "bad", "skip"]
Status = Literal["found", "ambiguous", "good_fails", "bad_passes", "cannot_run"]


class BisectError(ParityError, RuntimeError):
    """GOOD and BAD cannot be bisected (not commits, not in order); one line."""


@dataclass(frozen=True)
class Step:
    """One commit checked.

    **Fields:** `sha` (full), `subject` (the commit's first line), `outcome` (`good`,
    `bad` or `skip`), `detail` (one line: what broke, or why it could not run), and for a
    bad commit the `group`, `key` and `class_name` of its first failure (first group in
    group order, first key in that group's forward order), `role` (`GOOD`, `BAD` or
    `search`), `seconds`, and `verdicts`: for a commit checked, each `group/key`'s verdict
    and its basis (`parity.judge._findings.Finding`), as `parity check` gives them.
    """

    sha: str
    subject: str
    outcome: Outcome
    detail: str
    role: str = "search"
    group: str | None = None
    key: str | None = None
    class_name: str | None = None
    seconds: float = 0.0
    verdicts: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    #: For a bad commit, its failing group's comparison and the producers' rules it was
    #: judged by: what the origin against its parent settles (not in the JSON).
    failing: Comparison | None = field(default=None, repr=False, compare=False)
    rules: Rules | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: the step's fields but `failing` and `rules`."""
        return {
            f.name: getattr(self, f.name) if f.name != "verdicts" else dict(self.verdicts)
            for f in fields(self)
            if f.name not in ("failing", "rules")
        }

    def line(self, label: str = "") -> str:
        """The step as one line for a terminal, after `label` (`GOOD`, `BAD`, `step 2`)."""
        head = f"{label or self.role:<7} {self.outcome:<4}  {self.sha[:12]}"
        return f"{head}  {self.detail}  ({self.subject})"


@dataclass(frozen=True)
class BisectResult:
    """The answer.

    **Fields:**

    - `good`, `bad`: the full SHAs bisected between.
    - `status`: `found` (one first bad commit), `ambiguous` (it lies among `candidates`,
      commits that could not run next to the first known bad one), `good_fails`,
      `bad_passes`, `cannot_run` (GOOD or BAD cannot run the producers).
    - `first_bad`: the first bad commit's step (for `found` and `ambiguous`: the first
      commit known bad).
    - `candidates`: for `ambiguous`, the skipped commits and the first known bad one.
    - `steps`: every commit checked, in the order checked (GOOD and BAD first).
    - `commits`: how many first-parent commits lie between GOOD (excluded) and BAD.
    - `origin`: for `found`, where the first bad commit diverges from its parent (a
      `parity.origin.Localisation`, as `parity._results.CheckResult.origin`), or None where
      it was not asked for; `origin_line` is its one line.
    """

    good: str
    bad: str
    status: Status
    steps: tuple[Step, ...]
    commits: int
    first_bad: Step | None = None
    candidates: tuple[str, ...] = ()
    origin: Localisation | None = None

    @property
    def origin_line(self) -> str | None:
        """The `origin:` line (the origin, or why it is not named); None where not asked."""
        return None if self.origin is None else self.origin.line

    @property
    def skipped(self) -> tuple[Step, ...]:
        """The commits that could not run."""
        return tuple(s for s in self.steps if s.outcome == "skip")

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: the answer (`first_bad_commit`, `group`, `key`, `class`) and steps."""
        fb = self.first_bad
        return {
            "good": self.good,
            "bad": self.bad,
            "status": self.status,
            "commits": self.commits,
            "first_bad_commit": fb.sha if fb and self.status == "found" else None,
            "group": fb.group if fb else None,
            "key": fb.key if fb else None,
            "class": fb.class_name if fb else None,
            "candidates": list(self.candidates),
            "skipped": [s.sha for s in self.skipped],
            "origin": None if self.origin is None else self.origin.json_origin(),
            "origin_line": self.origin_line,
            "steps": [s.to_dict() for s in self.steps],
        }


def first_parent_commits(root: Path, good: str, bad: str) -> list[str]:
    """The first-parent commits after `good` up to and including `bad`, oldest first."""
    out = git(root, "rev-list", "--first-parent", "--reverse", bad, f"^{good}")
    return out.split()


def _subject(root: Path, sha: str) -> str:
    return git(root, "log", "-1", "--format=%s", sha)


def _is_ancestor(root: Path, a: str, b: str) -> bool:
    proc = subprocess.run(
        ["git", "-C", str(root), "merge-base", "--is-ancestor", a, b],
        capture_output=True,
        check=False,
    )
    return proc.returncode == 0


def _evaluate(
    root: Path,
    sha: str,
    config: ParityConfig,
    goldens: GoldenDir,
    *,
    groups: Sequence[str],
    overrides: Sequence[tuple[str, str]],
    role: str,
) -> Step:
    subject = _subject(root, sha)
    t0 = time.perf_counter()

    def step(outcome: Outcome, detail: str, **kw: Any) -> Step:
        seconds = round(time.perf_counter() - t0, 2)
        return Step(sha, subject, outcome, detail, role=role, seconds=seconds, **kw)

    try:
        with temporary_worktree(root, sha) as wt, contextlib.ExitStack() as stack:
            at = Checkout(root=wt, drop_paths=config.src, name=f"commit {sha[:12]}")
            # Kept while the step is judged: a proof records the step in the same run.
            run = producing(
                config, at=at, groups=groups, command="bisect", keep=True, goldens=goldens
            )
            try:
                produced, kept = stack.enter_context(run)
            except ProducerRunError as e:
                return step("skip", f"cannot run the producers: {e.reason}")
            # Judged as `parity check` judges: a key of a class that proves (`op_by_op`)
            # whose bits moved is proved op by op against GOOD, or fails for why not.
            settler = FailureSettler(
                produced,
                config,
                goldens,
                origin=False,
                checkout=at,
                progress=lambda _: None,
                kept=kept,
            )
            try:
                results = check_produced(
                    produced, goldens, overrides=overrides, node=sha, settle=settler
                )
            except CheckError as e:
                return step("skip", f"cannot check: {' '.join(str(e).split())}")
    except GitError as e:
        return step("skip", f"cannot check out: {' '.join(str(e).split())}")
    verdicts = {f"{r.name}/{f.key}": (f.verdict, f.basis) for r in results
                for f in r.comparison.findings}  # fmt: skip
    for r in results:
        f = r.comparison.first_failure
        if f is not None:
            detail = f"{r.name}: {f.key!r} breaks {f.class_name} ({arrays_failing(r.comparison)})"
            return step(
                "bad",
                detail,
                group=r.name,
                key=f.key,
                class_name=f.class_name,
                verdicts=verdicts,
                failing=r.comparison,
                rules=rules_of(produced.table, produced.conversions, [r]),
            )
    n = sum(len(r.comparison.findings) for r in results)
    said = f"all {count(n, 'array')} of {count(len(results), 'group')} hold their class"
    return step("good", said, verdicts=verdicts)


def good_calibration(root: Path, good: str, goldens: Path, pinned: Path) -> list[str]:
    """Give each golden file pinned at GOOD into `pinned` the calibration GOOD's own golden
    file of that group records (as commit `good` holds it under `goldens`), else the one
    the project's goldens record now: a `calibrated` class reads its bounds from there, and
    a fresh pin records none. **Returns:** a line per file given one, saying from where."""
    lines = []
    for path in sorted(pinned.glob("*.h5")):
        committed = goldens / path.name
        source, where = None, ""
        data = file_at(root, good, committed)
        if data is not None:
            source, where = pinned / f".{path.stem}.good", f"GOOD {good[:12]}'s {path.name}"
            source.write_bytes(data)
        elif committed.is_file():
            source, where = committed, f"{committed} (GOOD holds no {path.name})"
        if source is None:
            continue
        try:
            with open_goldens(source) as gf:
                calibration = gf.provenance.calibration
        except GoldenStoreError:
            continue
        finally:
            if source.parent == pinned:
                source.unlink()
        if not calibration:
            continue
        with open_goldens(path) as gf:
            arrays = {k: gf[k] for k in gf}
            classes = {k: gf.info(k).class_name for k in gf}
            prov, cmap, order = gf.provenance, gf.class_map_json, gf.ordered_keys()
        write_goldens(path, arrays, classes=classes, class_map_json=cmap,
                      provenance=replace(prov, calibration=calibration), order=order)  # fmt: skip
        lines.append(f"{path.stem}: the calibration of {where}")
    return lines


def _resolve(start: Path, good: str, bad: str) -> tuple[Path, str, str]:
    """The repository holding `start`, and GOOD's and BAD's SHAs: a `BisectError` where
    either does not resolve, they are one commit, or GOOD is not an ancestor of BAD."""
    try:
        root = repo_root(start)
        good_sha, bad_sha = resolve_sha(root, good), resolve_sha(root, bad)
    except GitError as e:
        raise BisectError(" ".join(str(e).split())) from None
    if good_sha == bad_sha:
        raise BisectError(f"GOOD and BAD are the same commit ({good_sha}); nothing to bisect")
    if not _is_ancestor(root, good_sha, bad_sha):
        raise BisectError(
            f"GOOD {good_sha[:12]} is not an ancestor of BAD {bad_sha[:12]}; pass an older "
            "GOOD (see `git log --first-parent`)"
        )
    return root, good_sha, bad_sha


def _search(
    commits: Sequence[str], last: Step, check: Callable[[str], Step]
) -> tuple[int, int, dict[int, Step]]:
    """Bisect `commits` (GOOD's child ... BAD, BAD's step `last`), `check` judging one:
    the last known good index (-1: GOOD itself), the first known bad one, and the bad steps
    by index. Untestable commits are skipped; the one nearest the middle is tried next."""
    lo, hi = -1, len(commits) - 1  # last known good, first known bad
    known: dict[int, Step] = {hi: last}
    skipped: set[int] = set()
    while True:
        untested = [i for i in range(lo + 1, hi) if i not in skipped]
        if not untested:
            return lo, hi, known
        mid = (lo + hi) / 2
        i = min(untested, key=lambda j: (abs(j - mid), j))
        s = check(commits[i])
        if s.outcome == "good":
            lo = i
        elif s.outcome == "bad":
            hi, known[i] = i, s
        else:
            skipped.add(i)


def bisect(
    good: str,
    bad: str,
    *,
    config: ParityConfig,
    groups: Sequence[str] = (),
    overrides: Sequence[tuple[str, str]] = (),
    progress: Callable[[str], None] = print,
    origin: bool = True,
) -> BisectResult:
    """Find the first first-parent commit after `good` up to `bad` that breaks a check.

    **Arguments:**

    - `good`, `bad`: revisions; `good` must be an ancestor of `bad`.
    - `config`: the project's `[tool.parity]` (producers, src roots, ISA cap, devices);
      the goldens are pinned at `good` into a temporary folder, with the calibration of
      GOOD's own goldens (else of `config.goldens`; `good_calibration`).
    - `groups`: a subset of the producer groups (default all).
    - `overrides`: `(pattern, class)` rules before the pinned class map.
    - `progress`: receives one line per step.
    - `origin`: name the origin of a first bad commit found (two more producer runs that
      record its group op by op, there and at its parent).

    **Returns:** a `BisectResult`. Raises `BisectError` for revisions that cannot be
    bisected, `parity.machinery._config.ConfigError` for a missing producers file.
    """
    config.need_producers()
    root, good_sha, bad_sha = _resolve(config.root, good, bad)
    commits = first_parent_commits(root, good_sha, bad_sha)
    steps: list[Step] = []

    def record(s: Step) -> Step:
        steps.append(s)
        n = sum(x.role == "search" for x in steps)
        progress(s.line(f"step {n}" if s.role == "search" else s.role))
        return s

    def result(status: Status, **kw: Any) -> BisectResult:
        return BisectResult(good_sha, bad_sha, status, tuple(steps), len(commits), **kw)

    with tempfile.TemporaryDirectory(prefix="parity-bisect-") as tmp:
        progress(f"pinning goldens at GOOD {good_sha[:12]} into a temporary folder")
        try:
            repin(
                good_sha,
                producers=config.need_producers(),
                out_dir=Path(tmp),
                repo=root,
                progress=lambda _: None,
                run=RepinRun.of(config, groups=groups),
            )
        except UnknownGroupsError as e:  # the producers' file, whatever the commit
            raise BisectError(e.message) from None
        except (ProducerRunError, RepinError) as e:
            why = e.reason if isinstance(e, ProducerRunError) else " ".join(str(e).split())
            record(Step(good_sha, _subject(root, good_sha), "skip", f"cannot pin: {why}", "GOOD"))
            return result("cannot_run")
        for line in good_calibration(root, good_sha, config.goldens, Path(tmp)):
            progress(line)
        with GoldenDir(tmp) as goldens:

            def check(sha: str, role: str) -> Step:
                return record(
                    _evaluate(
                        root, sha, config, goldens, groups=groups, overrides=overrides, role=role
                    )
                )

            first = check(good_sha, "GOOD")
            if first.outcome != "good":
                return result("good_fails" if first.outcome == "bad" else "cannot_run")
            last = check(bad_sha, "BAD")
            if last.outcome != "bad":
                return result("bad_passes" if last.outcome == "good" else "cannot_run")
            between = count(len(commits) - 1, "commit")
            progress(f"bisecting {between} between GOOD and BAD (first parents)")
            lo, hi, known = _search(commits, last, lambda sha: check(sha, "search"))
    between = [commits[i] for i in range(lo + 1, hi)]
    if between:
        return result("ambiguous", first_bad=known[hi], candidates=(*between, commits[hi]))
    fb = known[hi]
    if not origin or fb.group is None or fb.failing is None:
        return result("found", first_bad=fb)
    parent = commits[hi - 1] if hi > 0 else good_sha
    found = locate_between(
        config,
        root,
        (fb.group, fb.failing),
        fb.sha,
        parent,
        rules=fb.rules or Rules(),
        progress=progress,
    )
    return result("found", first_bad=fb, origin=found)
