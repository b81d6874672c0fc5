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
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, overload

import numpy as np

from parity.judge import _mldtypes as mldtypes
from parity.judge._ulp import is_float_dtype, to_float64

__all__ = [
    "BLOCKS",
    "STATS",
    "Fingerprint",
    "Prints",
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


class Prints(Sequence[Fingerprint]):
    """The fingerprints of a value's rows, one entry per row of four arrays, not an object
    per row: a model's recording has over a million rows (an embedding table alone 32,000
    in each of its copies), whose objects took more memory than the program. Indexing
    gives a row's `Fingerprint` (its statistics a view); a slice, the `Prints` of those
    rows.

    **Fields:** `digest`, `special` (uint64 `[n]`), `max_abs` (float64 `[n]`), `stats`
    (float64 `[n, STATS]`), as `Fingerprint`'s.
    """

    __slots__ = ("digest", "max_abs", "special", "stats")

    def __init__(
        self, digest: np.ndarray, special: np.ndarray, max_abs: np.ndarray, stats: np.ndarray
    ) -> None:
        self.digest = np.asarray(digest, dtype=np.uint64).reshape(-1)
        self.special = np.asarray(special, dtype=np.uint64).reshape(-1)
        self.max_abs = np.asarray(max_abs, dtype=np.float64).reshape(-1)
        self.stats = np.asarray(stats, dtype=np.float64).reshape(len(self.digest), STATS)

    @classmethod
    def of(cls, prints: Iterable[Fingerprint]) -> Prints:
        """The `Prints` of fingerprints made one by one."""
        listed = list(prints)
        return cls(
            np.array([f.digest for f in listed], dtype=np.uint64),
            np.array([f.special for f in listed], dtype=np.uint64),
            np.array([f.max_abs for f in listed], dtype=np.float64),
            np.array([f.stats for f in listed], dtype=np.float64).reshape(len(listed), STATS),
        )

    @classmethod
    def joined(cls, parts: Sequence[Prints]) -> Prints:
        """The rows of `parts`, in order (none for no parts)."""
        if not parts:
            return _NO_ROWS
        if len(parts) == 1:
            return parts[0]
        fields = ("digest", "special", "max_abs", "stats")
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in fields))

    def __len__(self) -> int:
        return len(self.digest)

    @overload
    def __getitem__(self, r: int) -> Fingerprint: ...
    @overload
    def __getitem__(self, r: slice) -> Prints: ...
    def __getitem__(self, r: int | slice) -> Fingerprint | Prints:
        if isinstance(r, slice):
            return Prints(self.digest[r], self.special[r], self.max_abs[r], self.stats[r])
        return Fingerprint(
            int(self.digest[r]), int(self.special[r]), float(self.max_abs[r]), self.stats[r]
        )

    def __iter__(self) -> Iterator[Fingerprint]:
        return (self[r] for r in range(len(self)))


#: A value with no rows' fingerprints (fewer than two axes, or no row).
_NO_ROWS = Prints(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros((0, STATS)))


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


#: The most elements whose signs are made for their length and kept between values
#: (`_signs`): a recording asks for the same few row lengths again and again. Longer runs
#: of elements take these signs over and over, so that a large value's (an embedding
#: table's 38.6 M: 309 MB) are neither kept nor drawn again for each value, and a part of
#: them is made for a part of the value (`_signs_from`).
_KEPT_SIGNS = 1 << 20
#: A float value of more elements than this is fingerprinted a chunk of whole rows (about
#: this many elements) at a time (`_chunked`): its float64 copies, three of them, are made
#: for one chunk, not for the whole value (an embedding table's were 926 MB).
CHUNK = _KEPT_SIGNS


def _signs(n: int) -> np.ndarray:
    """`n` fixed pseudo-random signs (the same for every array of `n` elements)."""
    return _kept_signs(n) if n <= _KEPT_SIGNS else _signs_from(0, n)


def _signs_from(start: int, n: int) -> np.ndarray:
    """Elements `start` to `start + n` of the signs of a run longer than `_KEPT_SIGNS`:
    `_KEPT_SIGNS`'s own, over and over."""
    return np.resize(np.roll(_kept_signs(_KEPT_SIGNS), -(start % _KEPT_SIGNS)), n)


def _signs_of(n: int, start: int, stop: int) -> np.ndarray:
    """Elements `start` to `stop` of `_signs(n)`, made for that part alone where long."""
    return _kept_signs(n)[start:stop] if n <= _KEPT_SIGNS else _signs_from(start, stop - start)


@functools.lru_cache(maxsize=256)
def _kept_signs(n: int) -> np.ndarray:
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


