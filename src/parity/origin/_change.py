"""What kind of change the origin is (issue 58): the operation of the new program that
first computes what the base never did, held against *its counterpart*, the base's
operation that plays its part.

**Pairing.** Operations are paired by what a refactor or an edit rarely moves: the
primitive, the file's name and the function they run in (and, for an operation inside an
installed library, the library's file name and function as well), and their rank among
the operations of that primitive there (the third `mul` run in `rms_norm`, counted over
every call). Line numbers are left out, so an edit that shifts the lines below it
still pairs them; a rank that the base has not (a step added) pairs with nothing. Where a
refactor moved or renamed the function, nothing pairs, and the origin says only where it
is, as before.

**Kinds,** asked in this order of the origin and its counterpart:

- `constant`: an operand written into the program as a literal (`1e-05`) differs from the
  counterpart's, or an array the program closed over differs from every array of the
  base's: both values are said. A module-level constant reaches a program so.
- `edge`: the operation reads a value that is not the one its counterpart read (a step
  removed or added before it, a read rewired, two arguments swapped): both values' places
  are said, the one read and the one the base read. Where both were made inside a call
  the operation's own function made, and the callee gave one out where the base's gave
  the other (its last step removed: `return x` for `return norm(x)`), the edit is in the
  innermost function both were made under (`Change.edit`), not at the operation.
- `dtype`: a cast added, dropped or made to another type: the operation computes in, or
  reads, another dtype than its counterpart (operations pair across dtypes). Said with
  both dtypes and the cast's place: the new program's cast (added or changed) is where
  the edit is (`Change.edit`); a cast the base made and the tree does not is named at
  the base's place.
- `input`: it reads an input of the recorded programs that differs from the base's (made
  on the host, outside the programs: a key drawn in a Python loop, data loaded).
- `operation`: its operands are the counterpart's, and it computes another result (or the
  base has no such operation here): the operation itself changed.

Nothing here imports jax.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from parity.origin._recording import Recording, Value

__all__ = ["CHANGES", "Change", "change_of", "counterparts", "edited", "frame_parts"]

#: The kinds of change an origin can be (the module docstring), and the words for each.
CHANGES = {
    "constant": "a changed constant",
    "dtype": "a changed dtype",
    "edge": "a changed edge",
    "input": "a changed input",
    "operation": "a changed operation",
}


@dataclass(frozen=True)
class Change:
    """The kind of change at an origin (`CHANGES`; "" where none can be said) and what it
    is, in one clause; for an edge chosen inside a callee (the module docstring), `edit`,
    the new program's frame (`file:line in function`) in the function that holds the edit,
    and `read`, the id of the value it gives out; else "" and -1. `constants`, for a
    changed constant, the new program's as recorded first, then the base's ("none" where
    one has none); `dtypes`, for a changed dtype, the new program's and the base's; `places`
    and `base_places`, the frames the clause names in each program
    (filled in by the caller that words them: `parity.origin._align.Alignment.change`)."""

    kind: str
    detail: str
    edit: str = ""
    read: int = -1
    constants: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    places: tuple[str, ...] = ()
    base_places: tuple[str, ...] = ()


def frame_parts(frame: str) -> tuple[str, int, str]:
    """A chain's frame `file:line in function` as (file, line, function)."""
    place, _, function = frame.partition(" in ")
    file, _, line = place.rpartition(":")
    return file, int(line) if line.isdigit() else 0, function


def _function(frame: str) -> tuple[str, str]:
    file, _, function = frame_parts(frame)
    return Path(file).name, function


def _parting(read: Value, was: Value, v: Value) -> int:
    """The index in `read`'s chain of its frame in the innermost function that `was` was
    made under too, where that frame is a callee's of `v`'s own function (`v`'s function
    is further out in `read`'s chain): the callee chose which value to give out, and the
    edit is there. -1 where the two values part in `v`'s own function or nowhere."""
    theirs = {_function(f) for f in was.chain}
    mine = [_function(f) for f in read.chain]
    own = (Path(v.file).name, v.function)
    for k, f in enumerate(mine):
        if f in theirs:
            return k if f != own and own in mine[k + 1 :] else -1
    return -1


