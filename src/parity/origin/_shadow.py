"""Proved up to rounding (issue 59): the new program run op by op, and each operation whose
result is not already one of the base's computed again on the *base's own values* (a
shadow replay), so that what a refactor reorders is judged one operation at a time, with
nothing carried over from the operations before it.

Each value of the new program gets a `Shade`: what it is on the base's values.

A key is *proved up to rounding* (`RoundingProof`) when its value on the base's values is
the base's same key: bit for bit, or within the rounding of the operations on its way.
Otherwise the first value on its way that equals none of the base's while it reads only
the base's values (or new intermediates of kinds the base has none of) is where the
refactor changed what is computed.

This module imports numpy and the origin's own modules; jax inside functions only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from parity.judge._ulp import is_float_dtype
from parity.origin._align import Alignment, align
from parity.origin._change import counterparts
from parity.origin._fingerprints import fingerprint, row_digests
from parity.origin._in_parts import LARGE, dot_in_parts
from parity.origin._interpreter import Interpreter, plain_dtype, to_host
from parity.origin._origin import Origin
from parity.origin._primitives import PLACING, Machine, model
from parity.origin._proof import upstream
from parity.origin._recording import Recording
from parity.origin._rounding import Fresh, allowed, grounded, part_of, split_part, stacked, within
from parity.origin._rounding_proof import ROUNDS, RoundingProof, coarsest, equal, place, recast

__all__ = ["Shade", "Shadow"]

#: How many of the base's values of a shape a fresh value is held against, nearest first
#: by their fingerprints' statistics.
CANDIDATES = 8


@dataclass
class Shade:
    """What one value of the new program is on the base's values: `same` (its own numbers
    are a value of the base's, bit for bit: most of a refactor); `exact` (computed on the
    base's values, a value of the base's, bit for bit); `rounded` (computed on the base's
    values, within that one operation's rounding of a value of the base's,
    `parity.origin._rounding`: from here the replay carries the base's value, so nothing
    propagates); `part` (the base's numbers moved, picked or stacked with no rounding);
    `fresh` (equal to none of the base's: a new intermediate, carried with its rounding
    model where its operation has one, or where the new program computes what the base
    never did); `differs` (an input of the programs that is the base's nowhere).

    **Fields:** `status`; `base` (the base's value it is, for `same`, `exact` and
    `rounded`; else -1); `array` (its numbers on the base's values, where they are not
    `base`'s own; None for an opaque value); `model` (its rounding model where `fresh`
    and modelled); `why` (for `fresh`, why it has no model); `margin` and `bound` (for
    `rounded`: the largest share of its allowed difference it used, and the largest
    difference allowed).
    """

    status: str
    base: int = -1
    array: np.ndarray | None = field(default=None, repr=False)
    model: Fresh | None = field(default=None, repr=False)
    why: str = ""
    margin: float = 0.0
    bound: float = 0.0
    #: The digest of its numbers (`_fingerprints.row_digests`), kept where they were let go
    #: (`Shadow.release`), for a later question whether it is a value of the base's.
    digest: int | None = None

    @property
    def grounded(self) -> bool:
        """Whether its numbers are the base's own (a value of the base's, or a part)."""
        return self.status in ("same", "exact", "rounded", "part")


class Shadow:
    """The shadow replay, told of each value by the interpreter that records the new
    program (`Interpreter(shadow=...)`), against `old`, the base's recording with its
    arrays (`record(..., keep_arrays=True)`), each operation bounded as `machine` computes it
    (default: this process's backend, where the replay runs: `Machine.here()`)."""

    def __init__(self, old: Recording, *, machine: Machine | None = None) -> None:
        if old.arrays is None:
            raise ValueError("a shadow replay needs the base's recording with its arrays")
        self.old = old
        self.machine = Machine.here() if machine is None else machine
        self.arrays = old.arrays
        self.shades: dict[int, Shade] = {}
        self.interpreter: Interpreter | None = None
        self._exact: Alignment | None = None
        #: The counterparts of the new recording's values (`_change.counterparts`), made once
        #: for every key `proofs` proves of it.
        self._pairs: tuple[Recording, dict[int, int]] | None = None
        self._digests: dict[tuple[Any, ...], int] = {}
        self._buckets: dict[tuple[Any, ...], list[int]] = {}
        for v, fp in zip(old.values, old.fingerprints, strict=True):
            self._digests.setdefault((v.shape, v.dtype, fp.digest), v.id)
            self._buckets.setdefault((v.shape, v.dtype), []).append(v.id)
        prints, buckets = old.fingerprints, self._buckets
        self._stats = {k: np.array([prints[b].stats for b in ids]) for k, ids in buckets.items()}

    def ground(self, i: int, x: Any) -> None:
        """An input of the programs or a constant they hold, value `i`."""
        b = self._own(i)
        if b >= 0:
            self.shades[i] = Shade("same", b)
            return
        host = to_host(x)
        v = self._values()[i]
        if v.kind == "input":
            self.shades[i] = Shade("differs", array=host, why="an input no value of the base's is")
            return
        # A constant the program holds is part of the program, as a literal is: exact
        # numbers, not a value the base computed; what reads it is judged.
        self.shades[i] = Shade("part", array=host)

    def op(self, eqn: Any, ins: Sequence[tuple[Any, int]], refs: Sequence[tuple[Any, int]]) -> None:
        """Equation `eqn` ran on `ins` and made `refs`."""
        own = [self._own(i) for _, i in refs]
        if all(b >= 0 for b in own):
            for (_, i), b in zip(refs, own, strict=True):
                self.shades[i] = Shade("same", b)
            return
        shades = [self._shade(x, j) for x, j in ins]
        if all(s.status == "same" or j < 0 for s, (_, j) in zip(shades, ins, strict=True)):
            # its operands are the base's values already (a literal is its own): its result
            results: list[np.ndarray | None] = [to_host(x) for x, _ in refs]
        else:
            results = self._rerun(eqn, ins, shades)
        for n, ((_, i), b, result) in enumerate(zip(refs, own, results, strict=True)):
            if b >= 0:
                self.shades[i] = Shade("same", b)
            else:
                self.shades[i] = self._judge(eqn, shades, result, n)

    def row(self, r: int, i: int, k: int) -> None:
        """Value `r` is row `k` of value `i` (a scan's `xs`)."""
        b = self._own(r)
        if b >= 0:
            self.shades[r] = Shade("same", b)
            return
        parent = self.shades.get(i, Shade("fresh", why="not replayed"))
        numbers = self._numbers(parent)
        row = None if numbers is None else numbers[k]
        fresh = parent.model
        part = None if fresh is None else part_of(fresh, lambda a: a[k])
        self.shades[r] = self._placed(row, parent.grounded, part, parent.why)

    def stack(self, r: int, parts: Sequence[tuple[Any, int]]) -> None:
        """Value `r` stacks `parts` (a scan's `ys`)."""
        b = self._own(r)
        if b >= 0:
            self.shades[r] = Shade("same", b)
            return
        shades = [self._shade(x, j) for x, j in parts]
        arrays = [self._numbers(s) for s in shades]
        numbers = None if any(a is None for a in arrays) else np.stack(arrays)  # type: ignore[arg-type]
        models = [self._model(s) for s in shades]
        joined = None
        if all(m is not None for m in models):
            joined = stacked([m for m in models if m is not None])
        why = next((s.why for s in shades if s.why), "")
        self.shades[r] = self._placed(numbers, all(s.grounded for s in shades), joined, why)

    def _rerun(
        self, eqn: Any, ins: Sequence[tuple[Any, int]], shades: Sequence[Shade]
    ) -> list[np.ndarray | None]:
        """`eqn` bound again on the base's values of its operands (None where one is
        opaque)."""

        operands = []
        for (x, _), s in zip(ins, shades, strict=True):
            if s.status == "same":
                operands.append(x)
                continue
            numbers = self._numbers(s)
            dtype = getattr(x, "dtype", None)
            if numbers is None or dtype is None:
                return [None] * len(eqn.outvars)
            operands.append(_as_operand(numbers, x))
        assert self.interpreter is not None  # it told this shadow of the operation
        outs = self.interpreter.executables.bind(eqn.primitive, operands, eqn.params)
        outs = outs if eqn.primitive.multiple_results else [outs]
        return [to_host(o) for o in outs]

    def _judge(self, eqn: Any, shades: Sequence[Shade], result: np.ndarray | None, n: int) -> Shade:
        """The shade of result `n` of `eqn` computed on the base's values."""
        name = eqn.primitive.name
        if result is None:
            said = (s.why for s in shades if s.why)
            why = next(said, f"{name} of a value that is not the base's")
            return Shade("fresh", why=why)
        b = self._base_of(result)
        if b >= 0:
            return Shade("exact", b)
        if all(s.grounded for s in shades) and self._exactly(name, shades, result):
            return Shade("part", array=result)
        if self._stacked(result):  # a stack of the base's values (a layout stacked per kind)
            return Shade("part", array=result)
        if name == "dot_general" and (modelled := self._in_parts(eqn, shades, result)):
            return self._rounded(result, modelled) or Shade("fresh", array=result, model=modelled)
        operands = [self._model(s) for s in shades]
        if any(m is None for m in operands):
            why = next((s.why for s in shades if s.model is None and s.why), "")
            return Shade("fresh", array=result, why=why or f"{name} of an unmodelled value")
        known = [m for m in operands if m is not None]
        if name == "split":  # several results: result n is a slice of the operand
            modelled = split_part(eqn.params, known[0], n)
        else:
            modelled = model(name, eqn.params, known, result.dtype, machine=self.machine)
        if modelled is None:
            if all(s.grounded for s in shades):  # a new value of the base's values: its bits
                return Shade("fresh", array=result, model=_as_given(result))
            return Shade("fresh", array=result, why=f"no rounding model for {name}")
        return self._rounded(result, modelled) or Shade("fresh", array=result, model=modelled)

    def release(self, i: int) -> None:
        """New value `i` is read by nothing more: its numbers and rounding model are let go
        (its status, the base's value it is and its margin stay, what a proof reads), so
        that the replay holds what the program holds, not every value it computed."""
        s = self.shades.get(i)
        if s is None or (s.array is None and s.model is None):
            return
        digest = None
        if s.array is not None and s.grounded:
            (digest,) = row_digests(s.array[None])
        self.shades[i] = dataclasses.replace(s, array=None, model=None, digest=digest)

    def _in_parts(self, eqn: Any, shades: Sequence[Shade], result: np.ndarray) -> Fresh | None:
        """A contraction with a large value of the base's modelled a part of it at a time
        (`parity.origin._in_parts`); None where neither operand is one."""
        numbers = [self._numbers(s) if s.grounded else None for s in shades]
        big = max((0, 1), key=lambda k: getattr(numbers[k], "size", 0))
        large = numbers[big]
        if large is None or large.size <= LARGE:  # the whole model, as for any operation
            return None
        other = self._model(shades[1 - big])
        if other is None:
            return None
        operands = (large, other) if big == 0 else (other, large)
        return dot_in_parts(eqn.params, operands, result.dtype, self.machine)

    def _stacked(self, result: np.ndarray) -> bool:
        """Whether every row of `result` (its leading index) is a value of the base's, bit
        for bit: the base computed each row on its own (per site, per layer)."""
        if result.ndim < 2 or result.shape[0] == 0:
            return False
        shape, dtype = tuple(result.shape[1:]), str(result.dtype)
        if (shape, dtype) not in self._buckets:
            return False
        return all((shape, dtype, d) in self._digests for d in row_digests(result))

    def _exactly(self, name: str, shades: Sequence[Shade], result: np.ndarray) -> bool:
        """Whether `name` computed `result` from its operands with no rounding
        (the registry's `PLACING`)."""
        if name in PLACING or not is_float_dtype(result.dtype):
            return True
        if name == "convert_element_type" and len(shades) == 1:
            operand = self._numbers(shades[0])
            if operand is not None and operand.shape == result.shape:
                with np.errstate(all="ignore"):
                    back = result.astype(operand.dtype)
                return bool(np.array_equal(back, operand, equal_nan=True))
        return False

    def _placed(
        self, numbers: np.ndarray | None, grounded_: bool, fresh: Fresh | None, why: str
    ) -> Shade:
        """The shade of a row or a stack: a value of the base's, a part of the base's
        numbers, or fresh with its model."""
        if numbers is None:
            return Shade("fresh", model=fresh, why=why or "an opaque value")
        b = self._base_of(numbers)
        if b >= 0:
            return Shade("exact", b)
        if grounded_:
            return Shade("part", array=numbers)
        rounded = None if fresh is None else self._rounded(numbers, fresh)
        return rounded or Shade("fresh", array=numbers, model=fresh, why=why)

    def _base_of(self, numbers: np.ndarray) -> int:
        """The base's value `numbers` are bit for bit (by the digest of their bytes); -1."""
        (digest,) = row_digests(numbers[None])
        return self._digests.get((tuple(numbers.shape), str(numbers.dtype), digest), -1)

    def _rounded(self, numbers: np.ndarray, fresh: Fresh) -> Shade | None:
        """`numbers`, modelled by `fresh`, as the first of the base's values of their shape
        (nearest first by statistics, `CANDIDATES` at most) that they lie within the rounding
        of; None where none (or not a float)."""
        if not is_float_dtype(numbers.dtype):
            return None
        key = (tuple(numbers.shape), str(numbers.dtype))
        ids = self._buckets.get(key, [])
        if len(ids) > CANDIDATES:  # fingerprint statistics only where there is a choice
            far = np.abs(self._stats[key] - fingerprint(numbers).stats).sum(axis=1)
            ids = [ids[j] for j in np.argsort(far, kind="stable")[:CANDIDATES]]
        for c in ids:
            ok, margin = within(self.arrays[c], fresh, numbers.dtype)
            if ok:
                return Shade("rounded", c, margin=margin, bound=_largest(fresh, numbers))
        return None

    def _values(self) -> list[Any]:
        assert self.interpreter is not None
        return self.interpreter.values

    def _own(self, i: int) -> int:
        """The base's value new value `i` is bit for bit, by its own fingerprint; else -1."""
        assert self.interpreter is not None
        v, fp = self.interpreter.values[i], self.interpreter.prints[i]
        return self._digests.get((v.shape, v.dtype, fp.digest), -1)

    def _shade(self, x: Any, j: int) -> Shade:
        if j < 0:  # a literal: the program's own constant, the same on both sides
            return Shade("part", array=np.asarray(x))
        return self.shades.get(j, Shade("fresh", why="a value the replay did not see"))

    def _numbers(self, s: Shade) -> np.ndarray | None:
        if s.array is not None:
            return s.array
        return self.arrays[s.base] if s.base >= 0 else None

    def _model(self, s: Shade) -> Fresh | None:
        if s.grounded:
            numbers = self._numbers(s)
            return None if numbers is None else grounded(numbers)
        return s.model

    def proofs(
        self,
        new: Recording,
        keys: Iterable[str] | None = None,
        *,
        root: str | Path | None = None,
    ) -> dict[str, RoundingProof]:
        """Each of `keys` (every output of `new` by default) proved up to rounding, or
        told why not, once `new` is recorded; places relative to `root` where inside it."""
        return {k: self._prove(new, k, root) for k in (new.outputs if keys is None else keys)}

    def _prove(self, new: Recording, key: str, root: str | Path | None) -> RoundingProof:
        if key not in new.outputs or key not in self.old.output_arrays:
            return RoundingProof(key, False, f"the two programs do not both output {key!r}")
        target, theirs = new.outputs[key], self.old.output_arrays[key]
        if target < 0:
            return RoundingProof(key, False, f"{key!r} is a literal of the new program")
        cone = sorted(upstream(new, target))
        shades = [self.shades.get(i, Shade("fresh", why="not replayed")) for i in cone]
        counts = {s: sum(1 for x in shades if x.status == s) for s in ("same", "exact", "fresh")}
        pairs = zip(cone, shades, strict=True)
        rounded = [(x.margin, i) for i, x in pairs if x.status == "rounded"]
        largest = ""
        if rounded:
            margin, i = max(rounded)
            bound = self.shades[i].bound
            largest = f"{place(new, i, root)}, {margin:.2g} of its bound {bound:.3g}"
        fresh = [i for i, x in zip(cone, shades, strict=True) if x.status == "fresh"]
        if fresh and (self._pairs is None or self._pairs[0] is not new):
            self._pairs = (new, counterparts(new, self.old))
        changed = recast(new, self.old, fresh, self._pairs[1]) if fresh and self._pairs else None
        if changed is not None:
            i, why = changed
            reason = f"{place(new, i, root)}, computed on the base's values, {why}"
            return RoundingProof(key, False, reason, origin=i)
        mine = self.shades.get(target, Shade("fresh"))
        if _answers(mine, self._numbers(mine), theirs):
            equal = counts["same"] + counts["exact"]
            rounds = [i for i, x in zip(cone, shades, strict=True) if x.status in ROUNDS]
            return RoundingProof(
                key,
                True,
                "",
                equal,
                len(rounded),
                counts["fresh"],
                largest,
                precision=coarsest(new, [*rounds, target]),
            )
        origin = self._origin(new, cone)
        shade = self.shades.get(origin, Shade("fresh"))
        what = "equals no value of the base's, nor any within its rounding"
        if shade.status == "differs":
            what = "is an input of the programs that no value of the base's is"
        elif shade.why:
            what += f" ({shade.why})"
        reason = f"{place(new, origin, root)}, computed on the base's values, {what}"
        return RoundingProof(key, False, reason, origin=origin)

    def origin(
        self, new: Recording, proof: RoundingProof, *, root: str | Path | None = None
    ) -> Origin | None:
        """The origin of a key not proved, with the kind of change it is
        (`parity.origin._change`), a value being the base's where its shade says so; None
        for a key proved."""
        if proof.proved or proof.origin < 0:
            return None
        if self._exact is None or self._exact.new is not new:  # one alignment per recording
            self._exact = dataclasses.replace(align(new, self.old, 0.0), same_as=self._is)
        exact = self._exact
        return exact.describe(exact.edited(proof.origin), proof.key, root=root)

    def _is(self, a: int, b: int) -> bool:
        """Whether new value `a`, on the base's values, is the base's value `b`."""
        s = self.shades.get(a)
        if s is None or not s.grounded:
            return False
        if s.base == b:
            return True
        if s.digest is not None:  # let go: the base's value by the digest of its numbers
            mine, theirs = self._values()[a], self.old.values[b]
            same_kind = (mine.shape, mine.dtype) == (theirs.shape, theirs.dtype)
            return same_kind and self.old.fingerprints[b].digest == s.digest
        numbers = self._numbers(s)
        return numbers is not None and equal(numbers, self.arrays[b])

    def _origin(self, new: Recording, cone: list[int]) -> int:
        """Where the key's way first computes what the base never did: the first value
        that equals none of the base's, of a shape the base has, while what it reads is the
        base's (or new intermediates of shapes the base has none of). A new intermediate
        that a later value on the way computes back into the base's (within rounding) is
        accounted for, not an origin: the halves of a sum split in two."""

        def known(i: int) -> bool:
            v = new.values[i]
            return (v.shape, v.dtype) in self._buckets

        shade = {i: self.shades.get(i, Shade("fresh")) for i in cone}
        back = {i for i in cone if shade[i].status in ("exact", "rounded")}
        for i in reversed(cone):  # a reader comes after what it reads
            if i in back:
                back.update(j for j in new.values[i].inputs if j in shade)
        loose = [i for i in cone if not shade[i].grounded and i not in back]
        for i in loose:
            if shade[i].status == "differs":
                return i
        for i in loose:
            v = new.values[i]
            if v.kind in ("op", "move") and known(i):
                reads = [self.shades.get(j, Shade("fresh")) for j in v.inputs]
                if all(s.grounded or not known(j) for s, j in zip(reads, v.inputs, strict=True)):
                    return i
        return loose[0] if loose else cone[-1]


def _as_operand(numbers: np.ndarray, like: Any) -> Any:
    """`numbers` as an operand of `like`'s dtype: a PRNG key array wrapped again from its
    key data (`to_host` kept the data)."""
    import jax
    import jax.numpy as jnp

    if plain_dtype(like.dtype):
        return jnp.asarray(numbers, dtype=like.dtype)
    return jax.random.wrap_key_data(jnp.asarray(numbers), impl=jax.random.key_impl(like))


def _answers(mine: Shade, numbers: np.ndarray | None, theirs: np.ndarray) -> bool:
    """Whether a key's shade is the base's same key: its numbers bit for bit, or within
    the rounding its model allows."""
    if numbers is not None and equal(numbers, theirs):
        return True
    if mine.status == "fresh" and mine.model is not None:
        return within(theirs, mine.model, theirs.dtype)[0]
    return False


def _largest(fresh: Fresh, result: np.ndarray) -> float:
    bound = allowed(fresh, result.dtype)
    return float(np.max(bound)) if bound.size else 0.0


def _as_given(result: np.ndarray) -> Fresh | None:
    return grounded(result) if is_float_dtype(result.dtype) else None
