"""Every rule by its `kind` (`RULES`), and a rule built back from its kind and parameters
(`rule_from_dict`): adding a rule is one class, registered here under its `kind`, so that
`ToleranceClass.from_dict` (and the golden files' JSON) can name it. The rules are
siblings: `parity.judge._fixed_rules` (a fixed tolerance) and `parity.judge._measured_rules`
(a measured or propagated bound), over `parity.judge._rule_base`.

This module imports numpy and ml_dtypes only, through the rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from parity.judge._fixed_rules import Bitwise, Close, OpByOp, RelativeToMax, Ulp, UpToRounding
from parity.judge._measured_rules import Budget, Calibrated, LogitKL, Reduction
from parity.judge._rule_base import Rule

__all__ = ["RULES", "rule_from_dict"]


#: Every rule by its `kind`.
RULES: Mapping[str, type[Rule]] = {
    r.kind: r
    for r in (
        Bitwise,
        OpByOp,
        UpToRounding,
        Ulp,
        Close,
        RelativeToMax,
        Reduction,
        Calibrated,
        Budget,
        LogitKL,
    )
}


def rule_from_dict(kind: str, params: Mapping[str, Any]) -> Rule:
    """Build a rule from its kind and parameters (as `Rule.params` gives them).

    Raises `ValueError` naming the known kinds, or the parameters a kind takes.
    """
    try:
        cls = RULES[kind]
    except (KeyError, TypeError):
        raise ValueError(f"unknown rule {kind!r}; known rules: {sorted(RULES)}") from None
    fields = {f.name for f in dataclasses.fields(cls)}  # pyright: ignore[reportArgumentType]
    unknown = sorted(set(params) - fields)
    if unknown:
        got = ", ".join(f"{k}={params[k]!r}" for k in unknown)
        raise ValueError(f"rule {kind!r} takes {sorted(fields) or 'no parameters'}, got {got}")
    try:
        return cls(**dict(params))
    except TypeError as e:
        raise ValueError(f"rule {kind!r}: {e}") from None
