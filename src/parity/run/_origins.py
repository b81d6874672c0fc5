"""A failing golden check settled op by op: its keys of class `op_by_op` proved or told why
not (docs/design.md, "Proved op by op"), and the origin of what still fails, the first
operation of the tree's programs that computes what the base's programs never did, at its
source line (issue 35; docs/design.md, "Where it diverged" and "The unit is the programs a
producer runs"; the matching and the proof themselves are `parity.origin`'s).

`parity check` asks for it after the verdict, for the failing groups only, so a passing
check costs what it did before. A failing one costs at most one more producer run: the
tree's groups are recorded op by op in the run that produced them, kept alive while the
check judges (`record_kept`, `parity.machinery._launcher.KeptRun`; where no run is kept, a
recording run of its own, `record_groups`), and the golden's base commit is re-produced in
this environment with its recording (`parity.run._baseline.BaselineBuilder`, `prepare(...,
record=True)`: one run makes the base's arrays and its recording, one cache entry keeps
both), so a failing check run again starts no run but its own.
`prove` and `locate`'s rule then run here, on the two summaries (`settle_failures`; one
alignment serves both). A key of a class that proves up to rounding (`up_to_rounding`) is
settled by the shadow replay (docs/design.md, "Proved up to rounding"): the base is
recorded first with every value's numbers (`prepare(..., record=ARRAYS)`, cached so), and
the tree's recording replays each of its operations on them, in the same producer run
(`parity.run._recordings.Replaying`); the run hands back its answers, the proof and the
origin of each such key (`parity.origin._replayed`). `parity bisect` names the origin
between the first bad commit and its parent the same way.

Where a group is not recorded, one line says why, and the verdict stands (an `op_by_op`
key stays unproved, for that reason): its outputs are
not computed by the jax programs the producer runs (numpy made them), the run spans processes,
the failing key's class gives no matching tolerance (`logit_kl`), the base cannot be
re-produced, or the program is too large (`_runner_groups.ORIGIN_MAX_BYTES`).

Nothing here imports jax.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from parity._environment import layout_of
from parity._results import BaselineUnavailable, CheckError, CheckResult
from parity.check import GoldenDir
from parity.judge._classes import REGISTRY, ToleranceClass
from parity.judge._dataflow import DATAFLOW, UNREAD
from parity.judge._renames import parse_renames
from parity.judge._stacking import parse_stack
from parity.judge._tolerance import UnknownClassError
from parity.machinery._config import ParityConfig
from parity.machinery._launcher import KeptRun
from parity.machinery._worktree import GitError, repo_root, temporary_worktree
from parity.origin import Localisation, LocaliseError, Recording, locate, prove_and_locate
from parity.origin._proof import Proof, provable, provable_up_to_rounding, settle, unproved
from parity.run._baseline import BaselineBuilder, base_commit
from parity.run._produced import Checkout, Produced
from parity.run._recordings import ARRAYS, Made, Replaying, record_groups, record_kept, recorded
from parity.store import Provenance
from parity.store._staging import owned_tempdir

__all__ = [
    "FailureSettler",
    "Settled",
    "base_recordings",
    "locate_between",
    "locate_files",
    "settle_failures",
]

_PREFIX = "parity-origin-"
#: What the tree's programs are recorded against, in the lines.
_BASE = "the base commit"

Progress = Callable[[str], None]


def base_recordings(
    config: ParityConfig,
    wanted: Sequence[tuple[str, Provenance, Provenance]],
    *,
    builder: BaselineBuilder | None = None,
    arrays: bool = False,
    progress: Progress = lambda _: None,
    timeout: float | None = None,
) -> dict[str, Path | str]:
    """Each group's programs recorded at its golden's base commit in the environment its
    check ran in: the base re-produced here (`parity.run._baseline.BaselineBuilder`) with its
    recording, from the cache, else in one producer run per base commit and environment
    that makes both the arrays and the recording (one code path, one cache entry).

    **Arguments:** `wanted`, `(group, pinned provenance, current provenance)` triples;
    `builder`, the check's (default one on `config`'s cache); `arrays`, every value's
    numbers kept too (a shadow replay runs on them).

    **Returns:** group -> the recording's file in the cache, or one line saying why not.
    """
    builder = builder or BaselineBuilder(config, progress=progress, timeout=timeout)
    out: dict[str, Path | str] = {}
    for group, got in builder.prepare(wanted, record=ARRAYS if arrays else True).items():
        if isinstance(got, BaselineUnavailable):
            out[group] = f"the base cannot be re-produced here: {got.reason}"
            continue
        made = recorded(got.path)
        sha = got.sha[:12]
        out[group] = made if isinstance(made, Path) else f"at the base {sha}: {made}"
    return out


def locate_files(
    new_file: Path,
    old_file: Path,
    key: str,
    class_name: str,
    *,
    root: Path | None,
    registry: Mapping[str, ToleranceClass] = REGISTRY,
    old_name: str = "the base",
) -> Localisation:
    """The origin of `key` in the new recording against the old one: `parity.origin.locate`
    of the two files, the matching tolerance from `class_name`, paths relative to `root`.
    Raises `LocaliseError` where the key is absent or its class gives no matching
    tolerance."""
    new, old = Recording.read(new_file), Recording.read(old_file)
    if key not in old.output_arrays or key not in new.outputs:
        raise LocaliseError(f"the recorded programs do not both output {key!r}")
    return locate(
        new, old, class_map=class_name, key=key, root=root, registry=registry, against=old_name
    )


def _why_not(r: CheckResult, produced: Produced) -> str | None:
    """Why the failing check `r` gets no recording, or None: asked before any run."""
    group, first = r.group or "", r.comparison.first_failure
    if first is None:
        return "no key breaks its class"
    if group in produced.recorders:  # its programs could not be seen: no recording either
        return produced.recorders[group]
    # An order not read (or unknown): the recording says
    if produced.orders.get(group, DATAFLOW) not in (DATAFLOW, UNREAD):
        return (
            "the producer's outputs are not computed by the jax programs it runs (numpy "
            "computed them on the host), so the operations that made them cannot be recorded"
        )
    return None


@dataclasses.dataclass(frozen=True)
class Settled:
    """A failing check settled op by op: `result` (its comparison with each key of a class
    that proves proved or told why not, its `origin` where asked) and the `proofs` made,
    by key (for a caller that settles the same group again: the pytest plugin)."""

    result: CheckResult
    proofs: Mapping[str, Proof]


def _unsettled(r: CheckResult, why: str, origin: bool) -> Settled:
    """`r` where its programs cannot be recorded: its provable keys unproved for `why`, its
    origin not named for it."""
    proofs = unproved(r.comparison, why)
    comparison = settle(r.comparison, proofs)
    named = _not_named(why) if origin and not comparison.passed else None
    return Settled(dataclasses.replace(r, comparison=comparison, origin=named), proofs)


def _recorded(
    r: CheckResult, new: Made, old: Path, root: Path, origin: bool, produced: Produced
) -> Settled:
    """`r` settled by the recordings of its programs on both sides (`prove_and_locate`; a
    per-layer key as its row of a stacked output, a moved key under its new name, by the
    producers' stack and rename rules; a key proved up to rounding by the replay's answers
    where the tree was replayed on the base's values)."""
    assert isinstance(new.recording, Path)
    try:
        new_rec, old_rec = Recording.read(new.recording), Recording.read(old)
    except (OSError, ValueError, KeyError) as e:
        return _unsettled(r, f"the recordings cannot be read: {e}", origin)
    done = prove_and_locate(
        r.comparison,
        new_rec,
        old_rec,
        root=root,
        against=_BASE,
        origin=origin,
        stack=parse_stack(produced.table.stack),
        rename=parse_renames(produced.table.rename),
        shadow=new.replayed,
    )
    result = dataclasses.replace(r, comparison=done.comparison, origin=done.origin)
    return Settled(result, done.proofs)


def settle_failures(
    results: Sequence[CheckResult],
    produced: Produced,
    config: ParityConfig,
    goldens: GoldenDir,
    *,
    origin: bool = True,
    progress: Progress = lambda _: None,
    timeout: float | None = None,
    checkout: Checkout | None = None,
    kept: KeptRun | None = None,
) -> list[Settled]:
    """Each failing check of `results` settled op by op (module docstring): its programs
    recorded on the checked code (`checkout`; None: the current tree) and at its golden's
    base commit here, once, then each key
    of a class that proves (`op_by_op`) whose bits differ proved or told why not
    (`parity.origin._proof`), and, where `origin`, the origin of the first key still failing
    looked for (`CheckResult.origin`). A check that passes, or that fails with nothing to
    prove while `origin` is False, is left as it is. Paths in the origins are relative to the
    git repository holding the project (else to the project's root).

    **Returns:** one `Settled` per result, in order.
    """
    out: dict[str, Settled] = {}
    todo: list[CheckResult] = []
    for r in results:
        if r.passed or r.group is None:
            continue
        if not origin and not any(provable(f) for f in r.comparison.findings):
            continue
        why = _why_not(r, produced)
        if why is None:
            todo.append(r)
        else:
            out[r.name] = _unsettled(r, why, origin)
    builder = BaselineBuilder(config, progress=progress, timeout=timeout)
    if todo:  # before any recording run: a base that is not here is said at once
        missing = _bases_out_of_reach(builder, goldens, todo, produced)
        out |= {r.name: _unsettled(r, missing[r.name], origin) for r in todo if r.name in missing}
        todo = [r for r in todo if r.name not in missing]
    if todo:
        out |= _record_and_settle(
            todo,
            produced,
            builder,
            goldens,
            origin=origin,
            progress=progress,
            timeout=timeout,
            checkout=checkout or Checkout(root=config.root, name="the current tree"),
            kept=kept,
        )
    return [out.get(r.name) or Settled(r, {}) for r in results]


@dataclasses.dataclass(frozen=True)
class FailureSettler:
    """The settler of `parity check` (`parity.check.Settler`): failing golden checks
    settled by `settle_failures` with the producers of `config`, recorded on the tree and
    at each golden's base commit.

    **Fields:** `produced` (what the check compared), `config`, `goldens`, `origin` (name
    the origin of what still fails, not only prove), `progress`, `timeout` (of each
    recording run), `checkout` (the code `produced` came from, recorded again: a bisect
    step's worktree; None: the current tree), `kept` (the producer run that made
    `produced`, kept alive: the tree is recorded in it, no other run starts; None: a
    recording run of its own).
    """

    produced: Produced
    config: ParityConfig
    goldens: GoldenDir
    origin: bool = True
    progress: Progress = lambda _: None
    timeout: float | None = None
    checkout: Checkout | None = None
    kept: KeptRun | None = None

    def settle(self, results: Sequence[CheckResult]) -> list[CheckResult]:
        settled = settle_failures(
            results,
            self.produced,
            self.config,
            self.goldens,
            origin=self.origin,
            progress=self.progress,
            timeout=self.timeout,
            checkout=self.checkout,
            kept=self.kept,
        )
        return [s.result for s in settled]


def _record_and_settle(
    todo: Sequence[CheckResult],
    produced: Produced,
    builder: BaselineBuilder,
    goldens: GoldenDir,
    *,
    origin: bool,
    progress: Progress,
    timeout: float | None,
    checkout: Checkout,
    kept: KeptRun | None,
) -> dict[str, Settled]:
    """`todo`'s groups recorded on `checkout` (one producer run) and at their bases
    (through `builder`), each check settled by its two recordings. A group with keys to
    prove up to rounding has its base recorded first, with every value's numbers, and the
    tree's recording replays its programs on them (`parity.run._recordings.Replaying`)."""
    config = builder.config
    try:
        root = repo_root(config.root)
    except GitError:
        root = config.root
    one = " (in one process)" if produced.layout.processes > 1 else ""
    progress(
        f"recording {', '.join(r.name for r in todo)} op by op{one} {_why_recorded(todo, origin)}"
    )
    out: dict[str, Settled] = {}
    wanted: dict[str, tuple[str, Provenance, Provenance]] = {}
    new: dict[str, Made] = {}
    for r in todo:
        current = _one_process(_run_provenance(produced, r.name))
        try:
            wanted[r.name] = (r.name, goldens.open(r.name).provenance, current)
        except CheckError as e:
            new[r.name] = Made(str(e))
    rounds = {r.name: [f.key for f in r.comparison.findings if provable_up_to_rounding(f)]
              for r in todo if r.name in wanted}  # fmt: skip
    rounds = {g: keys for g, keys in rounds.items() if keys}
    old = base_recordings(config, [wanted[g] for g in rounds], builder=builder, arrays=True)
    replay = {g: Replaying(b, rounds[g], root) for g, b in old.items() if isinstance(b, Path)}
    with owned_tempdir(_PREFIX) as tmp:
        groups = [r.group or "" for r in todo if r.name not in new]
        if kept is not None:  # in the run that made the arrays
            new |= record_kept(kept, groups, Path(tmp), code=checkout.name, replay=replay)
        else:
            new |= record_groups(
                checkout,
                builder.config,
                groups,
                Path(tmp),
                replay=replay,
                progress=progress,
                timeout=timeout,
            )
        ready = [
            w for g, w in wanted.items() if isinstance(new[g].recording, Path) and g not in old
        ]
        old |= base_recordings(config, ready, builder=builder)
        for r in todo:
            mine, base = new.get(r.name) or Made("nothing was recorded"), old.get(r.name)
            if isinstance(mine.recording, Path) and isinstance(base, Path):
                out[r.name] = _recorded(r, mine, base, root, origin, produced)
            else:
                out[r.name] = _unsettled(r, _unrecorded(mine.recording, base), origin)
    return out


def _why_recorded(todo: Sequence[CheckResult], origin: bool) -> str:
    """What the recording is for, in the progress line."""
    proving = any(
        provable(f) or provable_up_to_rounding(f) for r in todo for f in r.comparison.findings
    )
    keys = "its keys" if len(todo) == 1 else "their keys"
    if proving:
        return f"to prove {keys} and name the origin" if origin else f"to prove {keys}"
    return "to name the origin"


def _unrecorded(*sides: Path | str | None) -> str:
    """Why one of two recordings is missing: the line of the first side that is not a file
    (None where no run said why)."""
    missing = next(s for s in sides if not isinstance(s, Path))
    return missing or "nothing was recorded"


def _bases_out_of_reach(
    builder: BaselineBuilder, goldens: GoldenDir, todo: Sequence[CheckResult], produced: Produced
) -> dict[str, str]:
    """The failing checks of `todo` whose golden's base commit is not in this clone (a
    shallow one, say) and whose base recording is not cached, each with one line: what is
    missing and what to do (`base_commit`'s). Asked before any recording run, so a check
    that cannot reach its base pays for none. Groups this cannot judge (no golden, no base
    commit recorded) are left to the recording path, which says why."""
    out: dict[str, str] = {}
    for r in todo:
        try:
            pinned = goldens.open(r.name).provenance
        except CheckError:
            continue
        sha = pinned.base_sha or ""
        current = _one_process(_run_provenance(produced, r.name))
        if not sha or builder.has_entry(r.name, pinned, current, record=True):
            continue
        try:
            base_commit(builder.config.root, sha)
        except BaselineUnavailable as e:
            out[r.name] = f"the base cannot be re-produced here: {e}"
    return out


def _run_provenance(produced: Produced, group: str) -> Provenance:
    """The provenance of the producer process that made `group` (an empty one where the
    run made no such group)."""
    run = produced.runs.get(group)
    return run.provenance if run is not None else Provenance()


def _one_process(current: Provenance) -> Provenance:
    """The environment both sides are recorded in: the check's, in one process with its
    devices per process (a recording is made in one process; the tree's is made with the
    configured devices per process too)."""
    processes, devices = layout_of(current)
    if processes == 1:
        return current
    return dataclasses.replace(current, processes=1, device_count=devices)


def _not_named(reason: str) -> Localisation:
    return Localisation("not_named", reason=reason)


def _located(
    step: tuple[str, str, str],
    new: Path | str | None,
    old: Path | str | None,
    root: Path,
    old_name: str,
) -> Localisation:
    """`locate_files` of `step`'s `(group, key, class)` between two recordings, or why not."""
    _, key, class_name = step
    if not isinstance(new, Path) or not isinstance(old, Path):
        return _not_named(_unrecorded(new, old))
    try:
        return locate_files(new, old, key, class_name, root=root, old_name=old_name)
    except (LocaliseError, UnknownClassError, ValueError) as e:
        return _not_named(e.reason if isinstance(e, LocaliseError) else str(e))


def locate_between(
    config: ParityConfig,
    repo: Path,
    step: tuple[str, str, str],
    new_sha: str,
    old_sha: str,
    *,
    progress: Progress = lambda _: None,
    timeout: float | None = None,
) -> Localisation:
    """The origin of a bisection's answer: `step`'s `(group, key, class)` recorded at the
    first bad commit `new_sha` and at its parent `old_sha` (each in a temporary worktree of
    `repo`, in this environment), as `locate_files` gives it; file paths relative to the
    repository. Never raises for a program it cannot record: it says why."""
    group = step[0]
    files: dict[str, Path | str] = {}
    with owned_tempdir(_PREFIX) as tmp:
        try:
            for side, sha in (("new", new_sha), ("old", old_sha)):
                (tmp / side).mkdir()
                progress(f"recording {group} at {sha[:12]} to name the origin")
                with temporary_worktree(repo, sha) as wt:
                    files[side] = record_groups(
                        Checkout(root=wt, drop_paths=config.src, name=f"commit {sha[:12]}"),
                        config,
                        [group],
                        tmp / side,
                        progress=progress,
                        timeout=timeout,
                    )[group].recording
                    files[f"{side}_root"] = wt.resolve()
                if isinstance(files[side], str):
                    return _not_named(str(files[side]))
        except GitError as e:
            return _not_named(f"cannot check out: {' '.join(str(e).split())}")
        root = files["new_root"]
        assert isinstance(root, Path)
        return _located(step, files["new"], files["old"], root, f"the parent {old_sha[:12]}")
