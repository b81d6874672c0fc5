"""Each operation a recording runs on its own, compiled once per signature and kept here.

Run eagerly (`primitive.bind`), an operation is compiled by jax's own dispatch
(`jax.jit` of the primitive), which keeps with each program its traced function, its lowered
module and what it was lowered in: about 1.3 MiB of resident memory a program on a 2-core
x86 host with jax 0.10.2, against 0.2 MiB for the compiled program alone. A train group's
recording compiles 1,266 programs, so jax's caches had to be cleared as it went, and every
program in use was then lowered and compiled (or loaded) again.

`Executables.bind` compiles the same program jax's dispatch would (`jax.jit` of a function
that binds the primitive with its parameters, lowered for the operands at hand) and keeps
only the compiled program, keyed by the primitive, its parameters and each operand's shape,
dtype, weak type and sharding: the same program on the same operands, so the same bits,
and nothing else of it kept. An operation whose parameters or operands cannot be keyed (an
unhashable parameter, an operand of a kind not listed here) is bound as before.

**Moves on the host.** An operation that only moves numbers (a slice, a transpose, a
reshape, a broadcast, a concatenation: the registry's `host` moves, `_primitives.py`)
computes nothing that rounding could change: the program jax compiles for it copies each
element's bits to its place, for booleans, integers and float32 (not bfloat16:
`_bit_moved`). In a process with one device, a CPU (an accelerator keeps jax's programs:
nothing was measured on one), such an operation on those (not weakly typed) is done with
numpy on the host copy of its operands, and the result placed back on the device
(`jax.device_put`): the same bits, and no program to compile (about 40 ms each, cold, on a
2-core x86 host with jax 0.10.2) or to load from the cache. The rows a scan reads and the
stacking of its results are moves of the same kind (`Executables.row`, `Executables.stack`).
A train group's recording (`train_remat_nothing`, with a changed mask key) compiled 1,330
programs before and 967 with the moves on the host.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from parity.origin._primitives import BOUND, HOST_MOVES

__all__ = ["Executables"]

_SCALARS = (bool, int, float, complex)
_UNCOMPILED: Any = object()


@functools.cache
def _one_cpu() -> bool:
    """Whether this process runs on one device, a CPU: the moves measured bit for bit
    (`_bit_moved`) are XLA's CPU backend's, so an accelerator keeps jax's programs. Fixed
    once jax has started its backends, so asked once a process."""
    import jax

    return jax.device_count() == 1 and jax.devices()[0].platform == "cpu"


def _bit_moved(dtype: Any) -> bool:
    """Whether XLA moves values of `dtype` as their bits: booleans, integers and float32
    (tests/parity/origin/test_executables.py draws their bits at random, NaN payloads and
    subnormals included). Not bfloat16: XLA's CPU backend concatenates and broadcasts it
    through float32, which quiets a signalling NaN and drops its payload (measured, jax
    0.10.2), so those moves stay jax's programs; nor any other type not drawn there."""
    return isinstance(dtype, np.dtype) and (dtype.kind in "biu" or dtype == np.float32)


def _host_operands(operands: Sequence[Any]) -> list[np.ndarray] | None:
    """The operands as numpy arrays, where moves run on the host (`_one_cpu`) and each is an
    array on the process's one device or on the host, of a dtype moved as bits
    (`_bit_moved`) and not weakly typed; else None."""
    import jax

    if not _one_cpu():
        return None
    out = []
    for x in operands:
        jax_array = isinstance(x, jax.Array) and not getattr(x, "weak_type", False)
        if not (jax_array or isinstance(x, np.ndarray)) or not _bit_moved(x.dtype):
            return None
        out.append(np.asarray(x))
    return out if out else None


def _on_device(result: np.ndarray) -> Any:
    """A move's numpy result, copied whole (C-ordered: not a view of an operand, nor a
    broadcast's strides) and placed on the process's one device."""
    import jax

    return jax.device_put(np.array(result, order="C"))


def _operand(x: Any) -> Any:
    """What a compiled program is specialised to of one operand; None where unknown."""
    import jax

    if isinstance(x, jax.Array):
        return (x.shape, x.dtype, getattr(x, "weak_type", False), x.sharding)
    if isinstance(x, np.ndarray | np.generic):
        return (x.shape, x.dtype)
    if type(x) in _SCALARS:  # a Python scalar: weakly typed, of its type
        return type(x)
    return None


class Executables:
    """The programs a recording compiled, one per operation signature (the module
    docstring). `clear()` drops them."""

    def __init__(self) -> None:
        self._compiled: dict[Any, Any] = {}

    def __len__(self) -> int:
        return len(self._compiled)

    def clear(self) -> None:
        self._compiled.clear()

    def bind(self, primitive: Any, operands: Sequence[Any], params: dict[str, Any]) -> Any:
        """`primitive.bind(*operands, **params)`, through a program compiled once for its
        signature; a move on the host (module docstring)."""
        moved = self._move(primitive.name, operands, params)
        if moved is not None:
            return moved
        key = self._key(primitive, operands, params)
        if key is None:
            return primitive.bind(*operands, **params)
        compiled = self._compiled.get(key)
        if compiled is None:
            import jax

            def run(*xs: Any) -> Any:
                return primitive.bind(*xs, **params)

            run.__name__ = run.__qualname__ = primitive.name  # the program's name, as jax's
            try:
                compiled = jax.jit(run).lower(*operands).compile()
            except Exception:  # not a program of its own: bound as jax binds it, from now on
                compiled = _UNCOMPILED
            self._compiled[key] = compiled
        if compiled is _UNCOMPILED:
            return primitive.bind(*operands, **params)
        return compiled(*operands)

    def _move(self, name: str, operands: Sequence[Any], params: dict[str, Any]) -> Any:
        """A move's result made with numpy (module docstring), or None where it is not."""
        move = HOST_MOVES.get(name)
        if move is None:
            return None
        if any(v is not None for k, v in params.items() if k not in move[0]):
            return None
        xs = _host_operands(operands)
        return None if xs is None else _on_device(move[1](xs, params))

    def row(self, x: Any, k: int) -> Any:
        """Row `k` of `x` (a scan reads its rows so), on the host where moves are; of a
        value walked for its shape only, that of its row."""
        xs = _host_operands([x])
        return x[k] if xs is None else _on_device(xs[0][k])

    def stack(self, parts: Sequence[Any]) -> Any:
        """`parts` stacked on a new leading axis (a scan's results), on the host where moves
        are."""
        import jax.numpy as jnp

        xs = _host_operands(parts)
        if xs is None:
            return jnp.stack([jnp.asarray(x) for x in parts])
        return _on_device(np.stack(xs))

    @staticmethod
    def _key(primitive: Any, operands: Sequence[Any], params: dict[str, Any]) -> Any:
        if primitive.name in BOUND:
            return None
        shapes = tuple(_operand(x) for x in operands)
        if any(s is None for s in shapes):
            return None
        key = (primitive, tuple(sorted(params.items())), shapes)
        try:
            hash(key)
        except TypeError:
            return None
        return key
