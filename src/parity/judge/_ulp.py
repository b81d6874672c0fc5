"""Dtypes parity can compare, and the ulp line: distances in units in the last place.

`ulp_distance` maps raw bits to a monotone integer line (each value's rank among its
dtype's values) so that it works for float16/32/64 and every ml_dtypes float, including
layouts without negative zero or without a sign. `spacing_at` gives the gap between a
value and its neighbour, which the `close` rule's `atol_ulps` uses.

This module imports numpy only: ml_dtypes' types are recognised without importing it
(`parity.judge._mldtypes`), so comparing float32 arrays never pays for its import.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from parity.judge import _mldtypes as mldtypes

__all__ = [
    "ULP_NAN",
    "is_float_dtype",
    "is_int_dtype",
    "ordinal_distance",
    "spacing_at",
    "to_float64",
    "ulp_distance",
]

#: What `ulp_distance` returns where either operand is NaN: the largest uint64. NaN has no
#: place on the number line, so it is at no finite distance from anything, itself included;
#: callers check NaN positions separately (as `parity.judge._compare` does).
ULP_NAN = np.uint64(np.iinfo(np.uint64).max)


def is_float_dtype(dtype: np.dtype[Any]) -> bool:
    """Whether `dtype` is a real floating dtype parity can put on the ulp line.

    numpy's float16/32/64 and the ml_dtypes floats (bfloat16, float8 kinds, ...); not
    complex, and not long double (it has no exact float64 upcast).
    """
    if dtype.kind == "f":
        return dtype.itemsize <= 8
    return dtype.kind == "V" and mldtypes.finfo(dtype) is not None


def is_int_dtype(dtype: np.dtype[Any]) -> bool:
    """Whether `dtype` is an integer or bool dtype (numpy's or ml_dtypes' int2/int4/...)."""
    return dtype.kind in "biu" or mldtypes.is_ml_int(dtype)


def to_float64(x: np.ndarray) -> np.ndarray:
    """`x` as float64: exact for every float dtype `is_float_dtype` accepts.

    Some ml_dtypes casts warn about NaN patterns ("invalid value"); the NaN is kept, so the
    warning says nothing here.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(np.float64)


def _uint_view(x: np.ndarray) -> np.ndarray:
    # Raw bits as unsigned ints of the same width, so ordering and equality are on bits.
    # ascontiguousarray promotes 0-d arrays to 1-d; the reshape puts the shape back.
    return np.ascontiguousarray(x).reshape(x.shape).view(np.dtype(f"u{x.dtype.itemsize}"))


@functools.cache
def _rank_table(dtype: np.dtype[Any]) -> np.ndarray:
    """For a float dtype of at most 16 bits: bit pattern -> rank on the number line.

    Ranking every pattern by value (rather than flipping sign-magnitude bits) is right for
    every ml_dtypes layout, including those without negative zero (`fnuz`), without a sign
    (`e8m0fnu`) and narrower than their storage byte (`float4`, `float6`). Equal values
    (+0 and -0) share a rank; NaN patterns get -1.
    """
    n = 1 << (8 * dtype.itemsize)
    values = to_float64(np.arange(n, dtype=np.dtype(f"u{dtype.itemsize}")).view(dtype))
    nan = np.isnan(values)
    line = np.unique(values[~nan])
    ranks = np.searchsorted(line, np.where(nan, 0.0, values)).astype(np.int64)
    ranks[nan] = -1
    ranks.setflags(write=False)
    return ranks


def _is_ieee_half(dtype: np.dtype[Any]) -> bool:
    """float16 or bfloat16: 16-bit IEEE layouts (a sign, infinities, every pattern below inf
    a distinct value), whose sign-magnitude bits give their places on the line directly."""
    return dtype == np.float16 or mldtypes.is_bfloat16(dtype)


def _ordinal(x: np.ndarray) -> np.ndarray:
    """Each element's place on a monotone int64 line: equal values (±0) at the same place.

    NaN elements get an arbitrary place; callers mask them.
    """
    dtype = x.dtype
    if dtype.itemsize <= 2 and not _is_ieee_half(dtype):
        return _rank_table(dtype)[_uint_view(x)]
    # IEEE float16/bfloat16/float32/float64: sign-magnitude bits, folded so negatives count
    # down from 0 (the same distances as the rank table, without a lookup per element).
    bits = _uint_view(x).view(np.dtype(f"i{dtype.itemsize}")).astype(np.int64)
    magnitude = bits & np.int64((1 << (8 * dtype.itemsize - 1)) - 1)
    return np.where(bits < 0, -magnitude, magnitude)


