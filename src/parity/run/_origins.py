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
both), so a failing check run again starts no run but its own. The proofs and the origin are
then made through the one door every face settles by (`parity.origin.settle_by`; one
alignment serves both): this module gives it its sides, the tree and the base
(`ProducerSides`). A key of a class that proves up to rounding (`up_to_rounding`) is settled
by the shadow replay (docs/design.md, "Proved up to rounding"): the base is recorded first
with every value's numbers (`prepare(..., record=ARRAYS)`, cached so), and the tree's
recording replays each of its operations on them, in the same producer run
(`parity.run._recordings.Replaying`); the run hands back its answers, the proof and the
origin of each such key (`parity.origin._replayed`). `parity bisect` names the origin
between the first bad commit and its parent the same way (`parity.run._between`).

Where a group is not recorded, one line says why, and the verdict stands (an `op_by_op`
key stays unproved, for that reason): its outputs are
not computed by the jax programs the producer runs (numpy made them), the run spans processes,
the failing key's class gives no matching tolerance (`logit_kl`), the base cannot be
re-produced, or the program is too large (`_runner_groups.ORIGIN_MAX_BYTES`).

Nothing here imports jax.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from parity._environment import layout_of
from parity._results import BaselineUnavailable, CheckError, CheckResult
from parity.check import GoldenDir
from parity.judge._converting import Conversion, ConvertError
from parity.judge._dataflow import DATAFLOW, UNREAD
from parity.judge._renames import parse_renames
from parity.judge._stacking import parse_stack
from parity.machinery._config import ParityConfig
from parity.machinery._launcher import KeptRun
from parity.machinery._producers_table import ProducersTable
from parity.machinery._worktree import GitError, repo_root
from parity.origin import Recording
from parity.origin._api import Settlement
from parity.origin._hunks import Diff
from parity.origin._proof import Proof, provable, provable_up_to_rounding
from parity.origin._settling import NotRecorded, Pair, Rules, settle_by
from parity.run._baseline import BaselineBuilder, base_commit
from parity.run._diff import source_diff
from parity.run._produced import Checkout, Produced
from parity.run._recordings import ARRAYS, Made, Replaying, record_groups, record_kept, recorded
from parity.store import Provenance
from parity.store._staging import owned_tempdir

__all__ = [
    "FailureSettler",
    "ProducerSides",
    "Settled",
    "base_recordings",
    "read_pair",
    "rules_of",
    "settle_failures",
]

_PREFIX = "parity-origin-"
#: What the tree's programs are recorded against, in the lines.
_BASE = "the base commit"

Progress = Callable[[str], None]


def rules_of(
    table: ProducersTable,
    conversions: Mapping[str, Conversion | ConvertError] | None = None,
    results: Sequence[CheckResult] = (),
) -> Rules:
    """What a check of the producers' table settles by: its `STACK` and `RENAME` rules,
    and, for each of `results` (by its name) whose group the producers' `CONVERT` names,
    what the converter does to its goldens (`conversions`, `Produced.conversions`)."""
    convert = {
        r.name: c
        for r in results
        if isinstance(c := (conversions or {}).get(r.group or ""), Conversion)
    }
    return Rules(
        stack=parse_stack(table.stack), rename=parse_renames(table.rename), convert=convert
    )


def base_recordings(
    config: ParityConfig,
    wanted: Sequence[tuple[str, Provenance, Provenance]],
    *,
    builder: BaselineBuilder | None = None,
    arrays: bool = False,
    progress: Progress = lambda _: None,
    timeout: float | None = None,
) -> dict[str, Path | NotRecorded]:
    """Each group's programs recorded at its golden's base commit in the environment its
    check ran in: the base re-produced here (`parity.run._baseline.BaselineBuilder`) with its
    recording, from the cache, else in one producer run per base commit and environment
    that makes both the arrays and the recording (one code path, one cache entry).

    **Arguments:** `wanted`, `(group, pinned provenance, current provenance)` triples;
    `builder`, the check's (default one on `config`'s cache); `arrays`, every value's
    numbers kept too (a shadow replay runs on them).

    **Returns:** group -> the recording's file in the cache, or why not.
    """
    builder = builder or BaselineBuilder(config, progress=progress, timeout=timeout)
    out: dict[str, Path | NotRecorded] = {}
    for group, got in builder.prepare(wanted, record=ARRAYS if arrays else True).items():
        if isinstance(got, BaselineUnavailable):
            out[group] = NotRecorded(f"the base cannot be re-produced here: {got.reason}")
            continue
        made = recorded(got.path)
        sha = got.sha[:12]
        if isinstance(made, NotRecorded):
            made = NotRecorded(f"at the base {sha}: {made.reason}", made.traceback)
        out[group] = made if made is not None else NotRecorded(f"at the base {sha}: nothing")
    return out


