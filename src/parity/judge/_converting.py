"""A group's goldens read through the user's own converter (issue 73): the function that
turns an old checkpoint into a refactor's layout (`q`, `k` and `v` fused into one `qkv`, a
kernel transposed, heads split out of a projection, layers stacked) says exactly where each
element of the new layout comes from, and computes nothing.

`probe(convert, layout)` runs the converter twice on stand-ins for the goldens (each golden
element replaced by its number, then by a random number), never on their values: what
it returns is where each element of each new key was read from, a `Conversion`. A
converter that computes (scales, adds, casts to a float) is refused there
(`ConvertError`), naming the new key and the element that is no golden element moved: the
second probe tells a move from arithmetic that happens to give a valid number.

The check then reads the tree in the goldens' layout (`Conversion.to_expected_layout`): each
golden key is rebuilt from the tree elements the converter put its elements in, so it is
judged under its own class, spread and baseline, in its forward order, and a failure names
it and its element, with where the tree holds that element (`Conversion.read_as`: "the
tree's element: `blocks.attn.qkv.weight[2, 5, 71]`"). A tree key that is not exactly the
converter's output (another shape, absent) is left as it is: its goldens are then missing,
and the report says so.

numpy only; the converter is the caller's own code (it may call jax).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from parity._errors import ParityError
from parity.judge._chunks import read_whole
from parity.judge._findings import Comparison
from parity.judge._trees import flatten

__all__ = [
    "Conversion",
    "ConvertError",
    "annotated",
    "concatenation_offer",
    "nested",
    "probe",
]

#: Golden key -> its shape, in the goldens' order: what a converter is probed with.
Layout = Mapping[str, Sequence[int]]


class ConvertError(ParityError, ValueError):
    """A converter that cannot be read as a move of the goldens (it computes, reads an
    element twice, raises, returns no tree of arrays): one line, what and where."""


def nested(flat: Mapping[str, Any], sep: str = ".") -> dict[str, Any]:
    """`{"a.b.c": x}` as `{"a": {"b": {"c": x}}}`: the keys split at their dots, as the
    producer's own tree was. Raises `ConvertError` where a key is both a leaf and a prefix
    of another key."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *path, leaf = key.split(sep)
        node = out
        for part in path:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConvertError(f"golden key {key!r} lies under the golden key {part!r}")
            node = child
        if leaf in node:
            raise ConvertError(f"golden key {key!r} is also the prefix of other golden keys")
        node[leaf] = value
    return out


