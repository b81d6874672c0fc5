"""What a proof up to rounding says of one key (`RoundingProof`), and the two facts of the
key's way it rests on besides the replay's shades (`parity.origin._shadow`): whether a new
value on it computes in another dtype than its counterpart (`recast`: a cast added, dropped
or changed is a change, never a rounding: a bfloat16 step where the base computed in
float32 may lie within some bound and still be an edit), and the precision it was proved in
(`coarsest`).

This module imports numpy and the origin's own modules.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from parity.judge._ulp import is_float_dtype
from parity.origin._recording import Recording
from parity.origin._rounding import unit_roundoff

__all__ = ["ROUNDS", "RoundingProof", "coarsest", "equal", "place", "recast"]

#: The shades (`parity.origin._shadow.Shade.status`) of values whose numbers the replay
#: took up to a rounding: within one operation's rounding of the base's, or new ones
#: carried with their model.
ROUNDS = ("rounded", "fresh")


@dataclass(frozen=True)
class RoundingProof:
    """Whether one key was proved up to rounding.

    **Fields:** `key`; `proved`; `reason` (why not, one line; "" when proved); `exact` (the
    values on its way that are the base's bit for bit, run op by op or on the base's
    values); `rounded` (those within one operation's rounding of the base's); `fresh` (new
    intermediates on its way, each accounted for by what is computed from them);
    `largest` (the rounded operation that used the largest share of its bound, in words;
    "" where none); `origin` (the value where the key's way first computes what the base
    never did; -1 when proved); `precision` (for a key proved with some value on its way
    rounded, the float type of the coarsest rounding among them: a change smaller than one
    rounding in that type at those operations is not told apart; "" where none).
    """

    key: str
    proved: bool
    reason: str = ""
    exact: int = 0
    rounded: int = 0
    fresh: int = 0
    largest: str = ""
    origin: int = -1
    precision: str = ""

    def describe(self) -> str:
        """One clause: how the key was proved, or why not."""
        if not self.proved:
            return f"not proved up to rounding: {self.reason}"
        how = f"proved up to rounding: {self.exact} values equal op by op"
        if self.rounded:
            how += f", {self.rounded} within the rounding of their operation"
        if self.precision:
            u = int(-math.log2(unit_roundoff(self.precision)))
            how += (
                f" in {self.precision} (u = 2^-{u}: a change smaller than one {self.precision} "
                "rounding there is not told apart)"
            )
        if self.fresh:
            how += f", {self.fresh} new intermediates"
        return how + (f"; the closest: {self.largest}" if self.largest else "")


def recast(
    new: Recording, old: Recording, fresh: Sequence[int], pairs: Mapping[int, int]
) -> tuple[int, str] | None:
    """The first of `fresh` (new values on a key's way that are none of the base's) whose
    counterpart (`pairs`, `parity.origin._change.counterparts` of the two recordings)
    computed in another dtype, and what changed, in words; None where there is none."""
    for i in fresh:
        c = pairs.get(i)
        if c is not None and new.values[i].dtype != old.values[c].dtype:
            v, was = new.values[i], old.values[c]
            return (
                i,
                f"computes in {v.dtype} where the base's {was.primitive} computed in {was.dtype}",
            )
    return None


def coarsest(new: Recording, ids: Sequence[int]) -> str:
    """The float type with the largest unit roundoff among values `ids` of `new` ("" where
    none is a float)."""
    floats = {new.values[i].dtype for i in ids if _is_float(new.values[i].dtype)}
    return max(floats, key=unit_roundoff, default="")


def _is_float(name: str) -> bool:
    try:
        return is_float_dtype(np.dtype(name))
    except TypeError:  # an ml_dtypes name numpy knows only once registered
        return name.startswith(("bfloat", "float"))


def equal(a: np.ndarray, b: np.ndarray) -> bool:
    """The same shape, dtype and bytes."""
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    )


def place(new: Recording, i: int, root: str | Path | None) -> str:
    """Value `i`'s operation and its place, its file relative to `root` where inside it."""
    v = new.values[i]
    file = v.file
    if file and root is not None:
        with contextlib.suppress(ValueError):
            file = Path(file).resolve().relative_to(Path(root).resolve()).as_posix()
    where = f"{file}:{v.line} in {v.function}" if file else "<no source>"
    return f"{v.primitive} at {where}"
