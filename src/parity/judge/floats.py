"""Float figures that several layers need alike: the largest finite magnitude of a golden
(its scale), non-finite floats in JSON, which has neither NaN nor infinity, and `sig`, the
one way a message prints a measured float."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["NONFINITE", "from_json_float", "json_float", "largest_finite_abs", "sig"]

#: How a non-finite float is written in JSON: strings keep it readable and unambiguous
#: (null means absent).
NONFINITE = ("nan", "inf", "-inf")


def largest_finite_abs(x64: np.ndarray) -> float:
    """The largest finite `|x|` of a float64 array, as a Python float; 0.0 if no element is
    finite (or there is none)."""
    g = np.abs(x64)
    finite = g[np.isfinite(g)]
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
