"""How exact a golden check's verdict is (docs/design.md, "A verdict says how exact it
was"): the header's `judge` line, the second judge's call, and the phrase the verdict line
carries where a key passed by a calibrated bound although the check could have judged it
bit for bit (`parity.judge.findings.Comparison.inexact`).

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

`parity.check.check_file` calls these; nothing here runs producers or imports jax. The
second judge itself (`parity.base_judge`) is imported where it judges (`second_judge`), so
that a check with no base to judge by (every `parity diff`) or no key failing its class
does not load it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from parity.calibrated.bounds import BY_CALIBRATION, CALIBRATED
from parity.environment import EnvironmentDifference
from parity.judge.classes import ToleranceClass
from parity.judge.compare import Comparison, Finding, Order
from parity.judge.tolerance import KeyClass, UnknownClassError, parse_class_name
from parity.results import BaseUnavailable, CheckError
from parity.store import GoldenFile

if TYPE_CHECKING:
    from parity.base_judge import BaseSource

__all__ = ["SECOND_JUDGE_OFF", "inexact", "judge_line", "required_error", "second_judge"]

#: Why a key passed by calibration where the second judge was turned off.
SECOND_JUDGE_OFF = BaseUnavailable(
    "the second judge is off",
    "check with it on (baseline auto; require makes this case an error) to judge them bit "
    "for bit against the base re-produced here",
)


def judge_line(difference: EnvironmentDifference, passed: bool) -> str:
    """The header's `judge` line where the second judge does not run (or before it does)."""
    if difference.unknown:
        return f"the goldens (the environments are not compared: {difference.unknown})"
    if not difference.moves_bits:
        return "the goldens (this is the environment they were pinned in)"
    if passed:
        return "the goldens: every key holds its pinned class here"
    return "the goldens, by calibration (the second judge is off)"


def second_judge(
    base: BaseSource,
    gf: GoldenFile,
    current: Mapping[str, Any],
    difference: EnvironmentDifference,
    flat_a: Mapping[str, Any],
    classes: Callable[[str], KeyClass],
    registries: tuple[Mapping[str, ToleranceClass], Mapping[str, ToleranceClass]],
    order: Order | None,
    keys: Sequence[str],
    *,
    required: bool,
) -> tuple[Comparison | None, str, str, BaseUnavailable | None]:
    """The comparison against the base re-produced here, the header line naming that
    judge, the base's file and None; `(None, line, "", why)` where the base cannot be
    re-produced (the line says why, and the calibrated judgement of the goldens stands),
    a `CheckError` there instead when `required`. `registries`: the exact classes the tree
    is judged by, and the drift policy's the base is held to the goldens by."""
    from parity.base_judge import judge_by_base

    group = gf.path.stem
    try:
        reproduced = base.reproduce(group, gf.provenance, current)
    except BaseUnavailable as e:
        if required:
            raise required_error(group, e) from None
        line = (
            f"the goldens, by calibration: the base cannot be re-produced here ({e.reason}); "
            f"{e.hint}"
        )
        return None, line, "", e
    exact, held = registries
    comparison, line = judge_by_base(
        flat_a, gf, reproduced, classes, registry=exact, held_registry=held,
        difference=difference, order=order, keys=keys, group=group,
    )  # fmt: skip
    return comparison, line, str(reproduced.path), None


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
