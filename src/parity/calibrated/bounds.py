"""The `calibrated` class in a check (docs/design.md, "Tolerance from measured noise").

A key under `calibrated` is judged against its own recorded spread: `bind_calibrated` gives
each such key the class resolved with the spread its golden file records
(`parity.calibrated.spreads.Spreads`) bound as the rule's parameter `spread`, as data: the
exact float, never text in the class's name, which stays as the class map writes it
(`calibrated`, `calibrated[k=8]`). Where the check's environment differs from the pin's in
a calibrated dimension (device count, processes, ISA cap, processor:
`parity.environment.EnvironmentDifference.dimensions`), `judge_environment` judges each key
that fails its pinned class again under its calibrated bound there: the looser of the two
decides. `parity.check.check_file` applies both, for a check of a golden group and for
`parity diff` alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.calibrated.spreads import Spreads
from parity.judge.chunks import DEFAULT_BUDGET
from parity.judge.classes import REGISTRY, ToleranceClass
from parity.judge.compare import Comparison, Finding, compare_arrays
from parity.judge.tolerance import KeyClass, get_class, parse_class_name
from parity.results import CheckError

if TYPE_CHECKING:
    from parity.environment import EnvironmentDifference
    from parity.store import GoldenFile

__all__ = [
    "BY_CALIBRATION",
    "CALIBRATED",
    "bind_calibrated",
    "calibrate_command",
    "judge_environment",
]

#: The class of the calibrated bounds: its `k` and floor, from the registry's `calibrated`.
CALIBRATED = "calibrated"
#: How the note of a finding that passed by its calibrated bound alone starts.
BY_CALIBRATION = "judged by calibration"


def calibrate_command(group: str) -> str:
    """The command that records the per-key spreads of `group`."""
    return f"parity calibrate --groups {group} --perturb isa,devices,processes,repeat --write"


def bind_calibrated(
    resolve: Callable[[str], str],
    spreads: Spreads,
    group: str,
    path: Path,
    registry: Mapping[str, ToleranceClass] = REGISTRY,
) -> Callable[[str], KeyClass]:
    """`resolve`, with each key under the `calibrated` class (and no spread written in the
    class map) resolved to its `ToleranceClass` with its recorded spread (its envelope over
    every perturbation, `parity.calibrated.spreads.Spreads.envelope`) bound as the rule's `spread`;
    every other key keeps its class name. `CheckError` naming the calibrate command where
    no spread is recorded; `UnknownClassError` for a calibrated class `registry` cannot
    build."""

    def bound(key: str) -> KeyClass:
        name = resolve(key)
        base, params = parse_class_name(name)
        if base != CALIBRATED or "spread" in params:
            return name
        spread = spreads.envelope(key)
        if spread is None:
            raise CheckError(
                f"key {key!r} of group {group!r} is under the class {name!r}, but {path} "
                f"records no calibration of it; measure and record it with "
                f"`{calibrate_command(group)}`"
            )
        return get_class(name, registry, params={"spread": spread})

    return bound


def judge_environment(
    comparison: Comparison,
    flat_a: Mapping[str, Any],
    gf: GoldenFile,
    spreads: Spreads,
    difference: EnvironmentDifference,
    registry: Mapping[str, ToleranceClass],
    *,
    budget: int = DEFAULT_BUDGET,
) -> tuple[Comparison, dict[str, str]]:
    """Where the check's environment differs from the pin's in calibrated dimensions, judge
    each key that fails its pinned class again under its calibrated bound for those
    dimensions (`max(floor, k * spread)`, the spread measured there): the looser of the
    two decides. In the pin's environment nothing changes, and where no calibration of it
    is recorded and every key holds its pinned class, nothing is said (nothing needs one).
    `budget`: bytes one array comparison may hold at once (`parity.judge.chunks`).

    **Returns:** the comparison, with the findings that passed by calibration replaced
    (their note says so), and the header lines saying what differed and how many keys were
    judged by calibration."""
    dims = difference.dimensions
    if not dims:
        return comparison, {}
    change = ", ".join(d.change for d in dims)
    columns = spreads.columns_for(dims) if spreads else None
    if columns is None and comparison.passed:
        return comparison, {}  # every key holds its pinned class: nothing to calibrate
    if columns is None:
        return comparison, {
            "environment": f"differs from the pin's ({change}); no calibration of it is "
            f"recorded, so the pinned classes stand (record one: "
            f"`{calibrate_command(gf.path.stem)}`)"
        }
    base = registry.get(CALIBRATED) or REGISTRY[CALIBRATED]
    judged = 0
    findings: list[Finding] = []
    for f in comparison.findings:
        spread = spreads.for_columns(f.key, columns)
        if f.verdict != "fail" or spread is None or f.key not in flat_a:
            findings.append(f)
            continue
        tol = get_class(CALIBRATED, registry, params={"spread": spread})
        again = compare_arrays(
            f.key, flat_a[f.key], gf.source(f.key), tol, order=f.order, budget=budget
        )
        if again.passed:
            judged += 1
            note = f"{BY_CALIBRATION} ({', '.join(columns)}): {f.class_name} alone fails"
            findings.append(dataclasses.replace(again, note=note))
        else:
            findings.append(f)
    line = (
        f"differs from the pin's ({change}); each key is judged by the looser of its pinned "
        f"class and its calibrated bound there ({base.describe_allowed()}, spread over "
        f"{', '.join(columns)}): {judged} key(s) passed by calibration alone"
    )
    return Comparison(tuple(findings)), {"environment": line}
