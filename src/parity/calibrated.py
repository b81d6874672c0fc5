"""The `calibrated` class in a check (docs/design.md, "Tolerance from measured noise").

A key under `calibrated` is judged against its own recorded spread: `bind_calibrated` gives
each such key the spread its golden file records (`parity.noise.Spreads`) as the class
parameter `spread` (`with_spread`), and `unbound` takes it off again for reports, which
group findings by class name. Where the check's environment differs from the pin's in a
calibrated dimension (device count, processes, ISA cap, processor), `judge_environment`
judges each key that fails its pinned class again under its calibrated bound there: the
looser of the two decides. `parity.check.check_group` applies both; `parity diff` and
`parity calibrate` bind and unbind the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.judge.classes import REGISTRY, ToleranceClass
from parity.judge.compare import Comparison, Finding, compare_arrays
from parity.judge.tolerance import get_class, parse_class_name
from parity.noise import Spreads
from parity.results import CheckError

if TYPE_CHECKING:
    from parity.store import GoldenFile

__all__ = [
    "CALIBRATED",
    "bind_calibrated",
    "calibrate_command",
    "judge_environment",
    "unbound",
    "with_spread",
]

#: The class of the calibrated bounds: its `k` and floor, from the registry's `calibrated`.
CALIBRATED = "calibrated"


def calibrate_command(group: str) -> str:
    """The command that records the per-key spreads of `group`."""
    return f"parity calibrate --groups {group} --perturb isa,devices,processes,repeat --write"


def bind_calibrated(
    resolve: Callable[[str], str], spreads: Spreads, group: str, path: Path
) -> Callable[[str], str]:
    """`resolve`, with each key under the `calibrated` class given its recorded spread
    (its envelope over every perturbation, `parity.noise.Spreads.envelope`) as the class
    parameter `spread`; `CheckError` naming the calibrate command where none is recorded."""

    def bound(key: str) -> str:
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
        return with_spread(name, spread)

    return bound


def with_spread(name: str, spread: float) -> str:
    """The class name `name` (`calibrated`, `calibrated[k=8]`) with the parameter
    `spread` set: the name a key's bound spread is judged under."""
    base, params = parse_class_name(name)
    inner = ",".join([*(f"{p}={v}" for p, v in params.items()), f"spread={spread:.6g}"])
    return f"{base}[{inner}]"


def unbound(f: Finding) -> Finding:
    """The finding under its class's name without the per-key `spread` the check bound
    (reports group findings by class name: one row for `calibrated`, not one per key);
    what the key was allowed stays in `allowed` and `bound`."""
    base, params = parse_class_name(f.class_name)
    if base != CALIBRATED or "spread" not in params:
        return f
    kept = {p: v for p, v in params.items() if p != "spread"}
    defaults = REGISTRY[CALIBRATED].rule.params()
    shown = {p: v for p, v in kept.items() if defaults.get(p) != v}
    name = f"{base}[{','.join(f'{p}={v:g}' for p, v in shown.items())}]" if shown else base
    return dataclasses.replace(f, class_name=name)


def judge_environment(
    comparison: Comparison,
    flat_a: Mapping[str, Any],
    gf: GoldenFile,
    spreads: Spreads,
    dims: Sequence[Any],
    registry: Mapping[str, ToleranceClass],
) -> tuple[Comparison, dict[str, str]]:
    """Where the check's environment differs from the pin's in calibrated dimensions, judge
    each key that fails its pinned class again under its calibrated bound for those
    dimensions (`max(floor, k * spread)`, the spread measured there): the looser of the
    two decides. In the pin's environment nothing changes.

    **Returns:** the comparison, with the findings that passed by calibration replaced
    (their note says so), and the header lines saying what differed and how many keys were
    judged by calibration."""
    if not dims:
        return comparison, {}
    change = ", ".join(d.change for d in dims)
    columns = spreads.columns_for(dims) if spreads else None
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
        tol = get_class(with_spread(CALIBRATED, spread), registry)
        again = compare_arrays(f.key, flat_a[f.key], gf.source(f.key), tol, order=f.order)
        if again.passed:
            judged += 1
            note = f"judged by calibration ({', '.join(columns)}): {f.class_name} alone fails"
            findings.append(dataclasses.replace(again, note=note))
        else:
            findings.append(f)
    line = (
        f"differs from the pin's ({change}); each key is judged by the looser of its pinned "
        f"class and its calibrated bound there ({base.describe_allowed()}, spread over "
        f"{', '.join(columns)}): {judged} key(s) passed by calibration alone"
    )
    return Comparison(tuple(findings)), {"environment": line}
