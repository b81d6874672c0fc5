"""A golden check after its first verdict, and how exact its verdict is (docs/design.md,
"A verdict says how exact it was"): the first verdict as data (`FirstVerdict`: it records
whether a base is wanted), the bases the first verdicts want, prepared at once
(`prepare_bases`), the second judgement and the result (`conclude`), the header's `judge`
line, and the phrase the verdict line carries where a key passed by a calibrated bound
although the check could have judged it bit for bit
(`parity.judge.findings.Comparison.inexact`).

A check judges exactly where the goldens judge in their own environment, where every key
holds its pinned class, or where the base re-produced here judges (`parity.base_judge`).
It is *not exact* where:

- off the pin's environment a key failed its pinned class and passed by its calibrated
  bound alone, because the second judge is off or the base cannot be re-produced here
  (the verdict line names the keys, the reason and what to do); with the second judge
  required (`--baseline require`, `[tool.parity] baseline = "require"`,
  `--parity-baseline require`) that case is a `CheckError` instead;
- a key under the `calibrated` class passed without being bitwise equal to what it was
  judged against: its bound, not its bits, let it through.

`parity.check` makes the first verdicts and calls these; nothing here runs producers or
imports jax. The second judge itself (`parity.base_judge`) is imported where it prepares
or judges (`prepare_bases`, `second_judge`), so that a check with no base to judge by
(every `parity diff`) or no key failing its class does not load it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from parity.calibrated.bounds import BY_CALIBRATION, CALIBRATED, KeyClasses, calibrated_comparison
from parity.environment import EnvironmentDifference, PolicyMode
from parity.judge.classes import ToleranceClass
from parity.judge.compare import Comparison, Finding, Order
from parity.judge.dataflow import order_hint
from parity.judge.tolerance import (
    ClassMapLike,
    KeyClass,
    Overrides,
    UnknownClassError,
    parse_class_name,
)
from parity.results import BaseUnavailable, CheckError, CheckResult, diff_command
from parity.store import GoldenFile, GoldenStoreError

if TYPE_CHECKING:
    from parity.base_judge import BaseRequest, BaseSource, ReproducedBase

__all__ = [
    "SECOND_JUDGE_OFF",
    "FirstVerdict",
    "VerdictOptions",
    "conclude",
    "inexact",
    "judge_line",
    "prepare_bases",
    "required_error",
    "second_judge",
]

#: Why a key passed by calibration where the second judge was turned off.
SECOND_JUDGE_OFF = BaseUnavailable(
    "the second judge is off",
    "check with it on (baseline auto; require makes this case an error) to judge them bit "
    "for bit against the base re-produced here",
)


@dataclass(frozen=True)
class VerdictOptions:
    """What a check's result needs of its options, carried from its first verdict
    (`parity.check.first_verdict`)."""

    name: str
    node: str | None
    produce_s: float | None
    save_actual: str | os.PathLike[str] | None
    overrides: Overrides
    class_map: ClassMapLike
    drift_mode: PolicyMode
    require_base: bool
    budget: int


@dataclass(frozen=True)
class FirstVerdict:
    """A golden check's first verdict: the tree judged by its goldens, once, before the
    second judge (`parity.check.first_verdict`); `conclude` turns it into the `CheckResult`.

    **Fields:** `gf` (the golden file), `current` (the provenance `actual` was produced
    in), `difference` (how it differs from the pin's, decided once), `classes` (the classes
    of the golden's keys), `keys` (the golden keys checked), `flat_a` (`actual`, flattened
    once: every later judgement reads it), `forward` (the forward order), `comparison`
    (against the goldens, under the drift policy's classes), `registries` (the exact
    classes and the drift policy's), `report` (the options the result needs), `started`,
    `load_s`, `compare_s` (timing).
    """

    gf: GoldenFile
    current: Mapping[str, Any]
    difference: EnvironmentDifference
    classes: KeyClasses
    keys: tuple[str, ...]
    flat_a: dict[str, Any]
    forward: Order
    comparison: Comparison
    registries: tuple[Mapping[str, ToleranceClass], Mapping[str, ToleranceClass]]
    report: VerdictOptions
    started: float
    load_s: float
    compare_s: float

    @property
    def group(self) -> str:
        """The golden group (the file's name)."""
        return self.gf.path.stem

    @property
    def wants_base(self) -> bool:
        """Whether the second judge should judge: the environment differs from the pin's in
        a way that can move bits, and some key fails its pinned class."""
        return self.difference.moves_bits and not self.comparison.passed

    def base_request(self) -> BaseRequest:
        """What re-produces this group's base: `(group, pinned provenance, current)`."""
        return self.group, self.gf.provenance, self.current


def judge_line(difference: EnvironmentDifference, passed: bool) -> str:
    """The header's `judge` line where the second judge does not run (or before it does)."""
    if difference.unknown:
        return f"the goldens (the environments are not compared: {difference.unknown})"
    if not difference.moves_bits:
        return "the goldens (this is the environment they were pinned in)"
    if passed:
        return "the goldens: every key holds its pinned class here"
    return "the goldens, by calibration (the second judge is off)"


def prepare_bases(
    base: BaseSource | None, wanted: Sequence[BaseRequest]
) -> dict[str, ReproducedBase | BaseUnavailable]:
    """The bases the first verdicts want, each group's base or why there is none: prepared
    at once where `base` builds several groups in one run (`parity.base_judge.BatchBaseSource`:
    one producer run per base commit and environment), else group by group; every group
    `SECOND_JUDGE_OFF` where `base` is None (the second judge is off).

    **Arguments:**

    - `base`: the second judge, or None.
    - `wanted`: `(group, pinned provenance, current provenance)` of each first verdict
      that wants a base (`FirstVerdict.base_request`).

    **Returns:** group -> its `ReproducedBase`, or the `BaseUnavailable` saying why not.
    """
    if base is None:
        return {group: SECOND_JUDGE_OFF for group, _, _ in wanted}
    if not wanted:
        return {}
    from parity.base_judge import BatchBaseSource

    if isinstance(base, BatchBaseSource):
        return dict(base.prepare(wanted))
    out: dict[str, ReproducedBase | BaseUnavailable] = {}
    for group, pinned, current in wanted:
        try:
            out[group] = base.reproduce(group, pinned, current)
        except BaseUnavailable as e:
            out[group] = e
    return out


def second_judge(
    base: ReproducedBase | BaseUnavailable,
    gf: GoldenFile,
    difference: EnvironmentDifference,
    flat_a: Mapping[str, Any],
    first: Comparison,
    classes: Callable[[str], KeyClass],
    registries: tuple[Mapping[str, ToleranceClass], Mapping[str, ToleranceClass]],
    order: Order | None,
    keys: Sequence[str],
    *,
    required: bool,
) -> tuple[Comparison | None, str, str, BaseUnavailable | None]:
    """The comparison against the base re-produced here, the header line naming that
    judge, the base's file and None; `(None, line, "", why)` where there is no base (the
    line says why, and the calibrated judgement of the goldens stands), a `CheckError`
    there instead when `required`. `first`: the first verdict's comparison, whose findings
    the judgement by the base reuses where it can (`parity.base_judge.judge_by_base`).
    `registries`: the exact classes the tree is judged by, and the drift policy's the base
    is held to the goldens by."""
    group = gf.path.stem
    if isinstance(base, BaseUnavailable):
        if required:
            raise required_error(group, base)
        if base is SECOND_JUDGE_OFF:
            return None, judge_line(difference, passed=False), "", base
        line = (
            f"the goldens, by calibration: the base cannot be re-produced here ({base.reason}); "
            f"{base.hint}"
        )
        return None, line, "", base
    from parity.base_judge import judge_by_base

    exact, held = registries
    comparison, line = judge_by_base(
        flat_a, gf, base, classes, registry=exact, held_registry=held,
        difference=difference, order=order, keys=keys, group=group, first=first,
    )  # fmt: skip
    return comparison, line, str(base.path), None


def conclude(first: FirstVerdict, base: ReproducedBase | BaseUnavailable | None) -> CheckResult:
    """The `CheckResult` of a first verdict: judged again by the base re-produced here
    (`base`, where the first verdict wanted one), or by calibration where the environment
    differs; then the header, and the obtained arrays saved where it fails.

    **Arguments:**

    - `first`: the first verdict (`parity.check.first_verdict`).
    - `base`: None where no base was wanted (`FirstVerdict.wants_base`); else the base
      prepared for it (`prepare_bases`), or why there is none.

    **Returns:** the `CheckResult`. Raises `CheckError` where the base is required but
    cannot judge, and where the base is outside the goldens' recorded noise.
    """
    gf, group, difference, opts = first.gf, first.group, first.difference, first.report
    try:
        judged_by_base, base_path, env_header, why = None, "", {}, None
        judge = judge_line(difference, first.comparison.passed)
        if base is not None:
            judged_by_base, judge, base_path, why = second_judge(
                base, gf, difference, first.flat_a, first.comparison, first.classes.bound,
                first.registries, first.forward, first.keys, required=opts.require_base,
            )  # fmt: skip
        if judged_by_base is not None:
            comparison = judged_by_base
            # The drift cannot explain a failure here: the base shares this environment, so
            # the header keeps only what cannot move bits.
            difference = dataclasses.replace(difference, bits=(), dimensions=())
        else:
            comparison, env_header = calibrated_comparison(
                first.comparison, first.flat_a, gf, first.classes.spreads, difference,
                first.registries[1], budget=opts.budget,
            )  # fmt: skip
        against = "the goldens" if judged_by_base is None else "the base re-produced here"
        comparison = dataclasses.replace(comparison, inexact=inexact(comparison, why, against))
    except GoldenStoreError as e:
        raise CheckError(f"golden group {group!r} is unusable: {e}") from None
    placed = gf.ordered_keys()
    header = {"golden": str(gf.path)}
    if gf.provenance.get("base_sha"):
        header["base_sha"] = str(gf.provenance["base_sha"])
    drift = difference.policy(opts.drift_mode).header
    header |= {f"drift {i}": line for i, line in enumerate(drift)}
    if hint := order_hint(gf.provenance.get("order"), placed):
        header["order"] = hint
    calibration = gf.provenance.get("calibration")
    if isinstance(calibration, dict) and calibration.get("summary"):
        header["calibration"] = str(cast(dict[str, Any], calibration)["summary"])
    header |= {"judge": judge, **env_header}
    saved = command = None
    if opts.save_actual is not None and not comparison.passed:
        from parity.store.writer import save_arrays

        path = save_arrays(opts.save_actual, opts.name, first.flat_a,
                           classes=first.classes.names, order=placed,
                           provenance=first.current)  # fmt: skip
        reference = gf.path if judged_by_base is None else Path(base_path)
        saved, command = str(path), diff_command(path, reference, opts.overrides, opts.class_map)
    return CheckResult(
        name=opts.name,
        comparison=comparison,
        group=group,
        node=opts.node,
        header=header,
        checked_keys=tuple(sorted(first.keys)),
        started=first.started,
        produce_s=opts.produce_s,
        load_s=first.load_s,
        compare_s=first.compare_s,
        saved=saved,
        command=command,
    )


def required_error(group: str, why: BaseUnavailable) -> CheckError:
    """The error of a check that requires the second judge where it cannot judge."""
    return CheckError(
        f"group {group!r}: the second judge is required (baseline require) but the base "
        f"cannot be re-produced here ({why.reason}), so a bitwise key would pass by its "
        f"calibrated bound alone; {why.hint}; or accept that judgement (baseline auto)"
    )


def _calibrated_class(f: Finding) -> bool:
    try:
        return parse_class_name(f.class_name)[0] == CALIBRATED
    except UnknownClassError:
        return False


def _keys(findings: Sequence[Finding]) -> str:
    names = ", ".join(f.key for f in findings[:3])
    return names + (f" and {len(findings) - 3} more" if len(findings) > 3 else "")


def inexact(comparison: Comparison, why: BaseUnavailable | None, against: str) -> str:
    """What the verdict line says about how exact `comparison` is (module docstring), or
    "" where it is exact.

    **Arguments:**

    - `comparison`: the check's final comparison.
    - `why`: why the base did not judge where some key passed by calibration alone (the
      second judge off or the base unavailable); None where the base judged or was not
      needed.
    - `against`: what the tree was judged against, in words ("the goldens", "the base").
    """
    parts: list[str] = []
    by_calibration = [
        f for f in comparison.findings if f.passed and f.note.startswith(BY_CALIBRATION)
    ]
    if by_calibration and why is not None:
        parts.append(
            f"{len(by_calibration)} key(s) ({_keys(by_calibration)}) failed their pinned class "
            f"and passed by calibration alone, not bit for bit: {why.reason}; {why.hint}"
        )
    loose = [
        f for f in comparison.findings
        if f.passed and not f.bitwise_equal and _calibrated_class(f) and f not in by_calibration
    ]  # fmt: skip
    if loose:
        parts.append(
            f"{len(loose)} key(s) ({_keys(loose)}) passed their calibrated bound, not bit for "
            f"bit against {against}; a key that reproduces here is judged bit for bit under "
            "`bitwise` (docs/adopting.md, section 9)"
        )
    return "; ".join(parts)
