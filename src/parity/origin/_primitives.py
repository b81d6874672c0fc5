"""What the origin knows of each jax primitive, in one entry per primitive (`REGISTRY`): the
recorder (`_interpreter.py`), the per-operation programs (`_executables.py`), the alignment
(`_align.py`), the shadow replay (`_shadow.py`) and the rounding model (`model`) all read it,
so a fact about a primitive (it only moves numbers; numpy can make it on the host; how far
rounding can move it; how a backend computes it) is written once.

**The facts of an entry** (`Primitive`):

- `kind`: what the recording calls its result: `move` (it moves, reshapes, casts or
  carries values: the dataflow order, `parity.judge._dataflow.MOVES`, places the
  result where its operand was computed, and the rest arrange or carry them) or `op`.
- `whole`: a move whose one operand is its result whole (a cast, a reshape; not a slice),
  as far as the dataflow order of a value goes.
- `arranging`: a move that arranges its operands into something new (which goes where), so
  values it makes are matched by value only (`_align.py`).
- `placing`: on the base's values, each element of its result is an element of an operand
  (or a literal, a padding value) moved, picked or negated: no rounding.
- `host`: where numpy makes the same bits on the host: the parameters numpy's reading uses
  and the function of (operands, parameters) (`_executables.py`, "Moves on the host").
- `bound`: its eager run is not one program of its own (jax runs its implementation op by
  op, or it moves data between devices): bound as jax binds it.
- `call`: its body is a jaxpr taking the equation's operands and giving its results.
- `rounding`: its rounding rule (`parity.origin._rounding_rules`), or None: no model.
- `computes`: how a backend carries its arithmetic out (`Arithmetic`), where that is not
  simply in its result's type.

**How a backend computes** (`Machine`: jax's platform and its default matmul precision):

- a `dot_general` with a bfloat16 or float16 result accumulates in float32 and rounds once
  on a CPU and on a TPU (measured on the CPU: every element of jax's bfloat16 `dot` equals
  the float32 product rounded once, K from 16 to 4,096; tests/parity/origin/
  test_primitives.py holds it);
- on a TPU, a float32 `dot_general` at the default precision (or `high`) rounds its
  operands to bfloat16 first and accumulates in float32; at `highest` it does not;
- everything else, a bfloat16 `reduce_sum` included, is bounded as rounded in its result's
  type at every step (on a CPU jax's bfloat16 `reduce_sum` is not the float32 sum rounded
  once: measured, a test holds that the model still covers it), a bound that holds
  however the backend carries it out, wider or not.

This module imports numpy and the origin's rounding modules; jax inside functions only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import parity.origin._rounding_rules as rules
from parity.judge._dataflow import MOVES as PLACED_MOVES
from parity.origin._rounding import (
    Fresh,
    held_in,
    is_exact_type,
    is_float,
    name_of,
    narrowed,
    unit_roundoff,
)
from parity.origin._rounding_rules import Rule

__all__ = [
    "ARRANGING",
    "BOUND",
    "CALLS",
    "CPU",
    "HOST_MOVES",
    "MOVES",
    "PLACING",
    "REGISTRY",
    "WHOLE",
    "Arithmetic",
    "Machine",
    "Primitive",
    "model",
]


@dataclass(frozen=True)
class Machine:
    """Where an operation's arithmetic runs, as far as its rounding goes.

    **Fields:** `platform` (jax's: `cpu`, `gpu`, `tpu`); `matmul` (jax's default matmul
    precision, `jax_default_matmul_precision`: None for the backend's default, or a name
    such as `highest`, `float32`, `bfloat16`).
    """

    platform: str = "cpu"
    matmul: str | None = None

    @classmethod
    def here(cls) -> Machine:
        """This process's: its default backend and matmul precision (imports jax)."""
        import jax

        precision = jax.config.jax_default_matmul_precision  # pyright: ignore[reportAttributeAccessIssue]
        return cls(jax.default_backend(), None if precision is None else str(precision).lower())


#: A CPU at its default matmul precision: what a test that names no machine models.
CPU = Machine()


@dataclass(frozen=True)
class Arithmetic:
    """How an operation's arithmetic is carried out: in type `inner`, then rounded once into
    the result's type where that is narrower; its float operands first rounded to
    `operands` where given (a TPU's bfloat16 pass)."""

    inner: str
    operands: str | None = None


#: How a backend carries an operation out: (its parameters, its result type, the machine).
Computes = Callable[[Mapping[str, Any], str, Machine], Arithmetic]


