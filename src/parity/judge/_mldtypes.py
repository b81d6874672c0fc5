"""ml_dtypes (bfloat16, the float8 kinds, int4, ...) without importing it until an array needs it.

Importing `ml_dtypes` costs 0.16 s with 0.6.0 and 0.5 to 1.9 s with 0.7.0 (measured), more
than the rest of `parity diff` on a file of float32 arrays. So the harness recognises its
dtypes without importing it: a dtype whose scalar type comes from the `ml_dtypes` module
can only exist once that module has been imported (by jax, or by the caller), and then the
module is in `sys.modules` and using it costs nothing. The one place that must import it is
turning a stored dtype *name* into a dtype (`by_name`), which a file holding a bfloat16
array needs anyway.

**The codec.** Every file parity writes keeps an array's dtype by one rule (`to_raw`,
`from_raw`): numpy's own dtypes as they are, ml_dtypes' as unsigned ints of their width
(every bit kept, NaN payloads included) beside the dtype's name. The golden store, the
producer runner's hand-over and a recording (`parity.origin._recording`) all write with
it, so a bfloat16 value cannot come back as raw `|V2` bytes from one of them.

This module imports numpy only.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import numpy as np

__all__ = [
    "by_name",
    "dtype_named",
    "finfo",
    "from_raw",
    "is_bfloat16",
    "is_ml_dtype",
    "is_ml_int",
    "to_raw",
]

# ml_dtypes' integer types (the rest of its types are floats).
_INT_NAMES = frozenset({"int1", "int2", "int4", "uint1", "uint2", "uint4"})


def is_ml_dtype(dtype: np.dtype[Any]) -> bool:
    """Whether `dtype` is one of ml_dtypes' types; never imports ml_dtypes.

    **Arguments:**

    - `dtype`: a numpy dtype.

    **Returns:** True for bfloat16, the float8/float6/float4 kinds, int4 and the other
    types ml_dtypes defines; False for numpy's own dtypes.
    """
    return getattr(dtype.type, "__module__", "").split(".")[0] == "ml_dtypes"


def is_ml_int(dtype: np.dtype[Any]) -> bool:
    """Whether `dtype` is one of ml_dtypes' integer types (int2, int4, uint4, ...)."""
    return dtype.name in _INT_NAMES and is_ml_dtype(dtype)


def is_bfloat16(dtype: np.dtype[Any]) -> bool:
    """Whether `dtype` is ml_dtypes' bfloat16; never imports ml_dtypes."""
    if not is_ml_dtype(dtype):
        return False
    # Loaded: the dtype exists (see the module docstring); compared to the type itself, not
    # just by name, as numpy compares dtypes.
    return dtype == np.dtype(sys.modules["ml_dtypes"].bfloat16)


@functools.cache
def finfo(dtype: np.dtype[Any]) -> Any | None:
    """ml_dtypes' `finfo` of one of its float dtypes, or None for any other dtype
    (numpy's own floats included: `np.finfo` is theirs); never imports ml_dtypes."""
    if not is_ml_dtype(dtype) or is_ml_int(dtype):
        return None
    try:
        return sys.modules["ml_dtypes"].finfo(dtype)
    except (ValueError, TypeError):
        return None


def by_name(name: str) -> np.dtype[Any] | None:
    """The ml_dtypes dtype called `name` (a stored dtype name such as `"bfloat16"`), or
    None if ml_dtypes has no type by that name. Imports ml_dtypes: call it only for a name
    numpy does not know.

    **Arguments:**

    - `name`: a dtype name, as `np.dtype(...).name` gives it.

    **Returns:** the numpy dtype of that ml_dtypes type, or None.
    """
    import ml_dtypes

    obj = getattr(ml_dtypes, name, None)
    if obj is None:
        return None
    try:
        dt = np.dtype(obj)
    except TypeError:
        return None
    return dt if is_ml_dtype(dt) else None


def dtype_named(name: str) -> np.dtype[Any] | None:
    """The dtype a stored name stands for: numpy's own, else ml_dtypes' (`by_name`, which
    imports it); None where neither knows it."""
    try:
        return np.dtype(name)
    except TypeError:
        return by_name(name)


def to_raw(array: Any) -> tuple[np.ndarray, str]:
    """`array` as a file keeps it: C-ordered, little-endian, an ml_dtypes array viewed as
    the unsigned int of its width; and its dtype's name, which `from_raw` reads it back by.

    **Arguments:**

    - `array`: anything `np.asarray` reads.

    **Returns:** `(raw, name)`; `raw` is a new array or `array` itself where it already is
    one in that form.
    """
    a = np.asarray(array)
    name = a.dtype.name
    if is_ml_dtype(a.dtype):
        a = a.view(f"<u{a.dtype.itemsize}")
    elif a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    # Not np.ascontiguousarray: it turns 0-d arrays into shape (1,).
    return np.require(a, requirements="C"), name


def from_raw(raw: np.ndarray, name: str) -> np.ndarray:
    """What `to_raw` turned into `raw` and `name`, with its dtype. Raises `ValueError`
    where `name` is a dtype neither numpy nor the installed ml_dtypes knows."""
    if raw.dtype.name == name:
        return raw
    dtype = dtype_named(name)
    if dtype is None or dtype.itemsize != raw.dtype.itemsize:
        raise ValueError(
            f"an array stored as {raw.dtype.name} says it is {name!r}, which neither numpy nor "
            "the installed ml_dtypes knows at that width; upgrade ml_dtypes (or parity)"
        )
    return raw.view(dtype)
