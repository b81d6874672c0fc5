"""One array's comparison as a tally over its chunks: every figure (max abs, max ulp, the
worst element, the first that differs, the expected side's scale) a reduction that combines across
chunks exactly, so that a chunked comparison gives the same finding as a whole one."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np

from parity.judge import _mldtypes as mldtypes
from parity.judge._chunks import Block, Source
from parity.judge._classes import ToleranceClass
from parity.judge._findings import Scalar
from parity.judge._floats import largest_finite_abs
from parity.judge._rule_base import Elements, Scale
from parity.judge._ulp import ordinal_distance, to_float64

__all__ = ["Tally", "Worst", "scan_scale"]


def _flat_bits(x: np.ndarray) -> np.ndarray:
    """Raw bits of `x`, flattened: one unsigned int per element (or a row of bytes)."""
    flat = np.ascontiguousarray(x.reshape(-1))
    size = x.dtype.itemsize
    if size in (1, 2, 4, 8):
        return flat.view(np.dtype(f"u{size}"))
    return flat.view(np.uint8).reshape(flat.shape[0], size)


def _same_bytes(bits_a: np.ndarray, bits_e: np.ndarray) -> bool:
    """Whether two flat bit arrays hold the same bytes, compared eight bytes at a time
    where the length allows (measured: 7 GB/s, against 0.5 GB/s for a mask of differing
    2-byte elements and its indices)."""
    if bits_a.ndim == 1 and bits_a.nbytes % 8 == 0 and bits_a.nbytes:
        return bool(np.array_equal(bits_a.view(np.uint64), bits_e.view(np.uint64)))
    return bool(np.array_equal(bits_a, bits_e))


def _differ_mask(bits_a: np.ndarray, bits_e: np.ndarray) -> np.ndarray:
    ne = bits_a != bits_e
    return ne.any(axis=1) if ne.ndim == 2 else ne


def _scalar(x: Any) -> Scalar:
    value = x.item() if isinstance(x, np.generic) else x
    if isinstance(value, bool | int | float | complex):
        return value
    return float(value)


def _max_finite_abs(x: np.ndarray) -> float:
    """The largest finite |x| of a flat float chunk, as float64 (0.0 if none is finite):
    the same figure as `Scale.of`, from the bits where the dtype is IEEE with infinities
    (no float64 copy of the chunk), else through float64."""
    if x.size == 0:
        return 0.0
    inf_bits = _ieee_inf_bits(x.dtype)
    if inf_bits is None:
        return largest_finite_abs(to_float64(x))
    width = 8 * x.dtype.itemsize
    bits = x.view(np.dtype(f"u{x.dtype.itemsize}"))
    mag = bits & np.array((1 << (width - 1)) - 1, bits.dtype)
    # Sign cleared, IEEE magnitudes order like their bits; patterns from inf upwards are
    # inf and NaN.
    top = np.where(mag < inf_bits, mag, 0).max()
    return float(to_float64(np.array([top], bits.dtype).view(x.dtype))[0])


_NUMPY_IEEE = frozenset(np.dtype(d) for d in (np.float16, np.float32, np.float64))


@functools.cache
def _ieee_inf_bits(dtype: np.dtype[Any]) -> Any | None:
    """The bits of +inf for an IEEE dtype with infinities (float16/32/64, bfloat16), as an
    unsigned int of its width; None for every other dtype."""
    if dtype not in _NUMPY_IEEE and not mldtypes.is_bfloat16(dtype):
        return None
    inf = np.array([np.inf], np.float64).astype(dtype).view(np.dtype(f"u{dtype.itemsize}"))
    return inf[0]


@dataclass
class Worst:
    """The element a finding names, and the two values as the reason prints them."""

    index: int
    actual: Any  # in the array's dtype
    expected: Any
    actual_value: Scalar | None = None  # as the finding stores them (float64 for floats)
    expected_value: Scalar | None = None
    detail: str = ""
    score: float = 0.0


@dataclass
class Tally:
    """Running figures of one array comparison, combined chunk by chunk.

    Every field is a count, a maximum or a first occurrence, each of which combines
    exactly across chunks: a chunked pass gives the same finding as one whole chunk.
    Only elements whose bits differ are looked at: elements with equal bits pass every
    rule and add nothing to any figure.
    """

    kind: Literal["float", "int", "other"]
    tol: ToleranceClass
    scale: Scale | None  # known before the pass, when the rule judges against it
    dtype: np.dtype[Any]
    n_differ: int = 0
    n_violating: int = 0
    n_special: int = 0
    max_abs: float | None = 0.0
    max_rel: float = 0.0
    max_ulp: int = 0
    scale_max: float = 0.0  # max finite |expected| so far (when the rule needs it)
    first_differ: Worst | None = None
    first_special: Worst | None = None
    best: Worst | None = None  # largest score (float) or distance (int) so far
    shape: tuple[int, ...] = ()  # the array's, for rules that judge it whole
    figure: float | None = None  # the rule's own figure: the largest over the chunks
    note: str = ""  # the rule's note: the first chunk's that has one

    def add(self, start: int, a: np.ndarray, e: np.ndarray) -> None:
        """Fold in one chunk: `a`, `e` flat (the actual and expected sides), their first
        element at flat index `start`."""
        if self.kind == "float" and self.scale is None and self.tol.rule.needs_scale():
            self.scale_max = max(self.scale_max, _max_finite_abs(e))
        bits_a, bits_e = _flat_bits(a), _flat_bits(e)
        if _same_bytes(bits_a, bits_e):
            return  # the common case, at memory speed: no mask, no index
        differ = _differ_mask(bits_a, bits_e)
        idx = np.flatnonzero(differ)
        if idx.size == 0:
            return
        self.n_differ += int(idx.size)
        if self.first_differ is None:
            i = int(idx[0])
            self.first_differ = Worst(start + i, a[i], e[i])
        if self.kind == "float" and not self.tol.rule.elementwise:
            # The rule judges the array as a whole: every element, in one chunk.
            self._add_float(start, np.arange(a.size), a, e, differ, self.shape)
            return
        a_d, e_d = a[idx], e[idx]
        if self.kind == "float":
            self._add_float(start, idx, a_d, e_d, np.ones(idx.size, bool), (idx.size,))
        elif self.kind == "int":
            self._add_int(start, idx, a_d, e_d)
        else:
            self.n_violating += int(idx.size)
            with np.errstate(all="ignore"):
                try:
                    m = float(np.max(np.abs(a_d - e_d)))
                except TypeError:
                    self.max_abs = None
                else:
                    if self.max_abs is not None:
                        self.max_abs = max(self.max_abs, m)

    def _add_float(
        self,
        start: int,
        idx: np.ndarray,
        a_d: np.ndarray,
        e_d: np.ndarray,
        differ: np.ndarray,
        shape: tuple[int, ...],
    ) -> None:
        a64, e64 = to_float64(a_d), to_float64(e_d)
        finite = np.isfinite(a64) & np.isfinite(e64)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if finite.all():  # the common case, without the masking passes
                special = np.zeros(finite.shape, bool)
                diff = np.abs(a64 - e64)
                abs_e = np.abs(e64)
                ulp = ordinal_distance(a_d, e_d)
            else:
                # Outside the finite pairs only equal infs and NaN against NaN are in place.
                special = ~finite & ~(np.isnan(a64) & np.isnan(e64)) & (a64 != e64)
                diff = np.where(finite, np.abs(a64 - e64), 0.0)
                abs_e = np.where(finite, np.abs(e64), 0.0)
                ulp = np.where(finite, ordinal_distance(a_d, e_d), np.uint64(0))
            rel = np.where(diff == 0, 0.0, diff / abs_e)
        self.max_abs = max(cast(float, self.max_abs), float(diff.max()))
        self.max_rel = max(self.max_rel, float(rel.max()))
        self.max_ulp = max(self.max_ulp, int(ulp.max()))
        elements = Elements(differ, finite, special, diff, abs_e, ulp, a64, e64, shape)
        scale = self.scale if self.scale is not None else Scale(self.dtype, 0.0)
        judgement = self.tol.rule.judge(elements, scale)
        self.n_violating += int(np.count_nonzero(judgement.violating))
        if judgement.figure is not None:
            self.figure = max(judgement.figure, self.figure or 0.0)
        self.note = self.note or judgement.note
        n_special = int(np.count_nonzero(special))
        if n_special:
            if self.first_special is None:
                i = int(np.argmax(special))
                self.first_special = Worst(
                    start + int(idx[i]), a_d[i], e_d[i], _scalar(a64[i]), _scalar(e64[i])
                )
            self.n_special += n_special
        score = judgement.score
        if score is None:
            return
        i = int(np.argmax(score))
        top = float(score[i])
        # Strictly larger: on a tie the earlier chunk keeps it, as argmax over the whole does.
        if top > 0 and (self.best is None or top > self.best.score):
            detail = self.tol.rule.detail(judgement, elements, i)
            self.best = Worst(
                start + int(idx[i]), a_d[i], e_d[i], _scalar(a64[i]), _scalar(e64[i]), detail, top
            )

    def _add_int(self, start: int, idx: np.ndarray, a_d: np.ndarray, e_d: np.ndarray) -> None:
        ia = a_d.astype(np.uint64 if self.dtype.kind == "u" else np.int64)
        ie = e_d.astype(ia.dtype)
        # Modular uint64 subtraction of the smaller from the larger is exact for any pair.
        ua, ue = ia.view(np.uint64), ie.view(np.uint64)
        dist = np.where(ia >= ie, ua - ue, ue - ua)
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(dist == 0, 0.0, dist.astype(np.float64) / np.abs(ie.astype(np.float64)))
        self.n_violating += int(idx.size)
        self.max_abs = max(cast(float, self.max_abs), float(dist.max()))
        self.max_rel = max(self.max_rel, float(rel.max()))
        i = int(np.argmax(dist))
        top = float(dist[i])
        if self.best is None or top > self.best.score:
            if self.dtype.kind == "b":
                va, ve = bool(a_d[i]), bool(e_d[i])
            else:
                va, ve = _scalar(a_d[i]), _scalar(e_d[i])
                if not isinstance(va, int):
                    va, ve = int(ia[i]), int(ie[i])
            self.best = Worst(start + int(idx[i]), a_d[i], e_d[i], va, ve, "", top)

    def final_scale(self, expected_dtype: np.dtype[Any]) -> Scale:
        if self.scale is not None:
            return self.scale
        return Scale(expected_dtype, self.scale_max)

    def worst(self) -> tuple[Worst, bool]:
        """The element the finding names, and whether it is a NaN/inf position mismatch."""
        assert self.first_differ is not None
        if self.kind == "float":
            if self.first_special is not None and self.tol.rule.tolerant:
                return self.first_special, True
            if self.best is not None:
                return self.best, False
            w = self.first_differ
            w.actual_value, w.expected_value = (
                _scalar(to_float64(np.asarray([w.actual]))[0]),
                _scalar(to_float64(np.asarray([w.expected]))[0]),
            )
            return w, False
        if self.kind == "int":
            assert self.best is not None
            return self.best, False
        w = self.first_differ
        w.actual_value, w.expected_value = _scalar(w.actual), _scalar(w.expected)
        return w, False


def scan_scale(expected: Source, blocks: Sequence[Block]) -> Scale:
    """The expected side's `Scale` from a pass over its blocks (for rules that judge with it)."""
    m = 0.0
    for block in blocks:
        m = max(m, _max_finite_abs(expected.read(block)))
    return Scale(expected.dtype, m)