@dataclass(frozen=True)
class Primitive:
    """One primitive's entry in `REGISTRY` (the module docstring says what each fact means).

    **Fields:** `name`, `kind`, `whole`, `arranging`, `placing`, `host`, `bound`, `call`,
    `rounding`, `computes`.
    """

    name: str
    kind: str = "op"
    whole: bool = False
    arranging: bool = False
    placing: bool = False
    host: tuple[tuple[str, ...], Callable[[list[np.ndarray], Mapping[str, Any]], Any]] | None = None
    bound: bool = False
    call: bool = False
    rounding: Rule | None = None
    computes: Computes | None = None


def _np_slice(x: np.ndarray, p: Mapping[str, Any]) -> np.ndarray:
    strides = p["strides"] or (1,) * x.ndim
    return x[tuple(map(slice, p["start_indices"], p["limit_indices"], strides))]


def _np_broadcast(x: np.ndarray, p: Mapping[str, Any]) -> np.ndarray:
    shape, dims = tuple(p["shape"]), tuple(p["broadcast_dimensions"])
    expanded = [1] * len(shape)
    for axis, size in zip(dims, x.shape, strict=True):
        expanded[axis] = size
    return np.broadcast_to(x.reshape(expanded), shape)


_HIGHEST = frozenset({"highest", "float32", "precision.highest"})


def _precision(params: Mapping[str, Any], machine: Machine) -> str | None:
    """A `dot_general`'s precision as one lower-case word (its own, else the machine's
    default); None for the backend's default."""
    given = params.get("precision")
    if isinstance(given, tuple) and given:
        given = given[0]
    if given is None:
        return machine.matmul
    word = str(getattr(given, "name", given)).lower()
    return None if word in ("default", "precision.default") else word


def _dot_arithmetic(params: Mapping[str, Any], out: str, machine: Machine) -> Arithmetic:
    """A `dot_general` (module docstring, "How a backend computes")."""
    narrow = out in ("bfloat16", "float16") and machine.platform in ("cpu", "tpu")
    inner = "float32" if narrow else out
    if (
        machine.platform == "tpu"
        and out == "float32"
        and _precision(params, machine) not in _HIGHEST
    ):
        return Arithmetic(inner, "bfloat16")
    return Arithmetic(inner)


def _entries() -> dict[str, Primitive]:
    moving = rules.moving
    placed_whole = PLACED_MOVES - {"slice", "dynamic_slice"}
    move_rules: dict[str, Rule] = {
        "reshape": moving(rules.reshape),
        "transpose": moving(lambda p, f: lambda a: np.transpose(a, p["permutation"])),
        "squeeze": moving(lambda p, f: lambda a: np.squeeze(a, axis=tuple(p["dimensions"]))),
        "broadcast_in_dim": moving(rules.broadcast),
        "slice": moving(rules.slice_of),
        "rev": moving(lambda p, f: lambda a: np.flip(a, axis=tuple(p["dimensions"]))),
        "copy": moving(lambda p, f: lambda a: a),
        "dynamic_slice": rules.dynamic_slice,
        "dynamic_update_slice": rules.dynamic_update_slice,
        "concatenate": rules.concatenate,
        "pad": rules.pad,
        "gather": rules.gathered,
        "convert_element_type": rules.convert,
    }
    hosts: dict[str, tuple[tuple[str, ...], Any]] = {
        "slice": (("start_indices", "limit_indices", "strides"), lambda xs, p: _np_slice(xs[0], p)),
        "broadcast_in_dim": (
            ("shape", "broadcast_dimensions"),
            lambda xs, p: _np_broadcast(xs[0], p),
        ),
        "reshape": (("new_sizes",), lambda xs, p: xs[0].reshape(p["new_sizes"])),
        "squeeze": (("dimensions",), lambda xs, p: np.squeeze(xs[0], axis=tuple(p["dimensions"]))),
        "transpose": (("permutation",), lambda xs, p: np.transpose(xs[0], p["permutation"])),
        "concatenate": (("dimension",), lambda xs, p: np.concatenate(xs, axis=p["dimension"])),
        "rev": (("dimensions",), lambda xs, p: np.flip(xs[0], axis=tuple(p["dimensions"]))),
        "copy": ((), lambda xs, p: xs[0].copy()),
        "copy_p": ((), lambda xs, p: xs[0].copy()),
    }
    carried = {"scan", "while", "cond"}
    # `stack` and `convert` are also the moves `parity.origin._proof.answering` adds: a
    # stacked key's rows joined, a golden key gathered through the user's converter.
    arranged = {"dynamic_update_slice", "concatenate", "stack", "split", "pad", "gather", "rev",
                "convert"}  # fmt: skip
    moves = PLACED_MOVES | arranged | {"tile", "unstack", "optimization_barrier"} | carried
    arranging = {"concatenate", "pad", "gather", "rev", "dynamic_update_slice"}
    placing_ops = {"select_n", "max", "min", "reduce_max", "reduce_min", "neg", "abs", "sort",
                   "cummax", "cummin"}  # fmt: skip
    ops: dict[str, Rule] = {
        "add": rules.summed(1.0),
        "add_any": rules.summed(1.0),
        "sub": rules.summed(-1.0),
        "neg": rules.negated,
        "mul": rules.times_of,
        "square": rules.times_of,
        "integer_pow": rules.integer_power,
        "div": rules.divided,
        "dot_general": rules.dot_general,
        "reduce_sum": rules.reduce_sum,
        "cumsum": rules.cumulative_sum,
        "scatter-add": rules.scatter_sum,
        "cummax": rules.cumulative_extreme(np.maximum),
        "cummin": rules.cumulative_extreme(np.minimum),
        "reduce_max": rules.extreme(np.max, -math.inf),
        "reduce_min": rules.extreme(np.min, math.inf),
        "max": rules.pointwise(np.maximum),
        "min": rules.pointwise(np.minimum),
        "abs": rules.pointwise(np.abs),
        "select_n": rules.select_n,
    }
    bound = {
        *("random_bits", "random_seed", "random_split", "random_fold_in", "random_wrap"),
        *("random_unwrap", "device_put", "pure_callback", "io_callback", "debug_callback"),
    }
    calls = {
        *("jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call"),
        *("custom_vjp_call_jaxpr", "checkpoint", "remat", "remat2"),
    }
    names = moves | set(hosts) | set(ops) | placing_ops | bound | calls
    return {
        name: Primitive(
            name,
            kind="move" if name in moves else "op",
            whole=name in placed_whole or name == "optimization_barrier",
            arranging=name in arranging,
            placing=(name in moves and name not in carried and name != "convert_element_type")
            or name in placing_ops,
            host=hosts.get(name),
            bound=name in bound,
            call=name in calls,
            rounding=move_rules.get(name) or ops.get(name),
            computes=_dot_arithmetic if name == "dot_general" else None,
        )
        for name in sorted(names)
    }