def read_pair(new: Made, old: Path | NotRecorded) -> Pair:
    """A group's two recordings read from their files (why not, for a side that has none
    or cannot be read), with the tree's replay answers."""
    sides: list[Recording | NotRecorded] = []
    for side in (new.recording, old):
        if isinstance(side, Path):
            try:
                side = Recording.read(side)
            except (OSError, ValueError, KeyError) as e:
                side = NotRecorded(f"the recordings cannot be read: {e}")
        sides.append(side)
    return Pair(sides[0], sides[1], new.replayed)


@dataclasses.dataclass
class ProducerSides:
    """The sides of a golden check (`parity check`, a `parity bisect` step, the pytest
    plugin; `parity.origin.Sides`): each failing group's programs recorded on the checked
    code (in `kept`, the producer run that made its arrays, kept alive; else a recording run
    of its own on `checkout`) and at its golden's base commit, re-produced here
    (`BaselineBuilder`, cached).

    **Fields:** `results` (the failing checks, by name), `produced`, `goldens`, `builder`,
    `checkout`, `kept`, `origin` (whether the origin is asked, for the progress line),
    `progress`, `timeout` (of each recording run), `refused` (why no group can be recorded
    where the caller knows it before asking: the pytest plugin in a session of several
    processes, or with no producers file).
    """

    results: Mapping[str, CheckResult]
    produced: Produced
    goldens: GoldenDir
    builder: BaselineBuilder
    checkout: Checkout
    kept: KeptRun | None = None
    origin: bool = True
    progress: Progress = lambda _: None
    timeout: float | None = None
    refused: str | None = None
    against: str = _BASE

    _root: Path | None = dataclasses.field(default=None, init=False, repr=False)
    _diffs: dict[str, Diff | None] = dataclasses.field(default_factory=dict, init=False)

    @property
    def root(self) -> Path:
        """The git repository holding the project (else the project's root), asked of git
        once."""
        if self._root is None:
            try:
                self._root = repo_root(self.builder.config.root)
            except GitError:
                self._root = self.builder.config.root
        return self._root

    def refuse(self, names: Sequence[str]) -> dict[str, NotRecorded]:
        """The groups whose programs cannot be recorded (`_why_not`) and those whose base
        is out of reach (`_bases_out_of_reach`), asked before any run."""
        if self.refused is not None:
            return dict.fromkeys(names, NotRecorded(self.refused))
        out: dict[str, NotRecorded] = {}
        for name in names:
            why = _why_not(self.results[name], self.produced)
            if why is not None:
                out[name] = NotRecorded(why)
        rest = [self.results[n] for n in names if n not in out]
        missing = _bases_out_of_reach(self.builder, self.goldens, rest, self.produced)
        return out | {name: NotRecorded(why) for name, why in missing.items()}

    def diff(self, name: str) -> Diff | None:
        """How the checked code differs from the group's golden base commit
        (`parity.run._diff.source_diff`), asked of git once per base."""
        try:
            base = self.goldens.open(self.results[name].name).provenance.base_sha
        except (CheckError, KeyError):
            return None
        if not base:
            return None
        if base not in self._diffs:
            between = f"the base {base[:12]} and {self.checkout.name}"
            self._diffs[base] = source_diff(self.checkout.root, base, between=between)
        return self._diffs[base]

    def record(self, wanted: Mapping[str, Sequence[str]]) -> Iterator[tuple[str, Pair]]:
        """The groups of `wanted` recorded on the tree (one producer run) and at their
        bases (through `builder`). A group with keys to prove up to rounding has its base
        recorded first, with every value's numbers, and the tree's recording replays its
        programs on them (`parity.run._recordings.Replaying`)."""
        todo = [self.results[name] for name in wanted]
        config, produced = self.builder.config, self.produced
        one = " (in one process)" if produced.layout.processes > 1 else ""
        self.progress(
            f"recording {', '.join(wanted)} op by op{one} {_why_recorded(todo, self.origin)}"
        )
        triples: dict[str, tuple[str, Provenance, Provenance]] = {}
        new: dict[str, Made] = {}
        for r in todo:
            current = _one_process(_run_provenance(produced, r.name))
            try:
                triples[r.name] = (r.name, self.goldens.open(r.name).provenance, current)
            except CheckError as e:
                new[r.name] = Made(NotRecorded(str(e)))
        rounds = {g: list(keys) for g, keys in wanted.items() if keys and g in triples}
        old = base_recordings(
            config, [triples[g] for g in rounds], builder=self.builder, arrays=True
        )
        root = self.root
        replay = {g: Replaying(b, rounds[g], root) for g, b in old.items() if isinstance(b, Path)}
        with owned_tempdir(_PREFIX) as tmp:
            groups = [r.group or "" for r in todo if r.name not in new]
            if self.kept is not None:  # in the run that made the arrays
                new |= record_kept(
                    self.kept, groups, Path(tmp), code=self.checkout.name, replay=replay
                )
            else:
                new |= record_groups(
                    self.checkout,
                    config,
                    groups,
                    Path(tmp),
                    replay=replay,
                    progress=self.progress,
                    timeout=self.timeout,
                )
            ready = [
                w for g, w in triples.items() if isinstance(new[g].recording, Path) and g not in old
            ]
            old |= base_recordings(config, ready, builder=self.builder)
            for name in wanted:
                mine = new.get(name) or Made(NotRecorded("nothing was recorded"))
                base = old.get(name) or NotRecorded("nothing was recorded at the base")
                if isinstance(mine.recording, NotRecorded):  # the base is not read
                    yield name, Pair(mine.recording, mine.recording)
                else:
                    yield name, read_pair(mine, base)


