"""A golden check's second stage: its first verdict judged against the baseline
(docs/design.md, "Two references"), off the pin's environment the golden group re-produced
at its base commit here, which the tree is compared with, exactly (`against_baseline`,
making a `BaseJudgement`; `against_baselines` for several, their baselines prepared at
once by `prepare_baselines`); the header's `reference` line naming the reference
(`reference_line`).

The committed goldens are the reference of a check run in the environment they were
pinned in. Elsewhere (another processor, ISA cap, device layout, backend, jax or XLA flags)
their bits need not reproduce, and the calibrated bounds that absorb that noise would also
absorb a small real change. So where such a check has keys that fail their pinned class,
`against_baseline`:

1. holds the baseline (a golden-format file a `BaselineSource` provides) to the committed
   goldens under the calibrated bound of the dimensions that differ
   (`parity.calibrated._bounds.calibrated_comparison`; on another backend than the pin's
   no calibration bounds it, and each key's pinned class does), which says how far the
   goldens lie from this environment's bits. Within that bound the header says so; beyond
   it (the goldens' recorded noise does not cover what this environment moved: a layout
   or ISA cap not calibrated, another processor, backend, jax or jaxlib release) the
   baseline judges all the same, and the header says what moved, how many keys lie beyond
   their bound, the farthest, and what would cover this environment
   (`parity.calibrated._bounds.environment_remedy`: `parity repin` adopts it; `parity
   calibrate` records its noise only where it perturbs what moved). Never a refusal
   (docs/design.md, "On any backend");
2. compares the tree with the baseline under the pinned classes, as the goldens would in
   their own environment: bitwise keys bit for bit.

A refusal (`CheckError`) remains where the baseline cannot be used at all: it lacks golden
keys or its file is unusable, or it cannot be re-produced and the check requires it
(`required_error`).

A `BaselineSource` (`parity.run._baseline.BaselineBuilder` for the CLI and the pytest
plugin) re-produces a group at its base commit; where it cannot (the commit is missing, the
producers cannot run there), it raises `BaselineUnavailable` (defined with what a check
hands back, `parity._results`, and named here with the protocol that raises it) and the
check falls back to the calibrated comparison with the goldens, saying why in its header.

Nothing here runs producers or imports jax.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parity._results import BaselineUnavailable, CheckError
from parity.calibrated._bounds import (
    calibrated_comparison,
    calibration_columns,
    environment_remedy,
)
from parity.calibrated._spreads import Spreads
from parity.check._first import FirstVerdict
from parity.check._request import (
    Baseline,
    BaselineRequest,
    BaselineSource,
    BatchBaselineSource,
)
from parity.judge._compare import Comparison, Finding, compare_trees
from parity.judge._floats import count, sig
from parity.judge._tolerance import to_class
from parity.store import GoldenStoreError, open_goldens

if TYPE_CHECKING:
    from parity._environment import EnvironmentDifference

__all__ = [
    "BASELINE",
    "BASELINE_OFF",
    "BaseJudgement",
    "against_baseline",
    "against_baselines",
    "prepare_baselines",
    "reference_line",
    "required_error",
]


#: What the baseline is called in a finding's words ("actual ... vs baseline ..."), where
#: the tree was compared with it.
BASELINE = "baseline"


@dataclass(frozen=True, kw_only=True)
class BaseJudgement:
    """A golden check's second stage (`against_baseline`): the tree judged against its
    reference, the baseline where there is one, else the goldens.

    **Fields:** `comparison`, the tree against its reference (against the baseline, exactly;
    else the first verdict's comparison with the goldens, under their calibrated bounds
    where the environment differs on the pin's backend); `reference`, the header's line
    naming the reference; `environment`, the header's line on the calibrated bounds used
    (`""` where none); `path`, the baseline's file (`""` where none); `why`, why there is no
    baseline (None where there is one, or none was wanted).
    """

    comparison: Comparison
    reference: str
    environment: str = ""
    path: str = ""
    why: BaselineUnavailable | None = None

    @property
    def by_baseline(self) -> bool:
        """Whether the baseline was the reference."""
        return bool(self.path)


#: Why a key passed by calibration where the baseline was turned off.
BASELINE_OFF = BaselineUnavailable(
    "the baseline is off",
    "check with it on (baseline auto; require makes this case an error) to compare them bit "
    "for bit with the baseline re-produced here",
)


def reference_line(difference: EnvironmentDifference, passed: bool) -> str:
    """The header's `reference` line where the baseline is not compared with (or before it
    is)."""
    if difference.unknown:
        return f"the goldens (the environments are not compared: {difference.unknown})"
    if difference.across_backends:
        return (
            "the goldens, pinned on another backend, under their pinned classes (the baseline "
            "is off): not exact, their bits and noise are another backend's"
        )
    if not difference.moves_bits:
        return "the goldens (this is the environment they were pinned in)"
    if passed:
        return "the goldens: every key holds its pinned class here"
    return "the goldens, by calibration (the baseline is off)"


def prepare_baselines(
    source: BaselineSource | None, wanted: Sequence[BaselineRequest]
) -> dict[str, Baseline | BaselineUnavailable]:
    """The baselines the first verdicts want, each group's or why there is none: prepared at
    once where `source` builds several groups in one run (`BatchBaselineSource`: one
    producer run per base commit and environment), else group by group; every group
    `BASELINE_OFF` where `source` is None (the baseline is off).

    **Arguments:**

    - `source`: what re-produces the baselines, or None.
    - `wanted`: `(group, pinned provenance, current provenance)` of each first verdict
      that wants a baseline (`FirstVerdict.baseline_request`).

    **Returns:** group -> its `Baseline`, or the `BaselineUnavailable` saying why not.
    """
    if source is None:
        return {group: BASELINE_OFF for group, _, _ in wanted}
    if not wanted:
        return {}
    if isinstance(source, BatchBaselineSource):
        return dict(source.prepare(wanted))
    out: dict[str, Baseline | BaselineUnavailable] = {}
    for group, pinned, current in wanted:
        try:
            out[group] = source.reproduce(group, pinned, current)
        except BaselineUnavailable as e:
            out[group] = e
    return out


def required_error(group: str, why: BaselineUnavailable, *, across: bool = False) -> CheckError:
    """The error of a check that requires the baseline where it cannot be re-produced
    (`across`: on another backend than the pin's)."""
    instead = (
        "the tree would be judged against goldens pinned on another backend"
        if across
        else "a bitwise key would pass by its calibrated bound alone"
    )
    return CheckError(
        f"group {group!r}: the baseline is required (baseline require) but cannot be "
        f"re-produced here ({why.reason}), so {instead}; {why.hint}; or accept that "
        "judgement (baseline auto)"
    )


def against_baselines(
    firsts: Sequence[FirstVerdict], source: BaselineSource | None
) -> list[BaseJudgement]:
    """The second stage of several first verdicts, in one pass: the baselines they want
    prepared at once (`prepare_baselines`), then each verdict judged against its
    reference (`against_baseline`), in order.

    **Arguments:**

    - `firsts`: the first verdicts, one per golden group.
    - `source`: what re-produces the baselines; None: the baseline is off.

    **Returns:** one `BaseJudgement` per first verdict, in order.
    """
    wanted = [f.baseline_request() for f in firsts if f.wants_baseline]
    baselines = prepare_baselines(source, wanted)
    return [against_baseline(f, baselines.get(f.group)) for f in firsts]


def against_baseline(
    first: FirstVerdict, baseline: Baseline | BaselineUnavailable | None
) -> BaseJudgement:
    """The second stage: the first verdict's tree judged against its reference, and the
    header's `reference` line naming it. With a baseline, the tree compared with it
    (reusing the first verdict's findings where they are what comparing again would find;
    see the module docstring). Without one (none wanted: None; or it cannot be had: why),
    the first verdict's comparison with the goldens, under their calibrated bounds where
    the environment differs on the pin's backend, and the line says why; where the check
    requires the baseline, a `CheckError` says so instead."""
    difference = first.difference
    if isinstance(baseline, Baseline):
        return _by_baseline(first, baseline)
    if baseline is None:
        line = reference_line(difference, first.comparison.passed)
    elif first.request.require_baseline:
        raise required_error(first.group, baseline, across=difference.across_backends)
    elif baseline is BASELINE_OFF:
        line = reference_line(difference, passed=False)
    elif difference.across_backends:
        line = (
            "the goldens, pinned on another backend, under their pinned classes: the "
            f"baseline cannot be re-produced here ({baseline.reason}); {baseline.hint}"
        )
    else:
        line = (
            "the goldens, by calibration: the baseline cannot be re-produced here "
            f"({baseline.reason}); {baseline.hint}"
        )
    if difference.across_backends:  # no calibration bounds another backend
        return BaseJudgement(comparison=first.comparison, reference=line, why=baseline)
    try:
        comparison, environment = calibrated_comparison(
            first.comparison,
            first.flat_a,
            first.gf,
            first.classes.spreads,
            difference,
            first.registries.policy,
            current=first.current,
            budget=first.request.budget,
        )
    except GoldenStoreError as e:
        raise CheckError(f"golden group {first.group!r} is unusable: {e}") from None
    return BaseJudgement(
        comparison=comparison, reference=line, environment=environment, why=baseline
    )


def _by_baseline(first: FirstVerdict, baseline: Baseline) -> BaseJudgement:
    """The tree of a first verdict compared with its baseline (see the module docstring).

    **Arguments:**

    - `first`: the check's first verdict (`parity.check._first.first_verdict`): the tree's arrays
      (`flat_a`), the golden file, each key's class (the check's precedence, each
      calibrated key's spread bound), the two registries (the tree is judged by the exact
      classes, with no drift relaxation, since the tree and the baseline share their
      environment; the baseline is held to the goldens by the drift policy's), how this
      environment differs from the pin's (decided once), the forward order, the keys the
      check covers; and its comparison with the goldens, whose findings are reused where
      they are what this comparison would find (`_tree_against_baseline`).
    - `baseline`: the group re-produced at the golden's base commit in this environment.

    **Returns:** the comparison of the tree with the baseline, and the header's `reference`
    line naming it (and how far the goldens lie from it: within their pinned classes or
    calibrated noise, or beyond, which judges all the same), as a `BaseJudgement`. Raises
    `CheckError` where the baseline lacks golden keys or its file is unusable.
    """
    gf, group, difference, keys = first.gf, first.group, first.difference, first.keys
    classes, held_registry, order = first.classes.bound, first.registries.policy, first.forward
    try:
        with open_goldens(baseline.path) as bf:
            missing = [k for k in keys if k not in bf]
            if missing:
                raise CheckError(
                    f"group {group!r}: the baseline re-produced at {baseline.sha[:12]} "
                    f"({baseline.path}) lacks {count(len(missing), 'golden key')}, first "
                    f"{missing[0]!r}: the producers make other keys at the base commit than "
                    "the goldens hold; repin the group, or pass --baseline off"
                )
            baseline_arrays = {k: bf.source(k) for k in keys}
            golden = {k: gf.source(k) for k in keys}
            held = compare_trees(
                baseline_arrays, golden, classes, registry=held_registry, order=order
            )
            if not difference.across_backends:  # no calibration bounds another backend
                held, _ = calibrated_comparison(
                    held,
                    baseline_arrays,
                    gf,
                    Spreads.of(gf.provenance),
                    difference,
                    held_registry,
                    current=first.current,
                )
            comparison = _tree_against_baseline(first, baseline_arrays, held)
    except GoldenStoreError as e:
        raise CheckError(
            f"group {group!r}: the baseline re-produced at {baseline.sha[:12]} is unusable "
            f"({e}); clear it with `parity baseline clear` and check again"
        ) from None
    how = "built now" if not baseline.cached else "cached"
    took = f" in {baseline.seconds:.0f}s" if not baseline.cached else ""
    made = f"the baseline re-produced here at {baseline.sha[:12]} ({how}{took} at {baseline.path})"
    if held.passed and not difference.across_backends:
        # Only a key the goldens' pinned class refused and a calibrated bound admitted makes
        # the baseline "within the calibrated noise"; otherwise it holds the pinned classes.
        calibrated = bool(held.by_calibration)
        within = "the goldens' calibrated noise" if calibrated else "the goldens' pinned classes"
        line = (
            f"{made}, in this environment ({', '.join(difference.changes)}), itself within "
            f"{within}: {_worst(held.findings)}"
        )
    else:
        line = f"{made}, {_beyond(first, baseline, held)}"
    return BaseJudgement(comparison=comparison, reference=line, path=str(baseline.path))


def _tree_against_baseline(
    first: FirstVerdict, baseline_arrays: Mapping[str, Any], held: Comparison
) -> Comparison:
    """The tree against the baseline under the exact classes. A key whose bytes equal the
    goldens' both in the first verdict (under the drift policy's classes) and in the
    baseline (`held`), under the same class in both registries, equals the baseline bit for
    bit: its first finding, named against the baseline, is what comparing it again would
    find, so it is not compared again."""
    classes, registries = first.classes.bound, first.registries
    same = {f.key for f in held.findings if f.bitwise_equal}
    reused = {
        f.key: dataclasses.replace(f, reference=BASELINE)
        for f in first.comparison.findings
        if f.bitwise_equal
        and f.key in same
        and to_class(classes(f.key), registries.exact)
        == to_class(classes(f.key), registries.policy)
    }
    rest = compare_trees(
        {k: a for k, a in first.flat_a.items() if k not in reused},
        {k: b for k, b in baseline_arrays.items() if k not in reused},
        classes,
        registry=registries.exact,
        order=first.forward,
        reference=BASELINE,
    )
    if not reused:
        return rest
    # The places in the forward order are the first verdict's: the same keys, the same order.
    found = {f.key: f for f in rest.findings}
    return Comparison(
        tuple(
            reused.get(f.key) or dataclasses.replace(found[f.key], order=f.order)
            for f in first.comparison.findings
        )
    )


def _differ(findings: Sequence[Finding]) -> str:
    """How many keys of the baseline differ from the goldens, in one phrase."""
    moved = [f for f in findings if not f.bitwise_equal]
    if not moved:
        return "bit for bit equal to the goldens"
    verb = "differs" if len(moved) == 1 else "differ"
    return f"{len(moved)} of {count(len(findings), 'key')} {verb} from the goldens"


def _worst(findings: Sequence[Finding]) -> str:
    """How close the baseline came to the goldens, in one phrase, where every key holds
    its bound: `_differ`, and the key nearest its bound."""
    text = _differ(findings)
    moved = [f for f in findings if not f.bitwise_equal]
    ratios = [((f.max_abs or 0.0) / f.bound, f) for f in moved if f.bound and f.unit == "abs"]
    if ratios:
        ratio, f = max(ratios, key=lambda rf: rf[0])
        text += f", the worst ({f.key}) at {sig(ratio)} of its bound ({sig(f.max_abs)} abs)"
    return text


def _beyond(first: FirstVerdict, baseline: Baseline, held: Comparison) -> str:
    """The `reference` line, after naming the baseline, where the goldens' recorded noise
    does not cover this environment (some key of the baseline lies beyond its calibrated
    bound, else its pinned class), or where the baseline is another backend's: the baseline
    judges every key; what moved, how far the goldens lie from it and what would cover
    this environment are information, never a refusal."""
    difference, group = first.difference, first.group
    across = difference.across_backends
    beyond = [f for f in held.findings if not f.passed]
    moved = ", ".join(difference.changes)
    if across:
        text = f"on this backend ({moved}); it judges every key under its class. How far it "
        text += "lies from the goldens, for information (another backend's bits, not a refusal)"
    else:
        text = f"in this environment ({moved}), beyond the goldens' recorded noise; it judges "
        text += "every key under its class. How far the goldens lie from it, for information "
        text += "(not a refusal)"
    calibrated = not across and calibration_columns(first.classes.spreads, difference) is not None
    bound = "calibrated bound" if calibrated else "pinned class"
    if not beyond:  # another backend's bits, every key within its pinned class
        return f"{text}: {_worst(held.findings)}; 0 keys beyond their {bound}"
    remedy = environment_remedy(group, baseline.sha, difference, first.current)
    return (
        f"{text}: {_differ(held.findings)}; {count(len(beyond), 'key')} beyond their {bound}, "
        f"the farthest {_farthest(beyond)}; {remedy}"
    )


def _farthest(beyond: Sequence[Finding]) -> str:
    """The finding of `beyond` that lies farthest beyond its bound (a multiple of it, in
    its own unit; a bound of 0, bitwise, infinitely; the first in forward order of equals),
    named with its class and figure."""

    def excess(f: Finding) -> float:
        figure = {"abs": f.max_abs, "ulp": f.max_ulp}.get(f.unit or "", f.figure)
        if figure is None or not f.bound:
            return math.inf
        return figure / f.bound

    f = max(beyond, key=excess)
    if f.max_abs is None:
        return f"{f.key} ({f.class_name}: {f.verdict})"
    ratio = excess(f)
    times = f", {sig(ratio)}x its bound" if math.isfinite(ratio) else ""
    return f"{f.key} ({f.class_name}: max abs {sig(f.max_abs)}{times})"
