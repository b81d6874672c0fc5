"""Figures that several layers need alike: the largest finite magnitude of an expected
array (its scale), non-finite floats in JSON, which has neither NaN nor infinity, `sig`, the
one way a message prints a measured float, and `count`, the one way it counts things
("1 array", "3 arrays")."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["NONFINITE", "count", "from_json_float", "json_float", "largest_finite_abs", "sig"]

#: How a non-finite float is written in JSON: strings keep it readable and unambiguous
#: (null means absent).
NONFINITE = ("nan", "inf", "-inf")


def largest_finite_abs(x64: np.ndarray) -> float:
    """The largest finite `|x|` of a float64 array, as a Python float; 0.0 if no element is
    finite (or there is none)."""
    mag = np.abs(x64)
    finite = mag[np.isfinite(mag)]
    return float(finite.max()) if finite.size else 0.0


def json_float(x: float) -> float | str:
    """`x`, or its name in `NONFINITE` where it is NaN or infinite."""
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def from_json_float(x: Any) -> Any:
    """Invert `json_float`: a name in `NONFINITE` as its float, anything else as it is."""
    if isinstance(x, str) and x in NONFINITE:
        return float(x)
    return x


def sig(x: float | int | None) -> str:
    """A measured figure as every message prints it: three significant digits (`3.87e-07`,
    `0.0238`, `inf`), never the raw repr (`3.8743019104003906e-07`); an int as written;
    None (no figure) as `-`."""
    if x is None:
        return "-"
    if isinstance(x, int):
        return str(x)
    return f"{x:.3g}"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """`n` and `noun` as a message writes them, the noun plural unless `n` is 1:
    `count(1, "array")` is `"1 array"`, `count(0, "key")` `"0 keys"`; `plural` where an
    added "s" is not the plural (`count(2, "process", "processes")`)."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"
