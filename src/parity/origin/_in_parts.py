"""A contraction with a large value of the base's, modelled a part at a time (issue 76).

A rounding model holds each operand in float64 twice (its arithmetic and its magnitudes,
`parity.origin._rounding.Fresh`): a model of a model's logits against an embedding table
of 32,000 x 1,024 float32 numbers made 524 MB of float64 for an operand the program holds
in 131 MB. A `dot_general` whose large operand is a value of the base's (grounded: exact,
no slack) is modelled here over parts of one of that operand's free axes: each part
grounded and contracted on its own, the results joined along the output axis the part
spans. Each element of the result is the same contraction of the same numbers, so the
model is the whole one's, its float64 copies one part's at a time.

This module imports numpy and the origin's own modules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from parity.origin._primitives import Machine, model
from parity.origin._rounding import Fresh, grounded, slack_of

__all__ = ["LARGE", "dot_in_parts"]

#: An operand of more elements than this is grounded a part of about this many at a time.
LARGE = 1 << 22


def dot_in_parts(
    params: Mapping[str, Any],
    operands: tuple[Fresh | np.ndarray, Fresh | np.ndarray],
    out_dtype: Any,
    machine: Machine,
) -> Fresh | None:
    """The model of `dot_general` (`params`) on `operands`, one of them the numbers of a
    large value of the base's (a numpy array, `LARGE`), the other its `Fresh`; None where
    that operand has no free axis to split, or no part has a model."""
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    side = 0 if isinstance(operands[0], np.ndarray) else 1
    numbers = operands[side]
    other = operands[1 - side]
    assert isinstance(numbers, np.ndarray) and isinstance(other, Fresh)
    contracted, batch = (lc, lb) if side == 0 else (rc, rb)
    free = [d for d in range(numbers.ndim) if d not in contracted and d not in batch]
    if not free:
        return None
    axis = max(free, key=lambda d: numbers.shape[d])
    # The output is (batch, lhs free, rhs free): where this operand's free axis lands.
    lhs_free = (numbers.ndim if side == 0 else other.centre.ndim) - len(lc) - len(lb)
    at = len(lb) + (0 if side == 0 else lhs_free) + free.index(axis)
    size = numbers.shape[axis]
    step = max(1, math.ceil(size * LARGE / max(numbers.size, 1)))
    parts: list[Fresh] = []
    for start in range(0, size, step):
        index = (slice(None),) * axis + (slice(start, min(start + step, size)),)
        piece = grounded(numbers[index])
        pair = [piece, other] if side == 0 else [other, piece]
        part = model("dot_general", params, pair, out_dtype, machine=machine)
        if part is None:
            return None
        parts.append(part)
    slack: np.ndarray = np.zeros(())
    if any(np.any(p.slack) for p in parts):
        slack = np.concatenate([slack_of(p) for p in parts], axis=at)
    return Fresh(
        np.concatenate([p.centre for p in parts], axis=at),
        np.concatenate([p.mag for p in parts], axis=at),
        max(p.depth for p in parts),
        slack,
        parts[0].dtype,
    )
