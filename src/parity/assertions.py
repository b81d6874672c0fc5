"""`assert_equivalent`: compare two pytrees under tolerance classes, chex-style.

For any test framework or none: it raises `AssertionError` whose message is the failure
table (per class, the first divergence in forward order, every failing key with its
reason). A live check (`parity.check.check_live`, through the one comparison every check
makes) plus the tree's non-array leaves, compared with `==`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from parity.check import check_live
from parity.judge.classes import REGISTRY, ToleranceClass
from parity.judge.compare import Comparison, Order
from parity.judge.tolerance import ClassMap
from parity.origin.api import origin_line
from parity.report import format_table

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
    new_fn: Callable[..., Any] | None = None,
    old_fn: Callable[..., Any] | None = None,
    args: tuple[Any, ...] = (),
    kwargs: Mapping[str, Any] | None = None,
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
    - `new_fn`, `old_fn`, `args`, `kwargs`: the functions whose outputs `actual` and
        `expected` are, and what they were called with: a failure then ends with an
        `origin:` line naming the first operation of `new_fn` that computes what `old_fn`
        never did, at its source line (`parity.localise`), or why there is none.

    **Returns:** the `Comparison`, when it passes. Raises `AssertionError` with the failure
    table otherwise (missing and unexpected leaves included), and `parity.CheckError` for
    input it cannot compare (a class name the registry lacks, an object array), as every
    check does.
    """
    statics_a: dict[str, Any] = {}
    statics_e: dict[str, Any] = {}
    comparison = check_live(
        actual, expected, class_map=class_map, overrides=overrides, order=order,
        registry=registry, name="assert_equivalent", non_arrays=(statics_a, statics_e),
    ).comparison  # fmt: skip
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
    first = comparison.first_failure
    if new_fn is not None and old_fn is not None and first is not None:
        options = {"class_map": class_map, "overrides": overrides, "registry": registry}
        message += origin_line(new_fn, old_fn, args, kwargs or {}, key=first.key, **options)
    raise AssertionError(message)
