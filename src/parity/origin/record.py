"""`record(fn, *args)`: run a function's program equation by equation, keeping every value.

`fn` is traced (`jax.make_jaxpr`) and its jaxpr evaluated here, one equation at a time,
with each primitive's own `bind`: the numbers are what that operation computes when run on
its own. The interpreter descends into calls (`jit`, `closed_call`, `custom_jvp_call`,
`custom_vjp_call`, `checkpoint`), unrolls `scan` (each iteration's values are values of
their own, and a row of `xs` or the stacked `ys` is a data movement of them), runs `while`
until its condition fails, and takes a `cond`'s taken branch. Other higher-order primitives
are bound whole (their insides are not seen). Every value is tagged with its primitive and
the innermost frame of the traceback jax recorded for its equation that lies outside jax
and parity.

jax is imported inside these functions only (the caller has it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from parity.judge.dataflow import dataflow_order
from parity.judge.trees import flatten
from parity.origin.recording import Fingerprint, Recording, Value, fingerprint, row_fingerprints

__all__ = ["BARE", "LocaliseError", "record"]

#: The key a bare array output gets (as `assert_equivalent` names a bare array).
BARE = "array"

#: Primitives whose body is a jaxpr taking the equation's operands and giving its results.
_CALLS = frozenset(
    {"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
     "custom_vjp_call_jaxpr", "checkpoint", "remat", "remat2"}
)  # fmt: skip

#: Primitives that move, reshape or cast values without computing new numbers.
MOVES = frozenset(
    {"slice", "squeeze", "reshape", "expand_dims", "transpose", "copy", "copy_p",
     "dynamic_slice", "dynamic_update_slice", "device_put", "broadcast_in_dim",
     "convert_element_type", "concatenate", "stack", "split", "pad", "gather", "rev",
     "tile", "unstack", "optimization_barrier", "scan", "while", "cond"}
)  # fmt: skip

_MAX_WHILE = 100_000
_PARITY = str(Path(__file__).resolve().parents[1])


class LocaliseError(ValueError):
    """A program cannot be recorded or two recordings cannot be aligned.

    **Fields:** `reason`, one line saying what was found and what to do.
    """

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


Ref = tuple[Any, int]  # (array, value id; -1 for a literal)
Frame = tuple[str, int, str]  # (file, line, function); ("", 0, "") where unknown
_NOWHERE: Frame = ("", 0, "")


class _Interpreter:
    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.values: list[Value] = []
        self.arrays: list[np.ndarray] = []
        self.consts: dict[int, tuple[Any, Ref]] = {}
        self.frames: dict[int, Frame] = {}

    def add(self, x: Any, primitive: str, kind: str, inputs: list[int], where: Frame) -> Ref:
        host = _host(x)
        self.nbytes += host.nbytes
        if self.max_bytes is not None and self.nbytes > self.max_bytes:
            raise LocaliseError(
                f"the program is too large to record: its values pass {self.max_bytes >> 20} "
                f"MiB after {len(self.values)} of them; localise a smaller case (fewer "
                "layers, a shorter batch)"
            )
        file, line, function = where
        i = len(self.values)
        ins = tuple(j for j in inputs if j >= 0)
        value = Value(i, primitive, kind, tuple(host.shape), str(host.dtype), ins, file, line,
                      function)  # fmt: skip
        self.values.append(value)
        self.arrays.append(host)
        return x, i

    def frame(self, eqn: Any, outer: Frame) -> Frame:
        """`eqn`'s own user frame; else (an equation of a body jax traced, such as
        `jnp.where`'s, whose traceback stops at the call) the frame of the call."""
        if id(eqn) not in self.frames:
            self.frames[id(eqn)] = _user_frame(eqn)
        return self.frames[id(eqn)] if self.frames[id(eqn)][0] else outer

    def const(self, c: Any, where: Frame) -> Ref:
        if id(c) not in self.consts:  # the object is kept alive by the entry
            self.consts[id(c)] = (c, self.add(c, "const", "const", [], where))
        return self.consts[id(c)][1]

    def run(self, jaxpr: Any, consts: list[Ref], args: list[Ref], outer: Frame) -> list[Ref]:
        from jax.extend import core as jex

        env: dict[Any, Ref] = {}
        env.update(zip(jaxpr.constvars, consts, strict=True))
        env.update(zip(jaxpr.invars, args, strict=True))

        def read(v: Any) -> Ref:
            return (v.val, -1) if isinstance(v, jex.Literal) else env[v]

        for eqn in jaxpr.eqns:
            outs = self.eqn(eqn, [read(v) for v in eqn.invars], outer)
            for var, out in zip(eqn.outvars, outs, strict=True):
                env[var] = out
        return [read(v) for v in jaxpr.outvars]

    def closed(self, closed: Any, args: list[Ref], where: Frame) -> list[Ref]:
        inner = getattr(closed, "jaxpr", closed)
        consts = [self.const(c, where) for c in getattr(closed, "consts", ())]
        return self.run(inner, consts, args, where)

    def eqn(self, eqn: Any, ins: list[Ref], outer: Frame) -> list[Ref]:
        where = self.frame(eqn, outer)
        name = eqn.primitive.name
        params = eqn.params
        if name in _CALLS:
            body = params.get("jaxpr", params.get("call_jaxpr"))
            if body is not None:
                return self.closed(body, ins, where)
        if name == "scan":
            return self.scan(eqn, ins, where)
        if name == "while":
            return self.loop(eqn, ins, where)
        if name == "cond":
            index = int(np.asarray(ins[0][0]))
            return self.closed(params["branches"][index], ins[1:], where)
        outs = eqn.primitive.bind(*(x for x, _ in ins), **params)
        outs = outs if eqn.primitive.multiple_results else [outs]
        kind = "move" if name in MOVES else "op"
        return [self.add(o, name, kind, [i for _, i in ins], where) for o in outs]

    def scan(self, eqn: Any, ins: list[Ref], where: Frame) -> list[Ref]:
        import jax.numpy as jnp

        p = eqn.params
        n_consts, n_carry, length = int(p["num_consts"]), int(p["num_carry"]), int(p["length"])
        consts, carry, xs = (
            ins[:n_consts],
            ins[n_consts : n_consts + n_carry],
            ins[n_consts + n_carry :],
        )
        steps = range(length - 1, -1, -1) if p["reverse"] else range(length)
        ys: dict[int, list[Ref]] = {}
        for k in steps:
            rows = [self.add(x[k], "scan", "move", [i], where) for x, i in xs]
            outs = self.closed(p["jaxpr"], [*consts, *carry, *rows], where)
            carry = outs[:n_carry]
            ys[k] = outs[n_carry:]
        stacked = []
        for j, var in enumerate(eqn.outvars[n_carry:]):
            if length == 0:
                stacked.append((jnp.zeros(var.aval.shape, var.aval.dtype), -1))
                continue
            parts = [ys[k][j] for k in range(length)]
            array = jnp.stack([jnp.asarray(x) for x, _ in parts])
            stacked.append(self.add(array, "scan", "move", [i for _, i in parts], where))
        return [*carry, *stacked]

    def loop(self, eqn: Any, ins: list[Ref], where: Frame) -> list[Ref]:
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


