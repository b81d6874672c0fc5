"""A recording's fingerprints (`parity.origin._recording`) are the straightforward ones, bit
for bit: `fingerprint`, `row_fingerprints`, `value_fingerprints` and `row_digests`, which
share work between a value and its rows and skip the mask where every element is ordinary,
give the same digests, specials, largest magnitudes and statistics as `_reference` below
(the code they replaced, one numpy call per statistic and per row) for every shape, float,
integer and bool dtype, special value and raw bit pattern."""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable
from typing import Any
from unittest import mock

import hypothesis
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from parity.judge import _mldtypes as mldtypes
from parity.judge._ulp import is_float_dtype, to_float64
from parity.origin import _fingerprints as fingerprints
from parity.origin._fingerprints import (
    BLOCKS,
    STATS,
    Fingerprint,
    _blocks,
    _signs,
    fingerprint,
    row_digests,
    row_fingerprints,
    value_fingerprints,
)

PROPERTY = settings(max_examples=300, deadline=None, derandomize=True)

#: (Not float8_e5m2: ml_dtypes 0.6 gives it kind "f", and `np.finfo`, which `ordinary`
#: asks of such a dtype, refuses it, before this change as after.)
FLOATS = [np.float16, np.float32, np.float64, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
          ml_dtypes.float8_e5m2fnuz, ml_dtypes.float4_e2m1fn]  # fmt: skip
DTYPES = [np.dtype(d) for d in [*FLOATS, np.int32, np.uint32, np.int8, np.bool_]]
#: Last axes about `BLOCKS` (one element a block, or not), blocks past numpy's unrolled sums (8)
#: and past its pairwise blocks (128), so that every way a block is summed is held.
LONG = [0, 1, 7, 8, 9, 17, 129, 300, 1030, 4099]


def _reference_digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _reference_block_stats(x64: np.ndarray) -> np.ndarray:
    rows, n = x64.shape
    out = np.zeros((rows, STATS))
    if n == 0:
        return out
    starts, sizes = _blocks(n)
    k = len(starts)
    out[:, :k] = np.add.reduceat(x64, starts, axis=1) / sizes
    out[:, BLOCKS : BLOCKS + k] = np.add.reduceat(np.abs(x64), starts, axis=1) / sizes
    out[:, 2 * BLOCKS : 2 * BLOCKS + k] = np.add.reduceat(x64 * _signs(n), starts, axis=1) / sizes
    return out


