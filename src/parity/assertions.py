"""`assert_equivalent`: compare two pytrees under tolerance classes, chex-style.

For any test framework or none: it raises `AssertionError` whose message is the failure
table (per class, the first divergence in forward order, every failing key with its
reason). A thin layer over `parity.check`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from parity.check import BARE_KEY, class_resolver
from parity.judge.classes import REGISTRY, ToleranceClass
from parity.judge.compare import Comparison, Order, compare_trees
from parity.judge.tolerance import ClassMap, UnknownClassError
from parity.judge.trees import flatten
from parity.report import format_table
from parity.results import CheckError

__all__ = ["assert_equivalent"]


def _same(a: Any, b: Any) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # an object whose == raises or is ambiguous
        return False


def assert_equivalent(
    actual: Any,
    expected: Any,
    *,
    class_map: ClassMap | str = "bitwise",
    order: Order | None = None,
    overrides: Sequence[tuple[str, str]] = (),
    registry: Mapping[str, ToleranceClass] = REGISTRY,
) -> Comparison:
    """Assert that every array leaf of `actual` holds its tolerance class against `expected`.

    **Arguments:**

    - `actual`, `expected`: pytrees: dicts, lists, tuples, named tuples, and (where jax is
        imported) equinox modules and other registered pytrees. A leaf's key is its path,
        joined by "." (`mlp.layers.0.weight`); a bare array is a tree of one leaf, named
        `array`. Non-array leaves (an equinox MLP's activation function) are compared with
        `==`.
    - `class_map`: a class name for every leaf (default `"bitwise"`), or a `ClassMap` by
        key pattern.
    - `order`: the forward order (keys, or a callable key -> sort key) in which the first
        divergence is named; default: `expected`'s own order (as `flatten` walks it), then
        keys only in `actual`. A dict that came out of `jax.jit` is in alphabetical order
        (jax sorts dict keys): pass the outputs of `parity.in_dataflow_order(fn)(...)`, or
        `order=parity.dataflow_order(fn, ...)`, to walk them as the program computed them.
    - `overrides`: `(pattern, class)` rules tried before `class_map`.
    - `registry`: the classes by name.

    **Returns:** the `Comparison`, when it passes. Raises `AssertionError` with the failure
    table otherwise (missing and unexpected leaves included), and `ValueError` for a class
    name the registry lacks.
    """
    statics_a: dict[str, Any] = {}
    statics_e: dict[str, Any] = {}
    flat_a = flatten(actual, non_arrays=statics_a, bare=BARE_KEY)
    flat_e = flatten(expected, non_arrays=statics_e, bare=BARE_KEY)
    resolve = class_resolver(overrides=overrides, class_map=class_map)
    try:
        comparison = compare_trees(
            flat_a, flat_e, resolve, registry=registry, order=order, reference="expected"
        )
    except UnknownClassError as e:
        raise ValueError(str(e)) from None
    except TypeError as e:
        raise CheckError(str(e)) from None
    static_problems = [
        f"  {k}: actual {statics_a.get(k, '<absent>')!r} vs expected "
        f"{statics_e.get(k, '<absent>')!r}"
        for k in sorted(set(statics_a) | set(statics_e))
        if k not in statics_a or k not in statics_e or not _same(statics_a[k], statics_e[k])
    ]
    if comparison.passed and not static_problems:
        return comparison
    message = "trees are not equivalent\n" + format_table(comparison)
    if static_problems:
        message += f"non-array leaves that differ ({len(static_problems)}):\n"
        message += "\n".join(static_problems) + "\n"
    raise AssertionError(message)
