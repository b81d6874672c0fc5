"""What a value's numbers look like, compactly: a recording's `Fingerprint` of each value
(`parity.origin._recording`), made as the value is recorded.

A `Fingerprint` is a digest of the value's bytes and, for a float value, its largest
ordinary magnitude and `STATS` block statistics (the mean, the mean magnitude and the mean
under fixed pseudo-random signs of each of `BLOCKS` contiguous blocks of its flattened
elements). Each statistic is an average, so two arrays within `tau` of each other
elementwise have every statistic within `tau` too: the fingerprints rule out candidates
before any array is read. A value with two or more axes also has a fingerprint per row (its
leading index), so that a value of the other program can be matched against one row of a
stacked value. `value_fingerprints` makes both for a value at once, as a recording keeps
them: a recording of a training step fingerprints tens of thousands of values, mostly
small, where numpy's cost per call, not the arithmetic, is what a fingerprint takes; a
value's bytes are hashed through a view, and the signs of a large value made for it alone,
so an embedding table is not held twice.

This module imports numpy only.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from parity.judge import _mldtypes as mldtypes
from parity.judge._ulp import is_float_dtype, to_float64

__all__ = [
    "BLOCKS",
    "STATS",
    "Fingerprint",
    "fingerprint",
    "ordinary",
    "row_digests",
    "row_fingerprints",
    "value_fingerprints",
]

#: Contiguous blocks whose mean and mean magnitude a float value's fingerprint keeps.
BLOCKS = 8
#: Statistics per fingerprint: per block its mean, its mean magnitude, and its mean under
#: fixed pseudo-random signs (a projection: a sign flipped on some elements, invisible to
#: the first two where they average out, moves it).
STATS = 3 * BLOCKS


@dataclass(frozen=True)
class Fingerprint:
    """What a value's numbers look like, compactly.

    **Fields:** `digest` (of its raw bytes: equal bytes, equal digest), `special` (a digest
    of where its NaN and infinities sit, 0 when every element is finite or it is not a
    float; fill values near the dtype's largest count too: `ordinary`), `max_abs` (its largest
    ordinary magnitude; 0 for non-floats) and `stats`
    (`[STATS]` float64: block means, block mean magnitudes, block means under fixed signs;
    zeros for non-floats).
    """

    digest: int
    special: int
    max_abs: float
    stats: np.ndarray


def _digest(data: bytes | memoryview) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _digests(data: bytes | memoryview, rows: int) -> list[int]:
    """The digest of each of `rows` equal slices of `data` (a C-ordered array's bytes: its
    rows'); slices of a memoryview, so no row is copied."""
    size = len(data) // rows if rows else 0
    if size == 0:
        return [_digest(b"")] * rows
    view = memoryview(data)
    return [_digest(view[i : i + size]) for i in range(0, len(data), size)]


def _block_stats(numbers: np.ndarray) -> np.ndarray:
    """`[rows, STATS]`: per row of `numbers[0]` (`numbers` is `[3, rows, n]`: finite values,
    their magnitudes, and room for the values under fixed signs, which this writes), the
    mean, the mean magnitude and the mean under fixed signs of each of `BLOCKS` contiguous
    blocks (fewer blocks than `BLOCKS` when `n` is small: the rest stay 0 on both sides of a
    comparison, as both have the same `n`).

    The three are summed by one `reduceat` over the stack: each block's sum is the same 1-D
    reduction of the same numbers as one call per statistic makes, so the same bits, for a
    third of the calls, which on the small values a recording mostly holds cost more than
    the arithmetic. At `n <= BLOCKS` every block is one element, whose mean is itself
    (`x / 1`): nothing is summed."""
    _, rows, n = numbers.shape
    out = np.zeros((rows, STATS))
    if n == 0:
        return out
    np.multiply(numbers[0], _signs(n), out=numbers[2])
    by_kind = out.reshape(rows, 3, BLOCKS)  # a view: means, magnitudes, signed means
    if n <= BLOCKS:
        by_kind[:, :, :n] = numbers.transpose(1, 0, 2)
        return out
    starts, sizes = _blocks(n)
    sums = np.add.reduceat(numbers, starts, axis=2)
    by_kind[:, :, : len(starts)] = (sums / sizes).transpose(1, 0, 2)
    return out


@functools.lru_cache(maxsize=256)
def _blocks(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Where each of the (at most `BLOCKS`) contiguous blocks of `n` elements starts, and
    its size: the same for every row of `n` elements, so made once per `n`."""
    starts = np.unique(np.linspace(0, n, BLOCKS + 1).astype(np.int64)[:-1])
    sizes = np.diff(np.append(starts, n))
    starts.flags.writeable = sizes.flags.writeable = False
    return starts, sizes


#: The most elements whose signs are kept between values (`_signs`): a recording asks for
#: the same few row lengths again and again; a large value's signs (an embedding table's
#: 38.6 M: 309 MB) are made for it and let go, not held for the rest of the process.
_KEPT_SIGNS = 1 << 20


def _signs(n: int) -> np.ndarray:
    """`n` fixed pseudo-random signs (the same for every array of `n` elements)."""
    return _kept_signs(n) if n <= _KEPT_SIGNS else _made_signs(n)


@functools.lru_cache(maxsize=256)
def _kept_signs(n: int) -> np.ndarray:
    return _made_signs(n)


def _made_signs(n: int) -> np.ndarray:
    signs = np.where(np.random.default_rng(n).integers(0, 2, n) == 1, 1.0, -1.0)
    signs.flags.writeable = False
    return signs


def row_digests(array: np.ndarray) -> list[int]:
    """The digest of each row's bytes (leading index) of `array`, as its fingerprint's."""
    return _digests(np.ascontiguousarray(array).tobytes(), array.shape[0])


class _Floats(NamedTuple):
    """A float value's elements as float64, flattened, made once for its own fingerprint
    and its rows' (`value_fingerprints`).

    **Fields:** `numbers` (`[3, size]`: the ordinary values, the others as 0; their
    magnitudes; room for `_block_stats`), `max_abs` (the largest of the magnitudes; 0 for no
    element), `plain` (which elements are ordinary, `ordinary`; None when all are, as in
    most values: then no mask is made or applied) and `x64` (all the values, for where the
    others sit; `numbers[0]` when all are ordinary).
    """

    numbers: np.ndarray
    max_abs: float
    plain: np.ndarray | None
    x64: np.ndarray


def _floats(array: np.ndarray) -> _Floats:
    """`_Floats` of `array`, a C-ordered value of a float dtype (`is_float_dtype`)."""
    bound = _ordinary_bound(array.dtype)
    numbers = np.empty((3, array.size))
    x64, magnitude = numbers[0], numbers[1]
    x64[...] = to_float64(array.reshape(-1))
    np.abs(x64, out=magnitude)
    # The largest magnitude is NaN where any is: at most `bound` means all are ordinary.
    largest = float(np.maximum.reduce(magnitude)) if array.size else 0.0
    if largest <= bound:
        return _Floats(numbers, largest, None, x64)
    plain = ordinary(x64, array.dtype)
    x64 = x64.copy()  # kept whole; the values and magnitudes of the others become 0
    np.copyto(numbers[:2], 0.0, where=~plain)
    return _Floats(numbers, float(np.maximum.reduce(magnitude)), plain, x64)


def _prints(digests: list[int], floats: _Floats | None) -> list[Fingerprint]:
    """The fingerprint of each of `len(digests)` equal rows of a value, from the rows'
    digests and, for a float value, its `_Floats`."""
    rows = len(digests)
    if floats is None or rows == 0:
        zeros = np.zeros(STATS)
        return [Fingerprint(d, 0, 0.0, zeros) for d in digests]
    numbers = floats.numbers.reshape(3, rows, -1)
    if rows == 1:  # the whole value, whose largest magnitude `_floats` found
        max_abs = [floats.max_abs]
    elif numbers.shape[2]:
        max_abs = np.maximum.reduce(numbers[1], axis=1).tolist()
    else:
        max_abs = [0.0] * rows
    stats = _block_stats(numbers)
    specials = [0] * rows
    if floats.plain is not None:  # where the specials sit, and what they are, per row
        plain, x64 = floats.plain.reshape(rows, -1), floats.x64.reshape(rows, -1)
        for r in np.flatnonzero(~plain.all(axis=1)).tolist():
            marks = np.where(plain[r], 0.0, x64[r])
            specials[r] = _digest(np.isnan(marks).tobytes() + np.nan_to_num(marks).tobytes())
    return [
        Fingerprint(d, s, m, st)
        for d, s, m, st in zip(digests, specials, max_abs, stats, strict=True)
    ]


def _parts(array: np.ndarray) -> tuple[np.ndarray, memoryview, _Floats | None]:
    """`array` C-ordered, its bytes (a view: an embedding table's are not copied to be
    hashed), and its `_Floats` when it is a float value."""
    array = np.ascontiguousarray(array)
    floats = _floats(array) if is_float_dtype(array.dtype) else None
    return array, array.reshape(-1).view(np.uint8).data, floats


def row_fingerprints(array: np.ndarray) -> list[Fingerprint]:
    """The fingerprint of each row (leading index) of `array`, or of `array` itself when it
    is given with a leading axis of one (`array[None]`); none for no rows."""
    array, data, floats = _parts(array)
    return _prints(_digests(data, array.shape[0]), floats)


@functools.lru_cache(maxsize=64)
def _ordinary_bound(dtype: np.dtype[Any]) -> float:
    """The largest ordinary magnitude of a float `dtype` (`ordinary`): half its largest
    value, `inf` where it has no `finfo`; looked up once a dtype, not once a value."""
    info = np.finfo(dtype) if dtype.kind == "f" else mldtypes.finfo(dtype)
    largest = float(info.max) if info is not None else np.inf
    return largest / 2


def ordinary(x64: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """Which elements of `x64` (a float array of `dtype`, as float64) are ordinary numbers:
    finite and below half the dtype's largest value. The others (NaN, infinities and fill
    values such as `finfo.min`, a mask's "minus infinity") are matched exactly, and do not
    set the scale a tolerance is taken from."""
    with np.errstate(invalid="ignore"):
        return np.abs(x64) <= _ordinary_bound(dtype)


def fingerprint(array: np.ndarray) -> Fingerprint:
    """The fingerprint of a whole value."""
    _, data, floats = _parts(np.asarray(array))
    return _prints([_digest(data)], floats)[0]


def value_fingerprints(array: np.ndarray) -> tuple[Fingerprint, tuple[Fingerprint, ...]]:
    """`fingerprint(array)` and, for a value of two or more axes and at least one row,
    `row_fingerprints(array)` (else `()`), as a recording keeps them for each value: its
    bytes and float64 numbers are made once for both."""
    array, data, floats = _parts(np.asarray(array))
    whole = _prints([_digest(data)], floats)[0]
    if array.ndim < 2 or array.shape[0] == 0:
        return whole, ()
    return whole, tuple(_prints(_digests(data, array.shape[0]), floats))
