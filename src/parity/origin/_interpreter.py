"""The interpreter behind `parity.origin._record`: a jaxpr run equation by equation with
each primitive's own `bind` (or walked for its shapes and dataflow only), every value kept
with its fingerprints, its depth and the user's frame that made it.

It descends into calls (`jit`, `closed_call`, `custom_jvp_call`, `custom_vjp_call`,
`checkpoint`), unrolls `scan` (each iteration's values are values of their own, and a row of
`xs` or the stacked `ys` is a data movement of them), runs `while` until its condition
fails, and takes a `cond`'s taken branch. Other higher-order primitives are bound whole.
Every value is tagged with the innermost frame of the user's own source (outside jax,
parity and installed libraries) and, where the operation runs inside an installed library,
that library's frame.

jax is imported inside these functions only (the caller has it).
"""

from __future__ import annotations

import collections
import hashlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from parity._errors import ParityError
from parity.origin._executables import Executables
from parity.origin._fingerprints import Fingerprint, Prints, value_fingerprints
from parity.origin._flushing import Flushing
from parity.origin._places import CHAIN_FRAMES, Where, frame_of
from parity.origin._primitives import CALLS, MOVES, WHOLE
from parity.origin._progress import Progress
from parity.origin._recording import Recording, Value

__all__ = ["MOVES", "Interpreter", "LocaliseError", "plain_dtype"]

_MAX_WHILE = 100_000


class LocaliseError(ParityError, ValueError):
    """A program cannot be recorded or two recordings cannot be aligned.

    **Fields:** `reason`, one line saying what was found and what to do.
    """

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


Ref = tuple[Any, int]  # (array, value id; -1 for a literal)
#: The most elements of an input or a constant whose numbers are kept in words.
SMALL_CONSTANT = 16


class Aval:
    """A value's shape and dtype where the program is walked without computing it."""

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape, self.dtype = tuple(shape), dtype

    def __getitem__(self, k: int) -> Aval:
        return Aval(self.shape[1:], self.dtype)


