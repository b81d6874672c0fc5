"""The one door to a verdict (issue 72): every face that settles a failing comparison by
its programs (`parity check` and each `parity bisect` step, bisect's origin, the pytest
plugin, `assert_equivalent`) hands `settle` its failing comparisons and its two `Sides`,
and gets back one `Settlement` each. A face only says how its sides are recorded (a kept
producer run and the base re-produced, two commits, two live functions); which failures
are worth recording, the proofs op by op and up to rounding, the origin, and what is said
where a side could not be recorded are decided here, once.

Nothing here imports jax (a live side imports it where it records).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from parity.judge._classes import REGISTRY, ToleranceClass
from parity.judge._compare import Comparison
from parity.judge._converting import Conversion
from parity.judge._renames import Rename
from parity.judge._stacking import StackRule
from parity.origin._api import Settlement, prove_and_locate
from parity.origin._edit import edit_of
from parity.origin._executables import Executables
from parity.origin._hunks import Diff, sources_diff
from parity.origin._localisation import Localisation
from parity.origin._proof import provable, provable_up_to_rounding, settle, unproved
from parity.origin._record import LocaliseError, RecordingError, record
from parity.origin._recording import Recording
from parity.origin._replayed import Replay
from parity.origin._shadow import Shadow

__all__ = [
    "LiveSides",
    "NotRecorded",
    "Pair",
    "Rules",
    "Sides",
    "settle_by",
    "worth_settling",
]


@dataclass(frozen=True)
class NotRecorded:
    """Why a side of a failing comparison has no recording: `reason`, one line (what could
    not run or be read, where, and the log that keeps the whole output where one was
    written); `traceback`, where recording raised in this process, the original one."""

    reason: str
    traceback: str = ""


@dataclass(frozen=True)
class Pair:
    """One failing comparison's two sides as recorded: `new` (the code under check) and
    `old` (what it is held against), each a `Recording` or why there is none; `shadow`,
    `new`'s replay on `old`'s values where a key is to be proved up to rounding and the
    replay was made (`parity.origin._shadow.Shadow` live, or its answers read back,
    `parity.origin._replayed.Replayed`)."""

    new: Recording | NotRecorded
    old: Recording | NotRecorded
    shadow: Replay | None = None

    def missing(self) -> NotRecorded | None:
        """Why the pair cannot be settled: its first side that is not a recording."""
        for side in (self.new, self.old):
            if isinstance(side, NotRecorded):
                return side
        return None


class Sides(Protocol):
    """How a face obtains the recordings of the comparisons it settles, each named as the
    face names it (a check's name).

    **Attributes:** `against` (what the old side is, for the lines: `"the base commit"`),
    `root` (what the origins' paths are given relative to; None: as recorded).

    **Methods:** `refuse(names)`, asked before anything runs: the comparisons that cannot
    be recorded at all, each with why (a producer computed on the host, a base that is not
    in this clone), so they cost no run; `record(wanted)`, each remaining name with the keys
    to prove up to rounding (its old side then recorded with every value's numbers first,
    and its new side replayed on them): each name with its `Pair`, one at a time (each is
    settled and let go before the next is read: two recordings in memory at once);
    `diff(name)`, asked where an origin was named, how the new side's source differs from
    the old side's (`parity.origin._hunks.Diff`: the hunks the origin's edit is found
    among), None where the face cannot say.
    """

    @property
    def against(self) -> str: ...

    @property
    def root(self) -> Path | None: ...

    def refuse(self, names: Sequence[str]) -> Mapping[str, NotRecorded]: ...

    def record(self, wanted: Mapping[str, Sequence[str]]) -> Iterable[tuple[str, Pair]]: ...

    def diff(self, name: str) -> Diff | None: ...


@dataclass(frozen=True)
class Rules:
    """What every face settles by: the classes (`registry`) and the keys said as one, a
    stacked output's rows (`stack`, `parity.judge._stacking`), a renamed subtree
    (`rename`, `parity.judge._renames`) and, by the comparison's name, what the user's
    converter does to its goldens (`convert`, `parity.judge._converting`), as the
    comparison itself was made by."""

    registry: Mapping[str, ToleranceClass] = field(default_factory=lambda: REGISTRY)
    stack: Sequence[StackRule] = ()
    rename: Sequence[Rename] = ()
    convert: Mapping[str, Conversion] = field(default_factory=dict)


def worth_settling(comparison: Comparison, origin: bool) -> bool:
    """Whether recording the programs can change what `comparison` says: it fails, and
    either its origin is asked for or a failure of it may be proved into a pass."""
    if comparison.passed:
        return False
    return origin or any(provable(f) for f in comparison.findings)


def settle_by(
    failing: Mapping[str, Comparison],
    sides: Sides,
    *,
    rules: Rules = Rules(),
    origin: bool = True,
) -> dict[str, Settlement]:
    """Each comparison of `failing` (by the face's name for it) settled by the recordings of
    its two programs: a key of a class that proves (`op_by_op`) proved op by op or told why
    not, one of a class that proves up to rounding by the replay of the new program on the
    old one's values, and, where `origin`, the origin of the first key still failing named
    (`prove_and_locate`). Where a side cannot be recorded, the provable keys stay failures
    for that reason and the origin is not named, for it, with its traceback where one was
    kept. A comparison not `worth_settling` is left out.

    **Returns:** name -> its `Settlement`, for the comparisons settled.
    """
    todo = {name: c for name, c in failing.items() if worth_settling(c, origin)}
    if not todo:
        return {}
    refused = sides.refuse(list(todo))
    out = {name: _unsettled(todo[name], why, origin) for name, why in refused.items()}
    wanted = {
        name: [f.key for f in c.findings if provable_up_to_rounding(f)]
        for name, c in todo.items()
        if name not in out
    }
    if not wanted:
        return out
    for name, pair in sides.record(wanted):
        comparison = todo[name]
        why = pair.missing()
        if why is not None:
            out[name] = _unsettled(comparison, why, origin)
            continue
        assert isinstance(pair.new, Recording) and isinstance(pair.old, Recording)
        out[name] = prove_and_locate(
            comparison,
            pair.new,
            pair.old,
            registry=rules.registry,
            root=sides.root,
            against=sides.against,
            origin=origin,
            stack=rules.stack,
            rename=rules.rename,
            shadow=pair.shadow,
            convert=rules.convert.get(name),
        )
    for name, done in out.items():
        out[name] = _with_edit(done, functools.partial(sides.diff, name))
    for name in wanted.keys() - out.keys():  # a side that made nothing of it
        out[name] = _unsettled(todo[name], NotRecorded("nothing was recorded"), origin)
    return out


def _with_edit(done: Settlement, diff: Callable[[], Diff | None]) -> Settlement:
    """`done` with the edit that made its named origin (`parity.origin._edit.edit_of`),
    where the face can say how the two sides' sources differ."""
    found = done.origin
    if found is None or found.origin is None:
        return done
    known = diff()
    if known is None:
        return done
    return replace(done, origin=replace(found, edit=edit_of(found.origin, known)))


def _unsettled(comparison: Comparison, why: NotRecorded, origin: bool) -> Settlement:
    """`comparison` where its programs cannot be recorded: its provable keys unproved for
    `why`, its origin not named for it (with the traceback where one was kept)."""
    proofs = unproved(comparison, why.reason)
    settled = settle(comparison, proofs)
    first = settled.first_failure
    named = None
    if origin and first is not None:
        named = Localisation("not_named", key=first.key, reason=why.reason, traceback=why.traceback)
    return Settlement(settled, named, proofs)


@dataclass(frozen=True)
class LiveSides:
    """Two live functions called on the same arguments, recorded op by op in this process
    (`parity.origin.record`), once for every comparison settled: `old_fn` first, then
    `new_fn` with its replay on `old_fn`'s values (`Shadow`) where a key is to be proved up
    to rounding. An operation that raises is said with its traceback (`RecordingError`)."""

    new_fn: Callable[..., Any]
    old_fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    against: str = "the old program"
    root: Path | None = None

    def refuse(self, names: Sequence[str]) -> Mapping[str, NotRecorded]:
        return {}

    def diff(self, name: str) -> Diff | None:
        """The two functions' sources diffed (`parity.origin._hunks.sources_diff`)."""
        return sources_diff(self.new_fn, self.old_fn, self.root)

    def record(self, wanted: Mapping[str, Sequence[str]]) -> Iterable[tuple[str, Pair]]:
        rounds = any(wanted.values())
        try:
            shared = Executables()  # an operation both sides run is compiled once
            old = record(self.old_fn, *self.args, executables=shared, **self.kwargs)
            shadow = Shadow(old) if rounds else None
            new = record(self.new_fn, *self.args, shadow=shadow, executables=shared, **self.kwargs)
        except RecordingError as e:  # which operation raised, where, and its traceback
            why = NotRecorded(e.reason, e.traceback)
        except LocaliseError as e:
            why = NotRecorded(e.reason)
        except Exception as e:  # raised around the operations: still its traceback
            failure = RecordingError.of(e)
            why = NotRecorded(failure.reason, failure.traceback)
        else:
            return [(name, Pair(new, old, shadow)) for name in wanted]
        return [(name, Pair(why, why)) for name in wanted]