@dataclass(frozen=True)
class Conversion:
    """Where each element of a converter's output was read from, as data.

    **Fields:** `sources` (each golden key and its shape, in the order their elements are
    numbered: a key's elements in row-major order after the previous key's), `maps` (each
    new key -> an integer array of its own shape: the number of the golden element each of
    its elements is). Made by `probe`; `to_arrays` and `from_arrays` carry it across the
    producer process's edge.
    """

    sources: tuple[tuple[str, tuple[int, ...]], ...]
    maps: Mapping[str, np.ndarray]
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sizes = [math.prod(shape) for _, shape in self.sources]
        object.__setattr__(self, "_starts", tuple(np.cumsum([0, *sizes]).tolist()))

    def to_expected_layout(self, tree: Mapping[str, Any]) -> dict[str, Any]:
        """`tree` (flat) in the goldens' layout: each golden key whose every element the
        converter put in a tree key that `tree` holds at the shape it returned, rebuilt
        from those elements, in the place of the first such tree key; the tree keys read so
        are gone, the others stay as they are."""
        whole = [
            k for k, m in self.maps.items() if k in tree and tuple(np.shape(tree[k])) == m.shape
        ]
        if not whole:
            return dict(tree)
        total, n_keys = self._starts[-1], len(self.sources)
        found = np.zeros(total, dtype=bool)
        feeds: dict[str, set[int]] = {}  # tree key -> the golden keys (by position) it holds
        # Every tree key's elements put where the converter read them from, in one flat
        # buffer per dtype (one pass over each tree key; a golden key is then a slice).
        buffers: dict[np.dtype, np.ndarray] = {}
        dtypes: dict[str, np.dtype] = {}
        for k in whole:
            m, values = self.maps[k].ravel(), read_whole(tree[k]).ravel()
            found[m] = True
            held = np.searchsorted(self._starts, m, side="right") - 1
            feeds[k] = set(np.flatnonzero(np.bincount(held, minlength=n_keys)).tolist())
            dtypes[k] = values.dtype
            buffers.setdefault(values.dtype, np.empty(total, values.dtype))[m] = values
        built: dict[str, np.ndarray] = {}
        placed: dict[str, list[str]] = {}  # the first tree key of a golden key -> the built
        for i, (key, shape) in enumerate(self.sources):
            lo, hi = self._starts[i], self._starts[i + 1]
            if hi == lo or not found[lo:hi].all():
                continue
            parts = [k for k in whole if i in feeds[k]]
            kinds = {dtypes[k] for k in parts}
            if len(kinds) == 1:
                built[key] = buffers[kinds.pop()][lo:hi].reshape(shape)
            else:  # parts of several dtypes: each element from its own part's buffer
                out = np.empty(hi - lo, dtype=np.result_type(*kinds))
                for k in parts:
                    m = self.maps[k].ravel()
                    mine = m[(m >= lo) & (m < hi)]
                    out[mine - lo] = buffers[dtypes[k]][mine]
                built[key] = out.reshape(shape)
            placed.setdefault(parts[0], []).append(key)
        done = {i for i, (key, _) in enumerate(self.sources) if key in built}
        consumed = {k for k in whole if feeds[k] & done}
        result: dict[str, Any] = {}
        for k, v in tree.items():
            if k in placed:
                result |= {g: built[g] for g in placed[k]}
            elif k not in consumed:
                result[k] = v
        return result

    def _span(self, key: str) -> tuple[int, int, tuple[int, ...]] | None:
        """Golden key `key`'s numbers, `[lo, hi)`, and its shape; None where it is none."""
        i = next((i for i, (k, _) in enumerate(self.sources) if k == key), None)
        if i is None:
            return None
        return self._starts[i], self._starts[i + 1], self.sources[i][1]

    def feeding(self, key: str) -> list[str]:
        """The new keys that hold the elements of golden key `key`, in the converter's
        order (empty where it places none of them)."""
        span = self._span(key)
        if span is None:
            return []
        lo, hi, _ = span
        return [k for k, m in self.maps.items() if ((m >= lo) & (m < hi)).any()]

    def read_as(self, key: str, index: Sequence[int] | None) -> str | None:
        """Where the tree holds element `index` of golden key `key`: `"qkv.weight[2, 5,
        71]"`; None where the converter does not place that key."""
        span = self._span(key)
        if span is None or index is None:
            return None
        lo, _, shape = span
        number = lo + (int(np.ravel_multi_index(tuple(index), shape)) if shape else 0)
        for new, m in self.maps.items():
            hit = np.flatnonzero(m.ravel() == number)
            if hit.size:
                at = np.unravel_index(int(hit[0]), m.shape) if m.shape else ()
                return f"{new}[{', '.join(str(int(x)) for x in at)}]"
        return None

    def to_arrays(self) -> dict[str, np.ndarray]:
        """As `np.savez` writes it (`from_arrays` reads it back)."""
        out = {
            "sources": np.array([k for k, _ in self.sources], dtype=np.str_),
            "ndim": np.array([len(s) for _, s in self.sources], dtype=np.int64),
            "shapes": np.array([d for _, s in self.sources for d in s], dtype=np.int64),
            "keys": np.array(list(self.maps), dtype=np.str_),
        }
        return out | {f"map.{i}": m for i, m in enumerate(self.maps.values())}

    @classmethod
    def from_arrays(cls, data: Mapping[str, np.ndarray]) -> Conversion:
        ndim, flat = data["ndim"].tolist(), data["shapes"].tolist()
        starts = np.cumsum([0, *ndim]).tolist()
        shapes = [tuple(flat[a:b]) for a, b in itertools.pairwise(starts)]
        sources = tuple(zip((str(k) for k in data["sources"]), shapes, strict=True))
        maps = {str(k): np.asarray(data[f"map.{i}"]) for i, k in enumerate(data["keys"])}
        return cls(sources, maps)


def _numbered(layout: Layout, order: np.ndarray) -> dict[str, np.ndarray]:
    """Each golden key's stand-in: its elements' numbers taken from `order` (views)."""
    out, start = {}, 0
    for key, shape in layout.items():
        n = math.prod(shape)
        out[key] = order[start : start + n].reshape(tuple(shape))
        start += n
    return out


def _run(convert: Callable[[dict[str, Any]], Any], stand_ins: dict[str, np.ndarray]) -> dict:
    try:
        converted = convert(nested(stand_ins))
    except ConvertError:
        raise
    except Exception as e:
        raise ConvertError(
            f"the converter raised {type(e).__name__} on the goldens' layout: "
            f"{' '.join(str(e).split())}"
        ) from e
    try:
        return flatten(converted)
    except (TypeError, ValueError) as e:
        raise ConvertError(f"the converter returned no tree of arrays: {e}") from None


