"""Flatten pytrees into `{key: array}`, keys in the style of `jax.tree_util.keystr`.

Plain containers (mappings, lists, tuples, named tuples, `None`) are walked here without
jax; any other node (an equinox module, a dataclass or custom class registered as a jax
pytree) is flattened through `jax.tree_util`, which is imported only then. Such objects
exist only where jax was already imported, so `import parity` stays free of jax.

A leaf's key is its path joined by ".": `{"a": [x, y]}` gives `a.0` and `a.1`, an
equinox `Linear` inside `{"mlp": ...}` gives `mlp.weight` and `mlp.bias` (what
`jax.tree_util.keystr(path, simple=True, separator=".")` prints). Leaves that are not
arrays (the activation function stored in an equinox MLP, a string) cannot be compared as
arrays; they are collected separately so that a caller can compare them by `==`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from parity.judge._chunks import is_source

__all__ = ["flatten", "non_array_differences"]


def _is_array_like(x: Any) -> bool:
    if isinstance(x, np.ndarray | np.generic | bool | int | float | complex):
        return True
    # jax arrays and anything else with an array interface (not str/bytes/callables)
    return hasattr(x, "__array__") or hasattr(x, "__array_interface__")


def _jax_children(node: Any) -> list[tuple[str, Any]] | None:
    """`node`'s leaves with their paths, through jax, if jax knows it as a pytree with more
    than itself inside; else None (the node is a leaf)."""
    if "jax" not in sys.modules:
        return None
    import jax

    if isinstance(node, jax.Array):
        return None
    leaves, _ = jax.tree_util.tree_flatten_with_path(node)
    if len(leaves) == 1 and leaves[0][1] is node and not leaves[0][0]:
        return None
    return [(jax.tree_util.keystr(path, simple=True, separator="."), leaf) for path, leaf in leaves]


def _unwrapped(node: Any) -> Any:
    """The array inside an array-like wrapper that jax flattens to that one array (a flax
    nnx `Variable`): the array the program returned, so that it is known for the value a
    program computed; other leaves as they are."""
    if isinstance(node, np.ndarray | np.generic) or "jax" not in sys.modules:
        return node
    import jax

    if isinstance(node, jax.Array):
        return node
    leaves = jax.tree_util.tree_leaves(node)
    return leaves[0] if len(leaves) == 1 and isinstance(leaves[0], jax.Array) else node


def flatten(
    tree: Any,
    *,
    sep: str = ".",
    non_arrays: dict[str, Any] | None = None,
    to_array: Callable[[Any], np.ndarray] = np.asarray,
    bare: str | None = None,
) -> dict[str, np.ndarray]:
    """Flatten a pytree of arrays into `{"a.b.c": array}`.

    Mappings contribute their keys (as `str`), lists and tuples their indices, named
    tuples their field names; `None` is an empty subtree (as in jax); other registered
    pytrees (equinox modules, ...) their jax key paths. Array leaves go through
    `to_array`. A flat mapping whose keys already contain `sep` comes back unchanged, so
    flat and nested inputs mix.

    **Arguments:**

    - `tree`: a mapping, list, tuple or jax pytree of arrays.
    - `sep`: the separator between path parts; `"."`.
    - `non_arrays`: if given, leaves that are not arrays (functions, strings, ...) are put
        here by key instead of raising.
    - `to_array`: turns an array leaf into a numpy array, in traversal order (default
      `np.asarray`; a multi-process run passes `parity.machinery._worker.to_host`, a gather every
      process joins in the same order).
    - `bare`: the key a bare array at the top gets (a one-leaf pytree, as in jax and
      chex), for callers comparing two user trees; None (the default) refuses it, where
      keys must match a golden group's names.

    **Returns:** a dict from joined key to array, in traversal order. Raises `ValueError` if
    two paths join to the same key, and `TypeError` if `tree` is a bare array (without
    `bare`) or holds a non-array leaf and `non_arrays` is None.
    """
    if _is_array_like(tree):
        if bare is not None:
            return {bare: to_array(tree)}
        raise TypeError(
            f"flatten needs a container of arrays at the top, got {type(tree).__name__}; "
            "wrap a single array as {'name': array}"
        )
    out: dict[str, np.ndarray] = {}

    def leaf(path: str, node: Any) -> None:
        if path in out or (non_arrays is not None and path in non_arrays):
            raise ValueError(f"flatten: two paths join to the key {path!r}")
        # A `Source` (a golden file's array, read block by block) is a leaf.
        if is_source(node):
            out[path] = node  # read block by block by the comparison, not loaded here
        elif _is_array_like(node):
            out[path] = to_array(_unwrapped(node))
        elif non_arrays is not None:
            non_arrays[path] = node
        else:
            raise TypeError(
                f"leaf {path!r} is a {type(node).__name__}, not an array; compare arrays only "
                "(for an equinox module, eqx.filter(tree, eqx.is_array) keeps the arrays)"
            )

    def visit(node: Any, path: str) -> None:
        items: Iterable[tuple[Any, Any]]
        if node is None:
            return
        if isinstance(node, Mapping):
            items = cast(Mapping[Any, Any], node).items()
        elif isinstance(node, tuple) and hasattr(node, "_fields"):
            items = zip(cast(Any, node)._fields, cast(tuple[Any, ...], node), strict=True)
        elif isinstance(node, list | tuple):
            items = enumerate(cast(Sequence[Any], node))
        elif _is_array_like(node) or is_source(node):
            leaf(path, node)
            return
        else:
            children = _jax_children(node)
            if children is None:
                leaf(path, node)
                return
            for name, child in children:
                joined = sep.join(p for p in (path, name.replace(".", sep)) if p)
                leaf(joined, child)
            return
        for name, child in items:
            visit(child, f"{path}{sep}{name}" if path else str(name))

    visit(tree, "")
    return out


def _same(a: Any, b: Any) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # an object whose == raises or is ambiguous
        return False


def non_array_differences(actual: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """The non-array leaves of two trees (as `flatten(..., non_arrays=...)` collects them)
    that differ: one line per key, in key order, for a key on one side only or whose
    values are not `==` (an `==` that raises or is ambiguous counts as different). The one
    comparison of such leaves, for `assert_equivalent` and the pytest fixture alike."""
    return [
        f"  {k}: actual {actual.get(k, '<absent>')!r} vs expected {expected.get(k, '<absent>')!r}"
        for k in sorted(set(actual) | set(expected))
        if k not in actual or k not in expected or not _same(actual[k], expected[k])
    ]