def ulp_distance(a: Any, b: Any) -> np.ndarray:
    """Elementwise distance in ulps between two float arrays of the same dtype and shape.

    Raw bits are mapped to a monotone integer line (the rank of each value among the
    dtype's values), and the distance is the difference of ranks: symmetric, 0 exactly
    when the values are equal (+0 and -0 are at distance 0), 1 between neighbours, and inf
    is one step past the largest finite value.

    **Arguments:**

    - `a`, `b`: arrays (anything `np.asarray` takes) of one float dtype: float16, bfloat16,
        float32, float64 or an ml_dtypes float8 (or narrower) kind.

    **Returns:** a `uint64` array of the common shape, `ULP_NAN` (the largest uint64) where
    either operand is NaN. Raises `TypeError` for other dtypes and `ValueError` for
    differing dtypes or shapes.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    if a.dtype != b.dtype:
        raise ValueError(
            f"ulp_distance needs one dtype, got {a.dtype.name} and {b.dtype.name}; "
            "ulps of different dtypes are not comparable"
        )
    if a.shape != b.shape:
        raise ValueError(f"ulp_distance needs one shape, got {a.shape} and {b.shape}")
    if not is_float_dtype(a.dtype):
        raise TypeError(
            f"ulp_distance needs a real float dtype of at most 64 bits, got {a.dtype.name}"
        )
    dist = ordinal_distance(a, b)
    nan = np.isnan(to_float64(a)) | np.isnan(to_float64(b))
    dist[nan] = ULP_NAN
    return dist


def ordinal_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`ulp_distance` without its checks and without marking NaN: for callers that have
    checked dtypes and shapes and mask NaN positions themselves (`parity.judge._compare`, which
    has the float64 values at hand). **Returns:** uint64, arbitrary where either is NaN."""
    if a.dtype == np.float32 or _is_ieee_half(a.dtype):
        # Narrow lines: in int32 (halves) or int64 (float32) the difference cannot wrap.
        wide = np.int32 if a.dtype.itemsize == 2 else np.int64
        dist = np.abs(_sign_magnitude(a, wide) - _sign_magnitude(b, wide))
        return np.asarray(dist, dtype=np.uint64)  # 0-d operands give numpy scalars
    oa = _ordinal(a).view(np.uint64)
    ob = _ordinal(b).view(np.uint64)
    # Both ordinals lie within int64 but their difference can exceed it (for float64,
    # -max to +max); modular uint64 subtraction of the smaller from the larger is exact.
    larger = oa.view(np.int64) >= ob.view(np.int64)
    with np.errstate(over="ignore"):  # 0-d operands become scalars, which warn on wrapping
        return np.asarray(np.where(larger, oa - ob, ob - oa))


def _sign_magnitude(x: np.ndarray, wide: Any) -> np.ndarray:
    """An IEEE float's place on the line, as `wide` ints: sign-magnitude bits folded so
    that negatives count down from 0 (+0 and -0 both at 0)."""
    bits = _uint_view(x).view(np.dtype(f"i{x.dtype.itemsize}")).astype(wide)
    magnitude = bits & wide((1 << (8 * x.dtype.itemsize - 1)) - 1)
    return np.where(bits < 0, -magnitude, magnitude)


def spacing_at(value: float, dtype: np.dtype[Any]) -> float:
    """The gap from `value` (>= 0, representable in `dtype`) to its upper neighbour in
    `dtype`, or to its lower one at the top of the range; as a float64."""
    itemsize = dtype.itemsize
    bits = np.array([value], dtype=np.float64).astype(dtype).view(np.dtype(f"u{itemsize}"))
    here = float(to_float64(bits.view(dtype))[0])
    up = float(to_float64((bits + 1).view(dtype))[0])
    if math.isfinite(up) and up > here:
        return up - here
    down = float(to_float64((bits - 1).view(dtype))[0])
    return here - down