def _place_key(v: Value) -> tuple[str, ...]:
    """What pairs an operation: its primitive, the user's file name and function, and,
    inside an installed library, the library's file name and function (optax's adam
    update: its own operations pair among themselves however many the user's function
    runs around them)."""
    library = _function(v.library) if v.library else ("", "")
    return v.primitive, Path(v.file).name, v.function, *library


def counterparts(new: Recording, old: Recording) -> dict[int, int]:
    """New value id -> the id of the base's operation that plays its part (module
    docstring), for each operation of `new` that has one."""
    ranks: dict[tuple[str, ...], list[int]] = {}
    for v in old.values:
        if v.kind in ("op", "move"):
            ranks.setdefault(_place_key(v), []).append(v.id)
    seen: dict[tuple[str, ...], int] = {}
    out: dict[int, int] = {}
    for v in new.values:
        if v.kind not in ("op", "move"):
            continue
        k = _place_key(v)
        rank = seen[k] = seen.get(k, -1) + 1
        olds = ranks.get(k, [])
        if rank < len(olds):
            c = old.values[olds[rank]]
            if c.shape == v.shape:  # another dtype is a change of its own (`_cast`)
                out[v.id] = c.id
    return out


def edited(
    new: Recording,
    old: Recording,
    i: int,
    pairs: Mapping[int, int],
    same: Callable[[int, int], bool],
) -> int:
    """Where the edit is, from the first value `i` that equals none of the base's: back up
    through each operand that is not its counterpart's operand while that operand is not
    its own counterpart's value either, though it equals some other value of the base's (a
    key folded with step 1 at step 0: every value made from it is the base's value of
    step 1, and only where it meets a value of step 0 does one equal nothing). The walk
    ends at the operation that reads what its counterpart did not: the edit."""
    seen: set[int] = set()
    while i not in seen:
        seen.add(i)
        c = pairs.get(i)
        if c is None:
            return i
        v, cv = new.values[i], old.values[c]
        if len(v.inputs) != len(cv.inputs) or dict(v.literals) != dict(cv.literals):
            return i
        moved = [a for a, b in zip(v.inputs, cv.inputs, strict=True) if not same(a, b)]
        if not moved:
            return i
        a = moved[0]
        pa = pairs.get(a)
        if pa is None or new.values[a].kind not in ("op", "move") or same(a, pa):
            return i
        i = a
    return i


def change_of(
    new: Recording,
    old: Recording,
    i: int,
    pairs: Mapping[int, int],
    same: Callable[[int, int], bool],
    where: Callable[[Value | str, bool], str],
    matched: Callable[[int], bool],
) -> Change:
    """The kind of change value `i` of `new` is, against its counterpart in `old`.

    **Arguments:** `pairs`, what `counterparts` returned for the two recordings;
    `same(new_id, old_id)`, whether a new value is the old one (within the matching
    tolerance); `where(value, is_old)`, a value's place (or a chain's frame) in words;
    `matched(new_id)`, whether a new value matched any of the base's.
    """
    v = new.values[i]
    for a in v.inputs:  # a constant or an input no value of the base's equals
        read = new.values[a]
        if read.kind in ("const", "input") and not matched(a):
            return _unequalled(read)
    counterpart = pairs.get(i)
    if counterpart is None:
        return _unpaired(old, v, set(pairs.values()), same, where)
    c = old.values[counterpart]
    cast = _cast(new, old, v, c, where)
    if cast is not None:
        return cast
    mine, theirs = dict(v.literals), dict(c.literals)
    for k in sorted(set(mine) | set(theirs)):
        if mine.get(k) != theirs.get(k):
            now, then = mine.get(k, "none"), theirs.get(k, "none")
            return Change(
                "constant", f"its constant {now} where the base had {then}", constants=(now, then)
            )
    if len(v.inputs) == len(c.inputs):
        for a, b in zip(v.inputs, c.inputs, strict=True):
            if same(a, b):
                continue
            read, was = new.values[a], old.values[b]
            if read.kind == was.kind == "input" and _number(new, read) == _number(old, was):
                now, then = dict(read.literals).get(-1), dict(was.literals).get(-1)
                held = f"{now} where the base's was {then}" if now and then else "other numbers"
                return Change(
                    "input",
                    f"its input {_number(new, read)} of the programs ({read.dtype}"
                    f"{list(read.shape)}, made on the host) holds {held}",
                )
            k = _parting(read, was, v)
            if k >= 0:
                return _given_out(new, old, v, read, was, k, where)
            return Change(
                "edge",
                f"it reads {_made(new, read, where(read, False))}, where the base read "
                f"{_made(old, was, where(was, True))}",
            )
    else:
        return Change(
            "edge",
            f"it reads {len(v.inputs)} values where the base's {c.primitive} read {len(c.inputs)}",
        )
    if v.kind == "move":  # a slice, gather or reshape of the same operands: another part
        return Change(
            "edge",
            f"it reads another part of the same operand than the base's {c.primitive} read "
            f"({where(c, True)})",
        )
    return Change("operation", "its operands are the base's, its result is not")


