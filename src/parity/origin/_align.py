"""Align a new program's values to an old program's by value, and name the origin.

A new value *matches* when the old program computed a value of the same shape and dtype (or
a row of a stacked one: `old[i]` along the leading axis) within `rho * max|old|`
elementwise, with NaN, infinities and fill values (`finfo.min` as a mask's minus infinity:
`parity.origin._fingerprints.ordinary`) equal and in the same places; integers and bools
must be equal. A new value with two or more axes also matches when each of its rows matches
some old value or row (a stacked computation against one computation per row). A data
movement (`parity.origin._record.MOVES`: a reshape, slice, cast, a scan's rows) of matched
values is matched whatever its own numbers, but for one that arranges its operands into
something new (the registry's `ARRANGING`, `_primitives.py`: a concatenation, pad, gather,
reversal), which must match by value. `rho`, the *matching tolerance*, comes from the class
of the output key being explained (`matching_tolerance`; docs/design.md, "Where it
diverged").

Candidates are found by fingerprint (`parity.origin._fingerprints`): the old values and rows
are indexed by shape and dtype; equal bytes are found by digest, and otherwise only old
values whose largest magnitude and block statistics lie within the tolerance are compared
element by element (where the old recording kept its arrays; a summary is matched on the
fingerprints alone).

The *origin* of an output that does not match: among the unmatched values from which that
output is reached through unmatched values only, the earliest in dataflow order.

This module imports numpy and the judge only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from parity.judge._classes import ToleranceClass
from parity.judge._fixed_rules import Bitwise
from parity.judge._floats import largest_finite_abs
from parity.judge._rule_base import Scale
from parity.judge._ulp import is_float_dtype, spacing_at, to_float64
from parity.origin._change import Change, change_of, counterparts, edited, frame_parts
from parity.origin._fingerprints import Fingerprint, Prints, ordinary
from parity.origin._origin import Origin
from parity.origin._places import relative
from parity.origin._primitives import ARRANGING
from parity.origin._record import LocaliseError
from parity.origin._recording import Recording, Value

__all__ = ["Alignment", "Origin", "align", "matching_tolerance"]

Key = tuple[tuple[int, ...], str]
Ref = tuple[int, int]  # (old value id, row; -1 for the whole value)


def matching_tolerance(tol: ToleranceClass, old_output: Any) -> float:
    """`rho`: the share of an old value's largest magnitude by which a new value may differ
    from it and still match, derived from the class an output is judged by.

    **Arguments:**

    - `tol`: the output key's tolerance class.
    - `old_output`: the old program's value of that key.

    **Returns:** 0 for `bitwise` and for non-float outputs (values must then be equal);
    otherwise what the class allows at the output's scale `M = max|old_output|` divided by
    `M`: `atol/M + rtol` for `close`, `k` for `relative_to_max`, `n * ulp(M)/M` for `ulp`.
    Where `M` is 0 the allowance itself. Raises `LocaliseError` for a rule that bounds
    neither `|a-b|` nor ulps (`logit_kl`) or misses a parameter.
    """
    rule = tol.rule
    golden = np.asarray(old_output)
    if isinstance(rule, Bitwise) or not is_float_dtype(golden.dtype):
        return 0.0
    scale = largest_finite_abs(to_float64(golden))
    try:
        allowed = rule.bound(Scale(golden.dtype, scale))
    except ValueError as e:
        raise LocaliseError(f"class {tol.name!r} gives no bound here: {e}") from None
    if rule.unit == "ulp":
        allowed *= spacing_at(scale, golden.dtype)
    elif rule.unit != "abs":
        raise LocaliseError(
            f"class {tol.name!r} judges in {rule.unit!r}, not |a-b| or ulps, so no matching "
            "tolerance follows from it: pass localise a class map giving this key a close, "
            "relative_to_max or ulp class"
        )
    return float(allowed / scale) if scale > 0 else float(allowed)


class _Bucket:
    """Old values (and rows) of one shape and dtype, with their fingerprints as arrays."""

    def __init__(self, refs: list[Ref], prints: Prints):
        self.refs = refs
        self.digest = prints.digest
        self.special = prints.special
        self.max_abs = prints.max_abs
        self.stats = prints.stats


def _index(old: Recording) -> dict[Key, _Bucket]:
    found: dict[Key, tuple[list[Ref], list[Fingerprint | Prints]]] = {}
    for v, fp in zip(old.values, old.fingerprints, strict=True):
        refs, prints = found.setdefault((v.shape, v.dtype), ([], []))
        refs.append((v.id, -1))
        prints.append(fp)
        rows = old.rows.get(v.id)
        if rows:  # a value's rows, as the arrays the recording holds them in
            refs, prints = found.setdefault((v.shape[1:], v.dtype), ([], []))
            refs.extend((v.id, r) for r in range(len(rows)))
            prints.append(rows)
    return {key: _Bucket(refs, _joined(prints)) for key, (refs, prints) in found.items()}


def _joined(items: list[Fingerprint | Prints]) -> Prints:
    """Fingerprints and rows' `Prints`, in order, as one `Prints`."""
    parts: list[Prints] = []
    loose: list[Fingerprint] = []
    for item in items:
        if isinstance(item, Fingerprint):
            loose.append(item)
            continue
        if loose:
            parts.append(Prints.of(loose))
            loose = []
        parts.append(item)
    if loose or not parts:
        parts.append(Prints.of(loose))
    return Prints.joined(parts)


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| over ordinary elements (`ordinary`); inf when the others (NaN,
    infinities, fill values) differ in place or value."""
    a64, b64 = to_float64(a), to_float64(b)
    fa, fb = ordinary(a64, a.dtype), ordinary(b64, b.dtype)
    if not np.array_equal(fa, fb) or not np.array_equal(a64[~fa], b64[~fb], equal_nan=True):
        return float("inf")
    return float(np.abs(a64[fa] - b64[fb]).max()) if fa.any() else 0.0


class _Matcher:
    def __init__(self, new: Recording, old: Recording, rho: float):
        self.new, self.old, self.rho = new, old, rho
        self.index = _index(old)

    def old_array(self, ref: Ref) -> np.ndarray | None:
        if self.old.arrays is None:
            return None
        whole = self.old.arrays[ref[0]]
        return whole if ref[1] < 0 else whole[ref[1]]

    def find(
        self,
        key: Key,
        fp: Fingerprint,
        array: np.ndarray | None,
        accept: Callable[[Ref], bool] = lambda ref: True,
    ) -> Ref | None:
        """The first old value or row (in dataflow order) that `accept`s and that the new
        value (`fp`, `array`) matches, or None."""
        bucket = self.index.get(key)
        if bucket is None:
            return None
        same = bucket.digest == np.uint64(fp.digest)
        tolerant = self.rho > 0 and is_float_dtype(np.dtype(key[1]))
        tau = self.rho * bucket.max_abs
        near = same.copy()
        if tolerant:
            slack = 1e-12 * (1.0 + np.maximum(bucket.max_abs, fp.max_abs))
            close = (bucket.special == np.uint64(fp.special)) & (
                np.abs(bucket.max_abs - fp.max_abs) <= tau + slack
            )
            close &= (np.abs(bucket.stats - fp.stats) <= (tau + slack)[:, None]).all(axis=1)
            near |= close
        for c in np.flatnonzero(near):
            ref = bucket.refs[c]
            if not accept(ref):
                continue
            other = self.old_array(ref)
            if other is None or array is None:
                return ref
            if same[c] and other.tobytes() == array.tobytes():
                return ref
            if tolerant and _max_diff(array, other) <= tau[c]:
                return ref
        return None

    def matches(self, v: Value) -> bool:
        array = None if self.new.arrays is None else self.new.arrays[v.id]
        if self.find((v.shape, v.dtype), self.new.fingerprints[v.id], array) is not None:
            return True
        rows = self.new.rows.get(v.id)
        if not rows:
            return False
        # A stacked value against one old value per row: row r matches a whole old value or
        # row r of a stacked one, in dataflow order, so that shifted or reordered rows
        # (a mask moved by one diagonal) do not match.
        last = (-1, -1)
        for r, fp in enumerate(rows):
            found = self.find(
                (v.shape[1:], v.dtype),
                fp,
                None if array is None else array[r],
                lambda ref, r=r, last=last: ref[1] in (-1, r) and ref > last,
            )
            if found is None:
                return False
            last = found
        return True

    def is_value(self, v: Value, old_id: int) -> bool:
        """Whether new value `v` matches old value `old_id` itself (whole)."""
        array = None if self.new.arrays is None else self.new.arrays[v.id]
        fp = self.new.fingerprints[v.id]
        found = self.find((v.shape, v.dtype), fp, array, lambda ref: ref == (old_id, -1))
        return found is not None

    def nearest(self, v: Value) -> float | None:
        bucket = self.index.get((v.shape, v.dtype))
        if bucket is None or not len(bucket.refs):
            return None
        if self.old.arrays is not None and self.new.arrays is not None:
            mine = self.new.arrays[v.id]
            return min(_max_diff(mine, self.old_array(ref)) for ref in bucket.refs)  # type: ignore[arg-type]
        fp = self.new.fingerprints[v.id]
        gaps = np.maximum(
            np.abs(bucket.max_abs - fp.max_abs), np.abs(bucket.stats - fp.stats).max(1)
        )
        return float(gaps.min())


@dataclass(frozen=True)
class Alignment:
    """The new program's values against the old program's.

    **Fields:** `matched` (`[n_values]` bool, by value id of the new recording),
    `matched_fraction` (the share of values, inputs aside, that matched), `rho`, `same_as`
    (whether a new value is an old one, where the caller knows better than by the new
    value's own numbers: a shadow replay's, on the base's values; None: by its numbers).
    """

    new: Recording
    old: Recording
    matched: np.ndarray
    matched_fraction: float
    rho: float
    same_as: Callable[[int, int], bool] | None = None

    def unmatched(self) -> list[Value]:
        """The new program's values that matched none of the old program's."""
        return [v for v in self.new.values if not self.matched[v.id]]

    def cone(self, key: str) -> set[int]:
        """The unmatched values from which output `key` is reached through unmatched values
        only (`key`'s own value among them); empty when that output matched."""
        if key not in self.new.outputs:
            raise LocaliseError(
                f"the new program has no output {key!r}; it has {list(self.new.outputs)}"
            )
        target = self.new.outputs[key]
        if target < 0 or self.matched[target]:
            return set()
        values = self.new.values
        reached, todo = {target}, [target]
        while todo:
            for i in values[todo.pop()].inputs:
                if not self.matched[i] and i not in reached:
                    reached.add(i)
                    todo.append(i)
        return reached

    def origin(self, key: str, *, root: str | Path | None = None) -> Origin | None:
        """The origin of output `key` of the new program (see the module docstring), or
        None when that output matched."""
        reached = self.cone(key)
        if not reached:
            return None
        values = self.new.values
        computed = [i for i in reached if values[i].kind in ("op", "move")]
        return self.describe(min(computed or reached), key, root=root)

    def has_old_peer(self, i: int) -> bool:
        """Whether the old program computed some value of value `i`'s shape and dtype (or
        a row of one): `i` is then a changed value, not one of a new kind."""
        return self._matcher.nearest(self.new.values[i]) is not None

    def change(self, i: int, *, root: str | Path | None = None) -> Change:
        """The kind of change value `i` of the new program is, against the base's operation
        that plays its part (`parity.origin._change`)."""

        named: dict[bool, list[str]] = {False: [], True: []}  # the frames worded, by side

        def where(v: Value | str, old: bool) -> str:
            file, line, function = (
                frame_parts(v) if isinstance(v, str) else (v.file, v.line, v.function)
            )
            file = _in_tree(file, root) if old else relative(file, root)
            if not file:
                return "<no source>"
            named[old].append(f"{file}:{line} in {function}")
            return named[old][-1]

        matched = self.matched
        change = change_of(
            self.new, self.old, i, self._counterparts, self._same, where, lambda a: bool(matched[a])
        )
        return replace(change, places=tuple(named[False]), base_places=tuple(named[True]))

    def edited(self, i: int) -> int:
        """Where the edit is, from the first value `i` that equals none of the base's
        (`parity.origin._change.edited`: back through values computed from other data than
        their counterparts')."""
        return edited(self.new, self.old, i, self._counterparts, self._same)

    def _same(self, a: int, b: int) -> bool:
        """Whether new value `a` is old value `b` (within the matching tolerance)."""
        if self.same_as is not None:
            return self.same_as(a, b)
        return self._matcher.is_value(self.new.values[a], b)

    def describe(self, i: int, key: str, *, root: str | Path | None = None) -> Origin:
        """Value `i` of the new program as the `Origin` of output `key`, with the kind of
        change it is."""
        values = self.new.values
        v = values[i]
        change = self.change(i, root=root)
        shown, file, line, function, chain, read_by = v, v.file, v.line, v.function, v.chain, ""
        if change.edit:  # chosen inside a callee: the value it gives out, at the edit
            shown = values[change.read]
            file, line, function = frame_parts(change.edit)
            chain = shown.chain[shown.chain.index(change.edit) :]
            read_by = f"{v.primitive} at {relative(v.file, root)}:{v.line} in {v.function}"
        return Origin(
            key=key,
            primitive=shown.primitive,
            file=relative(file, root),
            line=line,
            function=function,
            shape=shown.shape,
            dtype=shown.dtype,
            input_shapes=tuple(values[j].shape for j in shown.inputs),
            max_diff=self._matcher.nearest(v),
            matched_fraction=self.matched_fraction,
            position=v.id,
            rho=self.rho,
            library=shown.library if shown is v else "",
            change=change.kind,
            change_detail=change.detail,
            chain=tuple(_relative_frame(f, root) for f in chain),
            read_by=read_by,
            constants=change.constants,
            dtypes=change.dtypes,
            places=change.places,
            base_places=change.base_places,
        )

    @functools.cached_property
    def _matcher(self) -> _Matcher:
        return _Matcher(self.new, self.old, self.rho)

    @functools.cached_property
    def _counterparts(self) -> dict[int, int]:
        return counterparts(self.new, self.old)


def _relative_frame(frame: str, root: str | Path | None) -> str:
    """A frame `file:line in function` with its file relative to `root` where inside it."""
    if root is None:
        return frame
    prefix = f"{Path(root).resolve().as_posix()}/"
    return frame.removeprefix(prefix) if frame.startswith(prefix) else frame


def _in_tree(file: str, root: str | Path | None) -> str:
    """A file of the base's recording (in a worktree since removed) named as the file of
    `root` it is a copy of: the longest tail of its path that `root` holds; else as
    recorded."""
    if not file or root is None:
        return file
    parts = Path(file).parts
    for k in range(1, len(parts)):
        tail = Path(*parts[k:])
        if (Path(root) / tail).is_file():
            return tail.as_posix()
    return file


def align(new: Recording, old: Recording, rho: float) -> Alignment:
    """Match every value of `new` against the values of `old`.

    **Arguments:**

    - `new`, `old`: recordings (`parity.origin._record`); `old` may be a summary.
    - `rho`: the matching tolerance (`matching_tolerance`).

    **Returns:** the `Alignment`.
    """
    matcher = _Matcher(new, old, rho)
    matched = np.zeros(len(new.values), dtype=bool)
    for v in new.values:
        inherited = (
            v.kind == "move"
            and v.primitive not in ARRANGING
            and v.inputs
            and bool(matched[list(v.inputs)].all())
        )
        matched[v.id] = inherited or matcher.matches(v)
    counted: Sequence[int] = [v.id for v in new.values if v.kind != "input"]
    fraction = float(matched[counted].mean()) if counted else 1.0
    return Alignment(new, old, matched, fraction, rho)
