"""The baseline (docs/design.md, "Two references"): off the pin's environment, the golden
group re-produced at its base commit here, which the tree is compared with, exactly.

The committed goldens are the reference of a check run in the environment they were
pinned in. Elsewhere (another processor, ISA cap, device layout, jax or XLA flags) their
bits need not reproduce, and the calibrated bounds that absorb that noise would also absorb
a small real change. So where such a check has keys that fail their pinned class,
`compare_with_baseline`:

1. holds the baseline (a golden-format file a `BaselineSource` provides) to the committed
   goldens under the calibrated bound of the dimensions that differ (on another backend
   than the pin's no calibration bounds it: how far it lies is reported, never refused,
   docs/design.md "On any backend")
   (`parity.calibrated.bounds.calibrated_comparison`); a key beyond it means this
   environment is outside the recorded noise, a `CheckError` naming the calibrate command;
2. compares the tree with the baseline under the pinned classes, as the goldens would in
   their own environment: bitwise keys bit for bit.

A `BaselineSource` (`parity.run.baseline.BaselineBuilder` for the CLI and the pytest
plugin) re-produces a group at its base commit; where it cannot (the commit is missing, the
producers cannot run there), it raises `BaselineUnavailable` (defined with what a check
hands back, `parity.results`, and named here with the protocol that raises it) and the
check falls back to the calibrated comparison with the goldens, saying why in its header.
A check that has no baseline to compare with (every `parity diff`) or no key failing its
class never loads this module: `parity.exactness` imports it where a baseline is used.

Nothing here runs producers or imports jax.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from parity.calibrated.bounds import BY_CALIBRATION, calibrate_command, calibrated_comparison
from parity.calibrated.spreads import Spreads
from parity.judge.compare import Comparison, Finding, compare_trees
from parity.judge.floats import count, sig
from parity.judge.tolerance import to_class
from parity.results import BaselineUnavailable, CheckError
from parity.store import GoldenStoreError, open_goldens
from parity.verdict import BaselineRequest, FirstVerdict

if TYPE_CHECKING:
    from parity.environment import EnvironmentDifference

__all__ = [
    "BASELINE",
    "Baseline",
    "BaselineRequest",
    "BaselineSource",
    "BaselineUnavailable",
    "BatchBaselineSource",
    "compare_with_baseline",
]


#: What the baseline is called in a finding's words ("actual ... vs baseline ..."), where
#: the tree was compared with it.
BASELINE = "baseline"


@dataclass(frozen=True)
class Baseline:
    """A golden group re-produced at its base commit in this environment.

    **Fields:** `path` (a golden-format file), `sha` (the base commit), `cached` (found in
    the cache, as opposed to built by this call) and `seconds` (what building it took; 0
    when cached).
    """

    path: Path
    sha: str
    cached: bool
    seconds: float = 0.0


class BaselineSource(Protocol):
    """What re-produces a golden group at its base commit in a check's environment: its
    baseline."""

    def reproduce(
        self, group: str, pinned: Mapping[str, Any], current: Mapping[str, Any]
    ) -> Baseline:
        """The group re-produced at `pinned["base_sha"]` in the environment `current`
        describes (a provenance); raises `BaselineUnavailable` where it cannot be."""
        ...


@runtime_checkable
class BatchBaselineSource(BaselineSource, Protocol):
    """A `BaselineSource` that also re-produces several groups at once: the missing ones of
    each base commit and environment in one producer run
    (`parity.run.baseline.BaselineBuilder`). `parity.exactness.prepare_baselines` uses it
    where the source has it."""

    def prepare(
        self, wanted: Sequence[BaselineRequest]
    ) -> Mapping[str, Baseline | BaselineUnavailable]:
        """Each group of `wanted` re-produced, or the `BaselineUnavailable` saying why not."""
        ...


def _worst(findings: Sequence[Finding]) -> str:
    """How close the baseline came to the goldens, in one phrase."""
    moved = [f for f in findings if not f.bitwise_equal]
    if not moved:
        return "bit for bit equal to the goldens"
    ratios = [((f.max_abs or 0.0) / f.bound, f) for f in moved if f.bound and f.unit == "abs"]
    verb = "differs" if len(moved) == 1 else "differ"
    text = f"{len(moved)} of {count(len(findings), 'key')} {verb} from the goldens"
    if ratios:
        ratio, f = max(ratios, key=lambda rf: rf[0])
        text += f", the worst ({f.key}) at {sig(ratio)} of its bound ({sig(f.max_abs)} abs)"
    return text


def _against_baseline(
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


def _across_backends(
    baseline: Baseline, how: str, difference: EnvironmentDifference, held: Comparison
) -> str:
    """The `reference` line of a baseline on another backend than the pin's: it judges,
    and how far it lies from the goldens is information."""
    beyond = sum(not f.passed for f in held.findings)
    return (
        f"the baseline re-produced here at {baseline.sha[:12]} ({how} at {baseline.path}), "
        f"on this backend ({', '.join(difference.changes)}); it judges every key under its "
        "class. How far it lies from the goldens, for information (another backend's bits, "
        f"not a refusal): {_worst(held.findings)}; {count(beyond, 'key')} beyond their "
        "pinned class"
    )


def compare_with_baseline(first: FirstVerdict, baseline: Baseline) -> tuple[Comparison, str]:
    """Compare the tree of a first verdict with its baseline (see the module docstring).

    **Arguments:**

    - `first`: the check's first verdict (`parity.check.first_verdict`): the tree's arrays
      (`flat_a`), the golden file, each key's class (the check's precedence, each
      calibrated key's spread bound), the two registries (the tree is judged by the exact
      classes, with no drift relaxation, since the tree and the baseline share their
      environment; the baseline is held to the goldens by the drift policy's), how this
      environment differs from the pin's (decided once), the forward order, the keys the
      check covers; and its comparison with the goldens, whose findings are reused where
      they are what this comparison would find (`_against_baseline`).
    - `baseline`: the group re-produced at the golden's base commit in this environment.

    **Returns:** the comparison of the tree with the baseline, and the header's `reference`
    line naming it. Raises `CheckError` when the baseline is outside the goldens' recorded
    noise here, or its file is unusable.
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
                )
            beyond = [f for f in held.findings if not f.passed]
            if beyond and not difference.across_backends:
                f = beyond[0]
                where = ", ".join(difference.changes)
                raise CheckError(
                    f"this environment ({where}) is outside the recorded noise of group "
                    f"{group!r}: the baseline re-produced here at {baseline.sha[:12]} breaks the "
                    f"goldens' calibrated bound at {f.key} ({f.class_name}: max abs "
                    f"{sig(f.max_abs)}; {count(len(beyond), 'key')} "
                    f"beyond); record this environment's noise on main with "
                    f"`{calibrate_command(group)}`, or run where the goldens were pinned"
                )
            comparison = _against_baseline(first, baseline_arrays, held)
    except GoldenStoreError as e:
        raise CheckError(
            f"group {group!r}: the baseline re-produced at {baseline.sha[:12]} is unusable "
            f"({e}); clear it with `parity baseline clear` and check again"
        ) from None
    how = "built now" if not baseline.cached else "cached"
    took = f" in {baseline.seconds:.0f}s" if not baseline.cached else ""
    # Only a key the goldens' pinned class refused and a calibrated bound admitted makes
    # the baseline "within the calibrated noise"; otherwise it holds the pinned classes.
    calibrated = any(f.note.startswith(BY_CALIBRATION) for f in held.findings)
    within = "the goldens' calibrated noise" if calibrated else "the goldens' pinned classes"
    if difference.across_backends:
        return comparison, _across_backends(baseline, f"{how}{took}", difference, held)
    line = (
        f"the baseline re-produced here at {baseline.sha[:12]} ({how}{took} at "
        f"{baseline.path}), in this environment ({', '.join(difference.changes)}), itself "
        f"within {within}: {_worst(held.findings)}"
    )
    return comparison, line