def _reference_ordinary(x64: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    info = np.finfo(dtype) if dtype.kind == "f" else mldtypes.finfo(dtype)
    largest = float(info.max) if info is not None else np.inf
    with np.errstate(invalid="ignore"):
        return np.abs(x64) <= largest / 2


def _reference(array: np.ndarray) -> list[Fingerprint]:
    """`row_fingerprints` as it was: each statistic, each row's digest and special apart."""
    rows = array.shape[0]
    flat = np.ascontiguousarray(array).reshape(rows, -1)
    digests = [_reference_digest(flat[r].tobytes()) for r in range(rows)]
    if not is_float_dtype(array.dtype):
        zeros = np.zeros(STATS)
        return [Fingerprint(d, 0, 0.0, zeros) for d in digests]
    x64 = to_float64(flat)
    plain = _reference_ordinary(x64, array.dtype)
    clean = np.where(plain, x64, 0.0)
    max_abs = np.abs(clean).max(axis=1) if clean.shape[1] else np.zeros(rows)
    stats = _reference_block_stats(clean)
    out = []
    for r in range(rows):
        special = 0
        if not plain[r].all():
            marks = np.where(plain[r], 0.0, x64[r])
            special = _reference_digest(np.isnan(marks).tobytes() + np.nan_to_num(marks).tobytes())
        out.append(Fingerprint(digests[r], special, float(max_abs[r]), stats[r]))
    return out


def _same(got: Fingerprint, want: Fingerprint) -> None:
    assert (got.digest, got.special) == (want.digest, want.special)
    assert type(got.max_abs) is float
    assert np.float64(got.max_abs).tobytes() == np.float64(want.max_abs).tobytes()
    assert got.stats.dtype == want.stats.dtype and got.stats.shape == want.stats.shape == (STATS,)
    assert got.stats.tobytes() == want.stats.tobytes()


def _specials(dtype: np.dtype[Any]) -> list[float]:
    info = np.finfo(dtype) if dtype.kind == "f" else mldtypes.finfo(dtype)
    big = float(info.max)
    return [np.nan, np.inf, -np.inf, -0.0, 0.0, big, -big, big / 2, -big / 2, float(info.tiny)]


@st.composite
def _arrays(draw: st.DrawFn) -> np.ndarray:
    """An array of any of `DTYPES`: normal numbers at any scale, raw bit patterns (NaN
    payloads, subnormals), or either with specials put in (NaN, infinities, fill values at
    and about the largest ordinary magnitude, -0); some given transposed or strided."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 5), max_size=3))
    if draw(st.booleans()):
        shape.append(draw(st.sampled_from(LONG)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    size = int(np.prod(shape))
    if dtype == np.bool_:
        flat = rng.random(size) < 0.5
    elif not is_float_dtype(dtype):
        info = np.iinfo(dtype)
        flat = rng.integers(info.min, info.max, size, dtype=dtype, endpoint=True)
    elif draw(st.booleans()):  # raw bits
        flat = rng.integers(0, 256, size * dtype.itemsize, dtype=np.uint8).view(dtype)
    else:
        scale = 10.0 ** draw(st.integers(-6, 6))
        with np.errstate(over="ignore", invalid="ignore"):
            flat = (rng.standard_normal(size) * scale).astype(dtype)
            for i, v in draw(st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(
                    range(10))), max_size=4)) if size else []:  # fmt: skip
                flat[i % size] = np.asarray(_specials(dtype)[v]).astype(dtype)
    array = flat.reshape(shape)
    layout = draw(st.sampled_from(["c", "transposed", "strided"]))
    if layout == "transposed" and array.ndim >= 2:
        return np.ascontiguousarray(array.swapaxes(0, -1)).swapaxes(0, -1)
    if layout == "strided" and array.ndim >= 1:
        return np.repeat(array, 2, axis=-1)[..., ::2]
    return array


def _warned(fn: Callable[[], Any]) -> tuple[Any, set[str]]:
    """What `fn()` returns, and the warnings it gives."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, {f"{w.category.__name__}: {w.message}" for w in caught}


@PROPERTY
@given(array=_arrays())
def test_fingerprints_are_the_reference_bit_for_bit(array: np.ndarray) -> None:
    """Each function's fingerprints against the reference's, for the whole value (the
    reference's one row of `array[None]`) and for each row; with no warning the reference
    does not give too (a signalling NaN among raw bits is quietened, and says nothing; a
    block sum past float64's largest says it overflowed, in both)."""
    has_rows = array.ndim >= 1 and array.shape[0] > 0
    (want,), warned = _warned(lambda: _reference(array[None]))
    reference, warned_rows = _warned(lambda: _reference(array)) if has_rows else ([], set())
    got, warned_got = _warned(
        lambda: (fingerprint(array), value_fingerprints(array), row_fingerprints(array)
                 if has_rows else [], row_digests(array) if has_rows else [])
    )  # fmt: skip
    assert warned_got <= warned | warned_rows
    whole, (also_whole, rows), each_row, digests = got
    _same(whole, want)
    _same(also_whole, want)
    assert len(each_row) == len(reference) == (array.shape[0] if has_rows else 0)
    for g, w in zip(each_row, reference, strict=True):
        _same(g, w)
    assert digests == [w.digest for w in reference]
    if array.ndim >= 2 and has_rows:
        assert len(rows) == len(reference)
        for g, w in zip(rows, reference, strict=True):
            _same(g, w)
    else:
        assert len(rows) == 0


@pytest.mark.parametrize("n", range(1, BLOCKS + 1))
def test_up_to_blocks_elements_each_block_is_one(n: int) -> None:
    """`_block_stats` takes the numbers as their own block means at `n <= BLOCKS`: so they
    must be, each block one element."""
    starts, sizes = _blocks(n)
    assert starts.tolist() == list(range(n)) and sizes.tolist() == [1] * n


def test_no_rows_no_row_fingerprints() -> None:
    """A value of no rows has no row fingerprints or digests (the reference could not
    reshape it), and its own fingerprint is that of no bytes."""
    empty = np.zeros((0, 3), np.float32)
    assert len(row_fingerprints(empty)) == 0 and row_digests(empty) == []
    whole, rows = value_fingerprints(empty)
    assert len(rows) == 0
    _same(whole, _reference(empty[None])[0])


@PROPERTY
@given(array=_arrays(), chunk=st.sampled_from([1, 5, 64]))
def test_a_large_value_is_fingerprinted_a_chunk_of_rows_at_a_time(
    array: np.ndarray, chunk: int
) -> None:
    """Past `CHUNK` elements a float value is fingerprinted a chunk of whole rows at a time
    (`_chunked`, here with `CHUNK` made small so that the property's arrays take that way):
    each row's fingerprint is the reference's bit for bit, the whole's digest, special and
    largest magnitude too, and its statistics are the reference's up to float64's rounding
    of the block sums, added a chunk at a time."""
    x64 = to_float64(array) if is_float_dtype(array.dtype) else np.zeros(0)
    with np.errstate(invalid="ignore"):
        hypothesis.assume(not np.any(np.abs(x64[np.isfinite(x64)]) > 1e300))  # sums overflow
    has_rows = array.ndim >= 1 and array.shape[0] > 0
    (want,), _ = _warned(lambda: _reference(array[None]))
    reference, _ = _warned(lambda: _reference(array)) if has_rows else ([], set())
    with mock.patch.object(fingerprints, "CHUNK", chunk):
        (whole, (also_whole, rows), each_row), _ = _warned(
            lambda: (fingerprint(array), value_fingerprints(array),
                     row_fingerprints(array) if has_rows else [])
        )  # fmt: skip
    for got in (whole, also_whole):
        assert (got.digest, got.special, got.max_abs) == (want.digest, want.special, want.max_abs)
        np.testing.assert_allclose(got.stats, want.stats, rtol=1e-9, atol=1e-300)
    for g, w in zip(each_row, reference, strict=True):
        _same(g, w)
    for g, w in zip(rows, reference if array.ndim >= 2 else [], strict=True):
        _same(g, w)
    assert len(rows) == (len(reference) if array.ndim >= 2 else 0)