def _given_out(
    new: Recording,
    old: Recording,
    v: Value,
    read: Value,
    was: Value,
    k: int,
    where: Callable[[Value | str, bool], str],
) -> Change:
    """An edge chosen inside a callee (`_parting`: the `k`th frame of `read`'s chain): the
    callee gives out `read` where the base's gave `was`, both with their places, and the
    base's call in that function where `was` was made further in; `v` reads it."""
    fn = _function(read.chain[k])
    calls = [f for f in was.chain if _function(f) == fn]
    call = calls[0] if calls else ""
    via = f", called from {where(call, True)}" if call and call != was.chain[0] else ""
    return Change(
        "edge",
        f"{fn[1]} gives out {_made(new, read, where(read, False))}, where the base's gave "
        f"{_made(old, was, where(was, True))}{via}; the {v.primitive} at {where(v, False)} "
        "reads it",
        edit=read.chain[k],
        read=read.id,
    )


def _unequalled(read: Value) -> Change:
    """The change of an operation that reads a constant or an input of the programs equal
    to none of the base's."""
    shape = f"{read.dtype}{list(read.shape)}"
    numbers = dict(read.literals).get(-1)
    shown = f" {numbers}" if numbers else ""
    if read.kind == "const":
        held = f"it reads a constant {shape}{shown} the program holds, equal to none of the base's"
        return Change("constant", held, constants=(numbers,) if numbers else ())
    return Change(
        "input",
        f"it reads an input of the programs ({shape}{shown}) equal to none of the base's: made "
        "on the host, outside the programs recorded",
    )


def _unpaired(
    old: Recording,
    v: Value,
    paired: set[int],
    same: Callable[[int, int], bool],
    where: Callable[[Value | str, bool], str],
) -> Change:
    """The kind of change of an operation the base has no counterpart of: another
    operation in its place (one of the base's in the same function, of its shape, on the
    same operands: `sin` where the base ran `tanh`), else a step the base does not take
    where the base runs that function, else none said (the function is not the base's:
    code moved or renamed, which the pairing cannot follow)."""
    if v.primitive == _CAST:
        return _cast_added(v, where)
    here = [
        c
        for c in old.values
        if c.kind == "op" and (Path(c.file).name, c.function) == (Path(v.file).name, v.function)
    ]
    if not here:
        return Change("", "")
    for c in here:  # `paired`: the base's operations some new one pairs with
        if c.id in paired or (c.shape, c.dtype) != (v.shape, v.dtype):
            continue
        if len(c.inputs) == len(v.inputs) and all(
            same(a, b) for a, b in zip(v.inputs, c.inputs, strict=True)
        ):
            return Change(
                "operation",
                f"{v.primitive} where the base ran {c.primitive} (at {where(c, True)}) on the "
                "same operands",
            )
    constant = _place_constant(old, v)
    if constant is not None:
        return constant
    constants = f" (with the constant {', '.join(x for _, x in v.literals)})" if v.literals else ""
    return Change(
        "edge",
        f"a step the base does not take: it runs no {v.primitive}{constants} here in {v.function}",
        constants=tuple(x for _, x in v.literals),
    )