def _why_not(r: CheckResult, produced: Produced) -> str | None:
    """Why the failing check `r` gets no recording, or None: asked before any run."""
    group = r.group or ""
    if r.comparison.first_failure is None:
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
    refused: str | None = None,
) -> list[Settled]:
    """Each failing check of `results` settled through the one door
    (`parity.origin.settle_by`), its sides the group's programs recorded on the checked code
    (`checkout`; None: the current tree) and at its golden's base commit here, once
    (`ProducerSides`), by the producers' `STACK` and `RENAME` (`Produced.table`): each key
    of a class that proves whose bits differ proved or told why not, and, where `origin`,
    the origin of the first key still failing looked for (`CheckResult.origin`). A check
    that passes, or that fails with nothing to prove while `origin` is False, is left as it
    is. Paths in the origins are relative to the git repository holding the project (else
    to the project's root). With `refused`, nothing is recorded: each failure is settled as
    one whose programs cannot be, for that reason.

    **Returns:** one `Settled` per result, in order.
    """
    failing = {r.name: r for r in results if not r.passed and r.group is not None}
    sides = ProducerSides(
        failing,
        produced,
        goldens,
        BaselineBuilder(config, progress=progress, timeout=timeout),
        checkout or Checkout(root=config.root, name="the current tree"),
        kept=kept,
        origin=origin,
        progress=progress,
        timeout=timeout,
        refused=refused,
    )
    comparisons = {name: r.comparison for name, r in failing.items()}
    rules = rules_of(produced.table, produced.conversions, list(failing.values()))
    done = settle_by(comparisons, sides, rules=rules, origin=origin)
    return [_result(r, done.get(r.name)) for r in results]


def _result(r: CheckResult, done: Settlement | None) -> Settled:
    """`r` with what settling it made, where it was settled."""
    if done is None:
        return Settled(r, {})
    result = dataclasses.replace(r, comparison=done.comparison, origin=done.origin)
    return Settled(result, done.proofs)


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


def _why_recorded(todo: Sequence[CheckResult], origin: bool) -> str:
    """What the recording is for, in the progress line."""
    proving = any(
        provable(f) or provable_up_to_rounding(f) for r in todo for f in r.comparison.findings
    )
    keys = "its keys" if len(todo) == 1 else "their keys"
    if proving:
        return f"to prove {keys} and name the origin" if origin else f"to prove {keys}"
    return "to name the origin"


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
