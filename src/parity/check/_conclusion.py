"""A golden check's third stage, its conclusion, and how exact its verdict is
(docs/design.md, "A verdict says how exact it was"): from the first verdict
(`parity.check._first.FirstVerdict`) and what the baseline found
(`parity.check._against_baseline`), the `CheckResult` with its header (`conclude`), and the
phrase the verdict line carries where a key passed by a calibrated bound although the
check could have compared it bit for bit (`inexact`, kept in
`parity.judge._findings.Comparison.inexact`).

A check is exact where its reference is the goldens in their own environment, where every
key holds its pinned class, or where its reference is the baseline
(`parity.check._against_baseline`). It is *not exact* where:

- off the pin's environment a key failed its pinned class and passed by its calibrated
  bound alone, because the baseline is off or cannot be re-produced here (the verdict line
  names the keys, the reason and what to do); with the baseline required (`--baseline
  require`, `[tool.parity] baseline = "require"`, `--parity-baseline require`) that case
  is a `CheckError` instead;
- a key under the `calibrated` class passed without being bitwise equal to its
  reference: its bound, not its bits, let it through.
- on another backend than the pin's (a TPU against goldens pinned on a CPU, or the
  reverse: `EnvironmentDifference.across_backends`) the baseline is the reference of every
  key, whatever the goldens say, and how far it lies from the goldens is information in the
  header, never a refusal; where it cannot be re-produced (or is off) the tree is judged
  against the goldens under their pinned classes, and the verdict line says that this is
  not exact and why (docs/design.md, "On any backend").

Every header names both sides (`pinned on`, `checked on`: `parity._environment.describe_backend`).

Nothing here runs producers or imports jax.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from parity._environment import backend_note, describe_backend
from parity._results import (
    BaselineUnavailable,
    CheckHeader,
    CheckResult,
    diff_command,
)
from parity.calibrated._bounds import CALIBRATED
from parity.check._against_baseline import BaseJudgement
from parity.check._first import FirstVerdict
from parity.judge._compare import Comparison, Finding
from parity.judge._dataflow import DATAFLOW, HOST, order_hint
from parity.judge._floats import count
from parity.judge._tolerance import UnknownClassError, parse_class_name
from parity.store import GoldenFile, Provenance

__all__ = ["conclude", "inexact"]


def conclude(first: FirstVerdict, judged: BaseJudgement) -> CheckResult:
    """The third stage: the `CheckResult` of a first verdict and its judgement against its
    reference, with its header, how exact it is (`inexact`), and the actual arrays saved
    where it fails.

    **Arguments:**

    - `first`: the first verdict (`parity.check._first.first_verdict`).
    - `judged`: its judgement against the baseline, or the goldens where there is none
      (`parity.check._against_baseline.against_baseline`).

    **Returns:** the `CheckResult`.
    """
    gf, group, difference, opts = first.gf, first.group, first.difference, first.request
    comparison, why = judged.comparison, judged.why
    if judged.by_baseline:
        # The drift cannot explain a failure here: the baseline shares this environment,
        # so the header keeps only what cannot move bits.
        difference = dataclasses.replace(difference, bits=(), dimensions=())
    loose = inexact(comparison, why, "the baseline" if judged.by_baseline else "the goldens")
    if not judged.by_baseline and why is not None and difference.across_backends:
        loose = "; ".join(filter(None, [_across_backends(gf, first.current, why), loose]))
    comparison = dataclasses.replace(comparison, inexact=loose)
    placed = gf.ordered_keys()
    made = first.order_source
    order = order_hint(made if made in (DATAFLOW, HOST) else gf.provenance.order, placed)
    calibration = gf.provenance.calibration
    summary = calibration.get("summary") if calibration is not None else None
    header = CheckHeader(
        golden=str(gf.path),
        pinned_on=describe_backend(gf.provenance),
        checked_on=describe_backend(first.current),
        sees=backend_note(first.current) or "",
        base_sha=gf.provenance.base_sha or "",
        drift=tuple(difference.policy(opts.drift_mode).header),
        order=order or "",
        calibration=str(summary or ""),
        reference=judged.reference,
        environment=judged.environment,
    )
    saved = command = None
    if opts.save_actual is not None and not comparison.passed:
        from parity.store._writer import save_arrays

        path = save_arrays(
            opts.save_actual,
            first.name,
            first.flat_a,
            classes=first.classes.names,
            order=placed,
            provenance=first.current,
        )
        compared = Path(judged.path) if judged.by_baseline else gf.path
        saved, command = str(path), diff_command(path, compared, opts.overrides, opts.class_map)
    return CheckResult(
        name=first.name,
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


def _across_backends(gf: GoldenFile, current: Provenance, why: BaselineUnavailable) -> str:
    """The verdict line's phrase for a check on another backend that has no baseline."""
    return (
        f"judged against goldens pinned on {describe_backend(gf.provenance)} from "
        f"{describe_backend(current)} under their pinned classes, not by the baseline: "
        f"{why.reason}; {why.hint}"
    )


def _calibrated_class(f: Finding) -> bool:
    try:
        return parse_class_name(f.class_name)[0] == CALIBRATED
    except UnknownClassError:
        return False


def _keys(findings: Sequence[Finding]) -> str:
    names = ", ".join(f.key for f in findings[:3])
    return names + (f" and {len(findings) - 3} more" if len(findings) > 3 else "")


def inexact(comparison: Comparison, why: BaselineUnavailable | None, against: str) -> str:
    """What the verdict line says about how exact `comparison` is (module docstring), or
    "" where it is exact.

    **Arguments:**

    - `comparison`: the check's final comparison.
    - `why`: why the baseline was not the reference where some key passed by calibration
      alone (the baseline off or unavailable); None where the baseline was the reference
      or was not needed.
    - `against`: the tree's reference, in words ("the goldens", "the baseline").
    """
    parts: list[str] = []
    by_calibration = list(comparison.by_calibration)
    if by_calibration and why is not None:
        parts.append(
            f"{count(len(by_calibration), 'key')} ({_keys(by_calibration)}) failed their "
            "pinned class and passed by calibration alone, not bit for bit: "
            f"{why.reason}; {why.hint}"
        )
    loose = [
        f
        for f in comparison.findings
        if f.passed and not f.bitwise_equal and _calibrated_class(f) and f not in by_calibration
    ]
    if loose:
        parts.append(
            f"{count(len(loose), 'key')} ({_keys(loose)}) passed their calibrated bound, not "
            f"bit for bit against {against}; a key that reproduces here is judged bit for bit "
            "under `bitwise` (docs/adopting.md, section 9)"
        )
    return "; ".join(parts)