class Interpreter:
    """Runs jaxprs equation by equation (`evaluate`), or walks them for their shapes only,
    keeping per value its metadata, its fingerprints, its depth (the longest chain of
    operations from an input) and, for a value that is a row of a stacked one or passes
    one operand on, the value it stands for (`source`)."""

    def __init__(
        self,
        max_bytes: int | None = None,
        *,
        evaluate: bool = True,
        keep_arrays: bool = True,
        flush_above: int | None = None,
        shadow: Any = None,
        executables: Executables | None = None,
        progress: Progress | None = None,
        spill: Callable[[int, np.ndarray], None] | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        #: Told each value's numbers as they are made (`parity.origin._stored.ArraysWriter.
        #: value`), where they go to disk instead of being held; None: held where
        #: `keep_arrays`, else let go once fingerprinted.
        self.spill = spill
        #: Told of each value, program and scan step, to say how a long recording goes
        #: (`parity.origin._progress`); None: nothing said.
        self.progress = progress
        #: A shadow replay (`parity.origin._shadow.Shadow`) told of every value as it is
        #: made (`ground`, `op`, `row`, `stack`); None: none.
        self.shadow = shadow
        if shadow is not None:
            shadow.interpreter = self
        #: The programs its operations ran, one per signature (`parity.origin._executables`;
        #: those given, shared with the other side of a comparison, else its own).
        self.executables = Executables() if executables is None else executables
        #: Clears jax's caches and those programs as the recording grows
        #: (`parity.origin._flushing`); None: never (a user's own process).
        self.flushing = (
            None
            if flush_above is None or not evaluate
            else Flushing(flush_above, also=self.executables.clear)
        )
        self.evaluate = evaluate
        self.keep_arrays = keep_arrays
        self.nbytes = 0
        self.values: list[Value] = []
        self.arrays: list[np.ndarray] = []
        self.prints: list[Fingerprint] = []
        self.rows: dict[int, Prints] = {}
        self.depth: list[int] = []
        self.source: dict[int, int] = {}
        self.stacked: dict[int, list[int]] = {}
        self.consts: dict[int, tuple[Any, Ref]] = {}
        self.frames: dict[int, Where] = {}
        self.chains: dict[tuple[str, str], str] = {}

    def add(
        self,
        x: Any,
        primitive: str,
        kind: str,
        inputs: list[int],
        where: Where,
        source: int | None = None,
        literals: tuple[tuple[int, str], ...] = (),
    ) -> Ref:
        i = len(self.values)
        ins = tuple(j for j in inputs if j >= 0)
        if self.flushing is not None:
            self.flushing.after(i)
        if self.evaluate:
            host = to_host(x)
            if kind in ("input", "const") and host.size <= SMALL_CONSTANT:
                # A small input or constant keeps its numbers in words (position -1: the
                # value itself), so that a changed one can be said with both values.
                literals = ((-1, _literal(host)),)
            self.nbytes += host.nbytes
            if self.max_bytes is not None and self.nbytes > self.max_bytes:
                raise LocaliseError(
                    f"the program is too large to record: its values pass "
                    f"{self.max_bytes >> 20} MiB after {len(self.values)} of them; localise a "
                    "smaller case (fewer layers, a shorter batch)"
                )
            shape, dtype = tuple(host.shape), str(host.dtype)
            whole, rows = value_fingerprints(host)
            self.prints.append(whole)
            if rows:
                self.rows[i] = rows
            if self.keep_arrays:
                self.arrays.append(host)
            else:  # fingerprinted (and written, where spilled): its numbers need not be held
                if self.spill is not None:
                    self.spill(i, host)
                self.nbytes -= host.nbytes
        else:
            shape, dtype = (
                tuple(x.shape),
                str(np.dtype(x.dtype)) if plain_dtype(x.dtype) else str(x.dtype),
            )
        (file, line, function), library, chain = where
        self.values.append(
            Value(
                i,
                primitive,
                kind,
                shape,
                dtype,
                ins,
                file,
                line,
                function,
                library,
                literals,
                tuple(chain.split("\n")) if chain else (),
            )
        )
        if self.shadow is not None and self.evaluate and kind in ("input", "const"):
            self.shadow.ground(i, x)
        if self.progress is not None:
            self.progress.value(len(self.values), f"{file}:{line} in {function}" if file else "")
        if source is not None:
            self.source[i] = self.source.get(source, source)
            self.depth.append(self.depth[source])
        elif kind in ("input", "const"):
            self.depth.append(0)
        else:
            deepest = max((self.depth[j] for j in ins), default=0)
            self.depth.append(deepest + (kind == "op"))
        return x, i

    def stands_for(self, i: int) -> int:
        """The value `i` stands for in the dataflow order (itself, or its `source`)."""
        return self.source.get(i, i)

    def frame(self, eqn: Any, outer: Where) -> Where:
        """`eqn`'s own user frame; else (an equation of a body jax traced, such as
        `jnp.where`'s, whose traceback stops at the call) the frame of the call. Its chain
        goes on with the frames that led to the call (a jitted program's traceback stops at
        its own function: the chain reaches the caller through the program's frame)."""
        if id(eqn) not in self.frames:
            self.frames[id(eqn)] = frame_of(eqn)
        own = self.frames[id(eqn)]
        if not own[0][0]:
            return outer
        if not outer[2]:
            return own
        key = (own[2], outer[2])
        if key not in self.chains:
            mine = own[2].split("\n")
            more = [f for f in outer[2].split("\n") if f not in mine]
            self.chains[key] = "\n".join((mine + more)[:CHAIN_FRAMES])
        return own[0], own[1], self.chains[key]

    def const(self, c: Any, where: Where) -> Ref:
        if id(c) not in self.consts:  # the object is kept alive by the entry
            value = c if self.evaluate else Aval(shape_of(c), dtype_of(c))
            self.consts[id(c)] = (c, self.add(value, "const", "const", [], where))
        return self.consts[id(c)][1]

    def run(self, jaxpr: Any, consts: list[Ref], args: list[Ref], outer: Where) -> list[Ref]:
        from jax.extend import core as jex

        env: dict[Any, Ref] = {}
        env.update(zip(jaxpr.constvars, consts, strict=True))
        env.update(zip(jaxpr.invars, args, strict=True))
        last = _last_uses(jaxpr, jex.Literal)
        # The values this run makes, by how many of its variables hold each: one that
        # none holds any longer is read by nothing after (its caller sees only outputs).
        start, held = len(self.values), collections.Counter[int]()

        def read(v: Any) -> Ref:
            return (v.val, -1) if isinstance(v, jex.Literal) else env[v]

        for k, eqn in enumerate(jaxpr.eqns):
            outs = self.eqn(eqn, [read(v) for v in eqn.invars], outer)
            for var, out in zip(eqn.outvars, outs, strict=True):
                if var in last:  # a result nothing reads is not held
                    env[var] = out
                    held[out[1]] += 1
                elif out[1] >= start and held[out[1]] <= 0:
                    self.release(out[1])
            # What this equation read last is let go: a recording holds what the program
            # holds, not every value it ever made (a value's numbers stay where the
            # recording keeps them: its fingerprint, and its array where asked).
            for var in eqn.invars:  # `a @ a` reads one value twice
                if not isinstance(var, jex.Literal) and last.get(var) == k and var in env:
                    i = env.pop(var)[1]
                    held[i] -= 1
                    if i >= start and held[i] <= 0:
                        self.release(i)
        return [read(v) for v in jaxpr.outvars]

    def release(self, i: int) -> None:
        """Value `i` is read by nothing more: the shadow replay lets its numbers go. An
        input is kept (a later program may take the same array), and so is a constant of
        a closed program (the program may run again)."""
        if self.shadow is not None and self.evaluate and self.values[i].kind in ("op", "move"):
            self.shadow.release(i)

    def closed(self, closed: Any, args: list[Ref], where: Where) -> list[Ref]:
        inner = getattr(closed, "jaxpr", closed)
        consts = [self.const(c, where) for c in getattr(closed, "consts", ())]
        return self.run(inner, consts, args, where)

    def eqn(self, eqn: Any, ins: list[Ref], outer: Where) -> list[Ref]:
        where = self.frame(eqn, outer)
        name = eqn.primitive.name
        params = eqn.params
        if name in CALLS:
            body = params.get("jaxpr", params.get("call_jaxpr"))
            if body is not None:
                return self.closed(body, ins, where)
        if name == "scan":
            return self.scan(eqn, ins, where)
        if self.evaluate and name == "while":
            return self.loop(eqn, ins, where)
        if self.evaluate and name == "cond":
            index = int(np.asarray(ins[0][0]))
            return self.closed(params["branches"][index], ins[1:], where)
        if self.evaluate:
            outs = self.executables.bind(eqn.primitive, [x for x, _ in ins], params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        else:  # walked, not computed: a while or cond is one operation here
            outs = [Aval(v.aval.shape, v.aval.dtype) for v in eqn.outvars]
        kind = "move" if name in MOVES else "op"
        source = self.row_read(eqn, ins) if kind == "move" else None
        literals = tuple((k, _literal(x)) for k, (x, i) in enumerate(ins) if i < 0)
        refs = [self.add(o, name, kind, [i for _, i in ins], where, source, literals) for o in outs]
        if self.shadow is not None and self.evaluate:
            self.shadow.op(eqn, ins, refs)
        if name == "stack" and params.get("axis") == 0:
            self.stacked[refs[0][1]] = [self.stands_for(i) for _, i in ins]
        return refs

    def row_read(self, eqn: Any, ins: list[Ref]) -> int | None:
        """The value a move's result stands for: the operand a cast or reshape passes on,
        or the row of a stacked value (a scan's ys, a `stack`) a slice of one row reads."""
        name, params = eqn.primitive.name, eqn.params
        operands = [i for _, i in ins if i >= 0]
        if not operands:
            return None
        first = ins[0][1]
        if name in WHOLE and len(operands) == 1:
            return operands[0]
        if first < 0 or first not in self.stacked:
            return None
        start: int | None = None
        if name == "slice" and params["start_indices"]:
            start, stop = int(params["start_indices"][0]), int(params["limit_indices"][0])
            start = start if stop - start == 1 else None
        elif name == "dynamic_slice" and len(ins) > 1 and params["slice_sizes"][0] == 1:
            value = ins[1][0]
            if not isinstance(value, Aval):
                start = int(np.asarray(value))
        rows = self.stacked[first]
        return rows[start] if start is not None and 0 <= start < len(rows) else None

    def scan(self, eqn: Any, ins: list[Ref], where: Where) -> list[Ref]:
        import jax.numpy as jnp

        p = eqn.params
        n_consts, n_carry, length = int(p["num_consts"]), int(p["num_carry"]), int(p["length"])
        split = n_consts + n_carry
        consts, carry, xs = ins[:n_consts], ins[n_consts:split], ins[split:]
        steps = range(length - 1, -1, -1) if p["reverse"] else range(length)
        ys: dict[int, list[Ref]] = {}
        row = self.executables.row  # a row of a plain value made on the host, where moves are
        start = len(self.values)  # what the steps make: a row or a carry is let go once read
        for n, k in enumerate(steps):
            if self.progress is not None:
                self.progress.step(k, length, first=n == 0)
            rows = [
                self.add(row(x, k), "scan", "move", [i], where, self.row_of(i, k)) for x, i in xs
            ]
            if self.shadow is not None and self.evaluate:
                for (_, i), (_, r) in zip(xs, rows, strict=True):
                    self.shadow.row(r, i, k)
            outs = self.closed(p["jaxpr"], [*consts, *carry, *rows], where)
            kept = {i for _, i in outs} | {i for part in ys.values() for _, i in part}
            for _, i in (*carry, *rows):
                if i >= start and i not in kept:
                    self.release(i)
            carry = outs[:n_carry]
            ys[k] = outs[n_carry:]
        if self.progress is not None and length:
            self.progress.left()
        stacked = []
        for j, var in enumerate(eqn.outvars[n_carry:]):
            if length == 0:
                empty = jnp.zeros(var.aval.shape, var.aval.dtype) if self.evaluate else None
                stacked.append((empty, -1))
                continue
            parts = [ys[k][j] for k in range(length)]
            if self.evaluate:
                array: Any = self.executables.stack([x for x, _ in parts])
            else:
                array = Aval(var.aval.shape, var.aval.dtype)
            ref = self.add(array, "scan", "move", [i for _, i in parts], where)
            if self.shadow is not None and self.evaluate:
                self.shadow.stack(ref[1], parts)
            self.stacked[ref[1]] = [self.stands_for(i) for _, i in parts]
            stacked.append(ref)
        final = {i for _, i in carry}
        for i in {i for part in ys.values() for _, i in part}:  # now rows of the stacked ys
            if i >= start and i not in final:
                self.release(i)
        return [*carry, *stacked]

    def row_of(self, i: int, k: int) -> int | None:
        """Row `k` of value `i`, where `i` is a stacked value whose rows are known."""
        rows = self.stacked.get(i)
        return rows[k] if rows is not None and 0 <= k < len(rows) else None

    def loop(self, eqn: Any, ins: list[Ref], where: Where) -> list[Ref]:
        p = eqn.params
        n_cond, n_body = int(p["cond_nconsts"]), int(p["body_nconsts"])
        cond_consts, body_consts = ins[:n_cond], ins[n_cond : n_cond + n_body]
        carry = ins[n_cond + n_body :]
        for _ in range(_MAX_WHILE):
            (go, _), *_ = self.closed(p["cond_jaxpr"], [*cond_consts, *carry], where)
            if not bool(np.asarray(go)):
                return carry
            carry = self.closed(p["body_jaxpr"], [*body_consts, *carry], where)
        raise LocaliseError(
            f"a while loop ran {_MAX_WHILE} iterations without its condition failing; "
            "localise a smaller case"
        )

    def recording(self, outputs: dict[str, int], output_arrays: dict[str, np.ndarray]) -> Recording:
        """What was run, as a `Recording` (outputs in the order given)."""
        return Recording(
            values=tuple(self.values),
            fingerprints=tuple(self.prints),
            rows=dict(self.rows),
            outputs=outputs,
            output_arrays=output_arrays,
            arrays=tuple(self.arrays) if self.keep_arrays else None,
        )


def _last_uses(jaxpr: Any, literal: type) -> dict[Any, float]:
    """Each variable of `jaxpr` that something reads: the index of the last equation that
    reads it, infinity for an output of the jaxpr (read by its caller)."""
    last: dict[Any, float] = {}
    for k, eqn in enumerate(jaxpr.eqns):
        for var in eqn.invars:
            if not isinstance(var, literal):
                last[var] = k
    for var in jaxpr.outvars:
        if not isinstance(var, literal):
            last[var] = math.inf
    return last


def plain_dtype(dtype: Any) -> bool:
    """Whether numpy knows `dtype` (not a PRNG key's extended dtype)."""
    try:
        np.dtype(dtype)
    except TypeError:
        return False
    return True


def shape_of(x: Any) -> tuple[int, ...]:
    shape = getattr(x, "shape", None)
    return tuple(shape) if shape is not None else np.shape(x)


def as_jax(x: Any) -> Any:
    import jax

    return x if isinstance(x, jax.Array) else jax.numpy.asarray(x)


def dtype_of(x: Any) -> Any:
    dtype = getattr(x, "dtype", None)
    return dtype if dtype is not None else np.asarray(x).dtype


def to_host(x: Any) -> np.ndarray:
    """`x` as a numpy array; a PRNG key array as its key data."""
    import jax
    import jax.numpy as jnp

    dtype = getattr(x, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.extended):
        return np.asarray(jax.random.key_data(x))
    return np.asarray(x)


def _literal(x: Any) -> str:
    """A constant written into a program, in its dtype's own words (`1e-05`, `True`, `3`);
    a literal of several elements by its shape and the bytes' digest."""
    a = np.asarray(x)
    if a.size == 1:
        return str(a.reshape(())[()])
    if a.size <= SMALL_CONSTANT:
        return np.array2string(a.reshape(-1), separator=" ", max_line_width=10_000)
    digest = hashlib.blake2b(a.tobytes(), digest_size=4).hexdigest()
    return f"{a.dtype}{list(a.shape)} #{digest}"