def _prints(digests: list[int], floats: _Floats | None) -> Prints:
    """The fingerprint of each of `len(digests)` equal rows of a value, from the rows'
    digests and, for a float value, its `_Floats`."""
    rows = len(digests)
    if floats is None or rows == 0:
        return Prints(np.array(digests, np.uint64), np.zeros(rows), np.zeros(rows),
                      np.zeros((rows, STATS)))  # fmt: skip
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
    return Prints(
        np.array(digests, np.uint64), np.array(specials, np.uint64), np.asarray(max_abs), stats
    )


def _parts(array: np.ndarray) -> tuple[np.ndarray, memoryview, _Floats | None]:
    """`array` C-ordered, its bytes (a view: an embedding table's are not copied to be
    hashed), and its `_Floats` when it is a float value."""
    array = np.ascontiguousarray(array)
    floats = _floats(array) if is_float_dtype(array.dtype) else None
    return array, array.reshape(-1).view(np.uint8).data, floats


def row_fingerprints(array: np.ndarray) -> Prints:
    """The fingerprint of each row (leading index) of `array`, or of `array` itself when it
    is given with a leading axis of one (`array[None]`); none for no rows."""
    if _large(array):
        return _chunked(np.ascontiguousarray(array), whole=False, rows=True)[1]
    array, data, floats = _parts(array)
    return _prints(_digests(data, array.shape[0]), floats)


def _large(array: np.ndarray) -> bool:
    return array.size > CHUNK and array.ndim > 0 and is_float_dtype(array.dtype)


def _chunked(array: np.ndarray, *, whole: bool, rows: bool) -> tuple[Fingerprint | None, Prints]:
    """A large float value's fingerprint (with `whole`) and its rows' (with `rows`), made
    a chunk of whole rows at a time (`CHUNK`). Each row's is the one made
    of the whole value at once, bit for bit; the whole's block sums add the chunks' parts,
    in float64, and its special digest reads the chunks in order."""
    data = array.reshape(-1).view(np.uint8).data
    count, width = array.shape[0], array.size // array.shape[0]
    step = max(1, CHUNK // max(width, 1))
    digests = _digests(data, count) if rows else []
    starts, sizes = _blocks(array.size)
    ends = starts + sizes
    sums, largest, specials = np.zeros((3, len(starts))), 0.0, False
    prints: list[Prints] = []
    for first in range(0, count, step):
        floats = _floats(array[first : first + step])
        lo, hi = first * width, first * width + floats.numbers.shape[1]
        largest, specials = max(largest, floats.max_abs), specials or floats.plain is not None
        if whole:
            signed = floats.numbers[0] * _signs_of(array.size, lo, hi)
            for b, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
                a, z = max(s, lo) - lo, min(e, hi) - lo
                if a < z:
                    sums[:2, b] += floats.numbers[:2, a:z].sum(axis=1)
                    sums[2, b] += signed[a:z].sum()
        if rows:
            prints.append(_prints(digests[first : first + step], floats))
    rows_of = Prints.joined(prints) if prints else _NO_ROWS
    if not whole:
        return None, rows_of
    stats = np.zeros((3, BLOCKS))
    stats[:, : len(starts)] = sums / sizes
    special = _chunked_special(array, step) if specials else 0
    return Fingerprint(_digest(data), special, largest, stats.reshape(STATS)), rows_of


def _chunked_special(array: np.ndarray, step: int) -> int:
    """The special digest of a large value (`_prints`'s, of the whole), its marks hashed
    a chunk at a time: first where they are NaN, then their numbers."""
    hasher = hashlib.blake2b(digest_size=8)
    for numbers in (False, True):
        for first in range(0, array.shape[0], step):
            floats = _floats(array[first : first + step])
            plain = np.ones(floats.x64.shape, bool) if floats.plain is None else floats.plain
            marks = np.where(plain, 0.0, floats.x64)
            hasher.update(np.nan_to_num(marks).tobytes() if numbers else np.isnan(marks).tobytes())
    return int.from_bytes(hasher.digest(), "little")


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
    array = np.asarray(array)
    if _large(array):
        whole, _ = _chunked(np.ascontiguousarray(array), whole=True, rows=False)
        assert whole is not None
        return whole
    _, data, floats = _parts(array)
    return _prints([_digest(data)], floats)[0]


def value_fingerprints(array: np.ndarray) -> tuple[Fingerprint, Prints]:
    """`fingerprint(array)` and, for a value of two or more axes and at least one row,
    `row_fingerprints(array)` (else no rows), as a recording keeps them for each value: its
    bytes and float64 numbers are made once for both (a chunk of rows at a time for a
    large one)."""
    if _large(np.asarray(array)):
        whole, rows = _chunked(np.ascontiguousarray(array), whole=True, rows=np.ndim(array) >= 2)
        assert whole is not None
        return whole, rows
    array, data, floats = _parts(np.asarray(array))
    whole = _prints([_digest(data)], floats)[0]
    if array.ndim < 2 or array.shape[0] == 0:
        return whole, _NO_ROWS
    return whole, _prints(_digests(data, array.shape[0]), floats)