def _host(x: Any) -> np.ndarray:
    """`x` as a numpy array; a PRNG key array as its key data."""
    import jax
    import jax.numpy as jnp

    dtype = getattr(x, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.extended):
        return np.asarray(jax.random.key_data(x))
    return np.asarray(x)


def _user_frame(eqn: Any) -> Frame:
    """The innermost frame of `eqn`'s traceback outside jax and parity, or ("", 0, "")."""
    try:
        from jax._src import source_info_util

        for frame in source_info_util.user_frames(eqn.source_info.traceback):
            if not str(Path(frame.file_name).resolve()).startswith(_PARITY):
                return frame.file_name, int(frame.start_line), frame.function_name
    except Exception:  # a jax without this private API: the values stay unplaced
        pass
    return _NOWHERE


def record(
    fn: Callable[..., Any],
    *args: Any,
    keep_arrays: bool = True,
    max_bytes: int | None = None,
    **kwargs: Any,
) -> Recording:
    """Run `fn(*args, **kwargs)`'s program equation by equation and keep every value.

    **Arguments:**

    - `fn`: a function jax can trace; arguments that are not arrays must be closed over.
    - `args`, `kwargs`: what `fn` is called with (the same for both sides of a comparison).
    - `keep_arrays`: keep each value's numbers (default); False keeps only fingerprints
      (`Recording.summary()`), for a recording matched later or in another process.
    - `max_bytes`: the most bytes the values may take together while recording (they are
      all held until the fingerprints are taken); past it, `LocaliseError` says the
      program is too large. None: no limit.

    **Returns:** a `Recording`. Raises `LocaliseError` when `fn` does not trace.
    """
    import jax

    try:
        closed, shapes = jax.make_jaxpr(functools.partial(fn, **kwargs), return_shape=True)(*args)
    except Exception as e:
        raise LocaliseError(
            f"{getattr(fn, '__name__', fn)!s} does not trace, so its values cannot be recorded "
            f"({type(e).__name__}: {' '.join(str(e).split())[:200]})"
        ) from None
    interp = _Interpreter(max_bytes)
    leaves = jax.tree_util.tree_leaves(args)
    ins = [interp.add(x, "input", "input", [], _NOWHERE) for x in leaves]
    outs = interp.closed(closed, [(jax.numpy.asarray(x), i) for (x, i) in ins], _NOWHERE)
    leaves_out, treedef = jax.tree_util.tree_flatten(shapes)
    markers = jax.tree_util.tree_unflatten(treedef, [np.int64(j) for j in range(len(leaves_out))])
    keys = {int(v): k for k, v in flatten(markers, bare=BARE).items()}
    order = list(keys)
    if len(keys) > 1:  # the order the program computes its outputs in, the one parity uses
        rank = {k: n for n, k in enumerate(dataflow_order(fn, *args, **kwargs))}
        order.sort(key=lambda j: rank.get(keys[j], len(rank)))
    outputs = {keys[j]: outs[j][1] for j in order}
    rows: dict[int, tuple[Fingerprint, ...]] = {
        v.id: tuple(row_fingerprints(a)) for v, a in zip(interp.values, interp.arrays, strict=True)
        if a.ndim >= 2 and a.shape[0] > 0
    }  # fmt: skip
    return Recording(
        values=tuple(interp.values),
        fingerprints=tuple(fingerprint(a) for a in interp.arrays),
        rows=rows,
        outputs=outputs,
        output_arrays={keys[j]: _host(outs[j][0]) for j in order},
        arrays=tuple(interp.arrays) if keep_arrays else None,
    )