#: Every primitive the origin knows something of, by name.
REGISTRY: Mapping[str, Primitive] = _entries()

#: The registry's facts as the sets its readers test membership in.
MOVES = frozenset(n for n, p in REGISTRY.items() if p.kind == "move")
WHOLE = frozenset(n for n, p in REGISTRY.items() if p.whole)
ARRANGING = frozenset(n for n, p in REGISTRY.items() if p.arranging)
PLACING = frozenset(n for n, p in REGISTRY.items() if p.placing)
BOUND = frozenset(n for n, p in REGISTRY.items() if p.bound)
CALLS = frozenset(n for n, p in REGISTRY.items() if p.call)
HOST_MOVES = {n: p.host for n, p in REGISTRY.items() if p.host is not None}


def model(
    primitive: str,
    params: Mapping[str, Any],
    operands: Sequence[Fresh],
    out_dtype: Any,
    *,
    machine: Machine = CPU,
) -> Fresh | None:
    """The new program's `primitive` applied to `operands`, with its rounding bound, as
    `machine` computes it.

    **Arguments:**

    - `primitive`: the jax primitive's name (`eqn.primitive.name`).
    - `params`: its parameters (`eqn.params`), as jax 0.4.35 to 0.10.2 give them.
    - `operands`: one `Fresh` per operand, in the equation's order (literals grounded).
    - `out_dtype`: the type of the result.
    - `machine`: where it runs (`Machine.here()` for this process); default a CPU.

    **Returns:** the result's `Fresh`, or None where there is no model: a primitive with no
    rule in the registry, a complex type, a divisor, predicate, start index or integer
    conversion whose operand is not exact, a power other than 2. The caller then says
    "no rounding model for <primitive>".
    """
    entry = REGISTRY.get(primitive)
    out = name_of(out_dtype)
    if entry is None or entry.rounding is None or not (is_float(out) or is_exact_type(out)):
        return None
    how = entry.computes(params, out, machine) if entry.computes is not None else Arithmetic(out)
    with np.errstate(all="ignore"):  # inf and NaN are carried as values, as jax does
        held = [held_in(f, how.inner) for f in operands]
        if how.operands is not None:
            held = [_lowered(f, how.operands) for f in held]
        result = entry.rounding(params, held, how.inner)
        if result is None or how.inner == out or unit_roundoff(how.inner) >= unit_roundoff(out):
            return result
        return narrowed(result, out)


def _lowered(f: Fresh, to: str) -> Fresh:
    """A float operand rounded to the narrower type `to` before the arithmetic (a TPU's
    bfloat16 pass); an operand already that narrow, or not a float, as it is."""
    if f.dtype is None or not is_float(f.dtype) or unit_roundoff(f.dtype) >= unit_roundoff(to):
        return f
    return narrowed(f, to)