def probe(convert: Callable[[dict[str, Any]], Any], layout: Layout, *, seed: int = 0) -> Conversion:
    """What `convert` does to goldens of `layout` (golden key -> shape, in the goldens'
    order), as a `Conversion`: run on each golden element's number, then on a random
    number per element; an element of the output is a move where the second run put at its
    place the random number of the element the first run named.

    Raises `ConvertError` for a converter that computes (its output is no golden element
    moved: a sum, a scale, a cast to a float), reads one golden element into two places,
    raises, or returns no tree of arrays.
    """
    total = sum(math.prod(s) for s in layout.values())
    kind = np.int32 if total < 2**31 else np.int64  # numbers exact under jax's default too
    first = _run(convert, _numbered(layout, np.arange(total, dtype=kind)))
    # The second stand-in: a random number per element (a move carries each one where it
    # carries the element; arithmetic on them gives other numbers), cheaper than a shuffle.
    drawn = np.random.default_rng(seed).integers(0, np.iinfo(kind).max, total, dtype=kind)
    second = _run(convert, _numbered(layout, drawn))
    maps: dict[str, np.ndarray] = {}
    for key, a in first.items():
        b = second.get(key)
        if not np.issubdtype(a.dtype, np.integer) or b is None or b.shape != a.shape:
            raise ConvertError(
                f"the converter computes {key!r}: it returned {a.dtype} where a move of the "
                "goldens keeps their elements (refactor the converter into moves: "
                "concatenate, stack, reshape, transpose, index)"
            )
        numbers = a if a.dtype == kind else a.astype(kind)
        if numbers.size and (numbers.min() < 0 or numbers.max() >= total):
            moved = (numbers >= 0) & (numbers < total)
        else:
            moved = drawn[numbers] == b
        if not moved.all():
            at = np.unravel_index(int(np.flatnonzero(~moved.ravel())[0]), a.shape)
            raise ConvertError(
                f"the converter computes {key!r}: its element "
                f"[{', '.join(str(int(x)) for x in at)}] is no golden element moved (a "
                "converter may only move elements: concatenate, stack, reshape, transpose, "
                "index)"
            )
        maps[key] = numbers
    _read_once(maps, total)
    sources = tuple((k, tuple(int(d) for d in s)) for k, s in layout.items())
    return Conversion(sources, maps)


def _read_once(maps: Mapping[str, np.ndarray], total: int) -> None:
    """`ConvertError` naming the first place (in the converter's order) that reads a golden
    element a place before it read too: a pass of one flag per golden element, then, only
    where some element was read twice, the place found."""
    seen = np.zeros(total, dtype=bool)
    read = 0
    for m in maps.values():
        seen[m.ravel()] = True
        read += m.size
    if int(np.count_nonzero(seen)) == read:  # as many distinct elements as places
        return
    seen[:] = False
    for key, m in maps.items():
        flat = m.ravel()
        twice = seen[flat]
        if not twice.any():  # within this key: an element's first place is not a copy
            first = np.zeros(flat.size, dtype=bool)
            first[np.unique(flat, return_index=True)[1]] = True
            twice = ~first
        if twice.any():
            at = np.unravel_index(int(np.flatnonzero(twice)[0]), m.shape)
            raise ConvertError(
                f"the converter reads one golden element into two places (at {key!r}"
                f"[{', '.join(str(int(x)) for x in at)}]): a copy cannot be judged as the "
                "golden it copies"
            )
        seen[flat] = True


def annotated(comparison: Comparison, conversion: Conversion) -> Comparison:
    """`comparison` with each failure of a golden key the converter places saying where
    the tree holds the element it names ("the tree's element: `qkv.weight[2, 5, 71]`")."""
    findings = []
    for f in comparison.findings:
        where = None if f.passed else conversion.read_as(f.key, f.worst_index)
        if where is not None and f.reason:
            f = replace(f, reason=f"{f.reason}; the tree's element: {where}")
        findings.append(f)
    return replace(comparison, findings=tuple(findings))


def concatenation_offer(
    missing: Mapping[str, tuple[tuple[int, ...], str]],
    new: Mapping[str, tuple[tuple[int, ...], str]],
) -> dict[str, tuple[str, int]]:
    """The missing keys whose elements a new key holds exactly, by shapes and dtypes: each
    new key `P.<name>.<leaf>` whose shape is that of the missing keys `P.<other>.<leaf>`
    (of its dtype, two or more, in their order) concatenated on one axis (q, k and v fused
    into `qkv`). **Returns:** missing key -> `(new key, axis)`."""
    out: dict[str, tuple[str, int]] = {}
    for key, (shape, dtype) in new.items():
        parent, _, rest = key.rpartition(".")
        prefix, _, _ = parent.rpartition(".")
        if not prefix:
            continue
        parts = [
            k
            for k, (s, d) in missing.items()
            if k not in out
            and d == dtype
            and k.startswith(prefix + ".")
            and k.endswith("." + rest)
            and k.count(".") == key.count(".")
            and len(s) == len(shape)
        ]
        if len(parts) < 2:
            continue
        shapes = [missing[k][0] for k in parts]
        for axis in range(len(shape)):
            others = {s[:axis] + s[axis + 1 :] for s in shapes}
            joined = sum(s[axis] for s in shapes)
            if others == {shape[:axis] + shape[axis + 1 :]} and joined == shape[axis]:
                out |= dict.fromkeys(parts, (key, axis))
                break
    return out
