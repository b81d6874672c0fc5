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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Executables"]

_SCALARS = (bool, int, float, complex)
_UNCOMPILED: Any = object()
#: Primitives whose eager run is not one program of their own (jax runs their
#: implementation op by op, or they move data between devices): bound as jax binds them.
_BOUND = frozenset({"random_bits", "random_seed", "random_split", "random_fold_in",
                    "random_wrap", "random_unwrap", "device_put", "pure_callback",
                    "io_callback", "debug_callback"})  # fmt: skip


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
        signature."""
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

    @staticmethod
    def _key(primitive: Any, operands: Sequence[Any], params: dict[str, Any]) -> Any:
        if primitive.name in _BOUND:
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