def _place_constant(old: Recording, v: Value) -> Change | None:
    """A changed constant of an operation that pairs with none by rank (a refactor changed
    how often its place runs: optax's adam update over leaves stacked otherwise): the
    base's operations of its primitive at its place (`_place_key`) hold other constants at
    its operand's position, and none holds its own."""
    here = [c for c in old.values if c.kind in ("op", "move") and _place_key(c) == _place_key(v)]
    for position, mine in v.literals:
        theirs = sorted({x for c in here for k, x in c.literals if k == position})
        if theirs and mine not in theirs:
            said = ", ".join(theirs[:3]) + (" ..." if len(theirs) > 3 else "")
            return Change(
                "constant",
                f"its constant {mine} where the base's {v.primitive} here had {said}",
                constants=(mine, *theirs),
            )
    return None


def _made(recording: Recording, v: Value, place: str) -> str:
    """A value read, in words: what made it and where (an input by its number, counted
    from 1 in the order the programs take them)."""
    shape = f"{v.dtype}{list(v.shape)}"
    if v.kind in ("input", "const"):
        what = "input" if v.kind == "input" else "constant"
        return f"{what} {_number(recording, v)} of the programs ({shape})"
    return f"the {v.primitive} {shape} made at {place}"


def _number(recording: Recording, v: Value) -> int:
    """An input's (or a constant's) number among the programs' own, counted from 1."""
    return 1 + sum(1 for u in recording.values[: v.id] if u.kind == v.kind)


_CAST = "convert_element_type"


def _cast(
    new: Recording,
    old: Recording,
    v: Value,
    c: Value,
    where: Callable[[Value | str, bool], str],
) -> Change | None:
    """The `dtype` change of operation `v` against its counterpart `c`, where a dtype
    differs: a cast to another type than the base's, or an operand of another dtype than
    the base's (a cast added before it, or the base's cast not made); None where every
    dtype is the base's."""
    if v.dtype != c.dtype and v.primitive == c.primitive == _CAST:
        return Change(
            "dtype",
            f"it casts to {v.dtype} where the base cast to {c.dtype} (at {where(c, True)})",
            dtypes=(v.dtype, c.dtype),
        )
    if len(v.inputs) == len(c.inputs):
        for a, b in zip(v.inputs, c.inputs, strict=True):
            read, was = new.values[a], old.values[b]
            if read.dtype == was.dtype:
                continue
            if read.primitive == _CAST:
                said = f"the base's operand was {was.dtype}"
                if was.primitive == _CAST:
                    said = f"the base cast to {was.dtype} at {where(was, True)}"
                return Change(
                    "dtype",
                    f"a cast to {read.dtype} at {where(read, False)}, where {said}; the "
                    f"{v.primitive} at {where(v, False)} computes on it",
                    edit=read.chain[0] if read.chain else "",
                    read=read.id if read.chain else -1,
                    dtypes=(read.dtype, was.dtype),
                )
            if was.primitive == _CAST:
                return Change(
                    "dtype",
                    f"the base's cast to {was.dtype} at {where(was, True)} is not made: it "
                    f"reads the {read.primitive} {read.dtype}{list(read.shape)} as it is, in "
                    f"{read.dtype} where the base computed in {was.dtype}",
                    dtypes=(read.dtype, was.dtype),
                )
            return Change(
                "dtype",
                f"it reads {read.dtype} where the base read {was.dtype}",
                dtypes=(read.dtype, was.dtype),
            )
    if v.dtype != c.dtype:
        return Change(
            "dtype",
            f"it computes in {v.dtype} where the base computed in {c.dtype}",
            dtypes=(v.dtype, c.dtype),
        )
    return None


def _cast_added(v: Value, where: Callable[[Value | str, bool], str]) -> Change:
    """A cast the base has no counterpart of at its place: added."""
    return Change(
        "dtype",
        f"a cast to {v.dtype} at {where(v, False)} that the base does not make",
        dtypes=(v.dtype,),
    )
