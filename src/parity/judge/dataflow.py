"""The dataflow order of a function's outputs: the order in which its program computes
them, read from its jaxpr, whatever container they come out in.

jax sorts a dict's keys when it flattens a pytree, so the outputs of a jitted function
(`{"conv0": ..., "ln0": ..., "gelu0": ...}`) come back in alphabetical order, whatever
order the function built them in. A first divergence named in that order names the wrong
place. `dataflow_order(fn, *args)` traces `fn` (`jax.make_jaxpr`, nothing is computed) and
gives each output leaf a position: the index of the equation that produced it, and inside
a call (`jit`, `custom_jvp_call`, `custom_vjp_call`, `checkpoint`, `while`, ...), a `cond`
(the earliest branch) or a `scan` the position within its body, a `scan`'s outputs also by
iteration: a slice of its stacked outputs at a static index (what `ys[i]` traces to) is
placed at that iteration, and a row of a `jnp.stack` where that row was computed. Slices,
squeezes, reshapes, broadcasts, casts and copies of an array are placed where the array
was computed. An output that is an input or a constant comes first.

A function that converts its outputs to numpy at the end (`jax.tree.map(np.asarray, out)`,
`jax.device_get(out)`, `{k: np.asarray(v) ...}` on what a jitted `apply` returned) gives
numpy arrays; `numpy_conversions()` remembers, while open, the jax array each numpy array
`np.asarray`, `np.array`, `np.asanyarray` or `jax.device_get` made was converted from, so
that a caller that ran the function knows which value of its programs each output is
(`parity.machinery._producer_runner`).

`in_dataflow_order(fn)` wraps `fn` so that it returns `Dataflow`, a flat `{key: array}`
dict (keys as `parity.judge.trees.flatten` names them) in that order; a producer returns
it as it is, `parity.assert_equivalent` and `parity check` follow its order.

jax is imported only inside these functions (the caller has it), never at import.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from parity.errors import ParityError
from parity.judge.floats import count
from parity.judge.trees import flatten

__all__ = [
    "ALPHABETICAL_HINT",
    "DATAFLOW",
    "DECLARED",
    "DECLARED_HINT",
    "HOST",
    "HOST_HINT",
    "MOVES",
    "UNREAD",
    "Conversions",
    "Dataflow",
    "DataflowError",
    "alphabetical",
    "dataflow_order",
    "describe_order",
    "in_dataflow_order",
    "numpy_conversions",
    "order_change",
    "order_hint",
]

#: How a golden's order was made, as recorded in its provenance under `order`: read from
#: the programs that computed the keys; as the producer returned them; as the producer
#: returned them, no jax program having computed any (values made on the host). A check's
#: producer run that needs no order (its goldens pin one read from the programs) leaves it
#: unread, and the golden's pinned order serves; no golden records that.
DATAFLOW = "dataflow"
DECLARED = "declared"
HOST = "host"
UNREAD = "unread"

#: Primitives that move or reshape data without computing it: an output made by one is
#: placed where its operand was computed.
MOVES = frozenset(
    {
        "slice",
        "squeeze",
        "reshape",
        "expand_dims",
        "transpose",
        "copy",
        "copy_p",
        "dynamic_slice",
        "device_put",
        "broadcast_in_dim",
        "convert_element_type",
    }
)

Position = tuple[int, ...]


class DataflowError(ParityError, TypeError):
    """The dataflow order of a function cannot be derived (it does not trace: it turns a
    traced value into numpy, or branches on one in Python).

    **Fields:** `reason`, one line.
    """

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


class Conversions(list[Any]):
    """The numpy arrays `numpy_conversions` saw made of jax arrays (kept alive, so that `id`
    of one names it), and `source`: `id` of each -> the jax array it was made of."""

    def __init__(self) -> None:
        super().__init__()
        self.source: dict[int, Any] = {}

    def add(self, out: Any, source: Any) -> None:
        self.append(out)
        self.source[id(out)] = source


class Dataflow(dict[str, Any]):
    """A flat `{key: array}` dict whose insertion order is its program's dataflow order
    (made by `in_dataflow_order`): flattening it keeps that order."""


def _sub_jaxprs(params: dict[str, Any], n_out: int) -> list[Any]:
    """The open jaxprs in an equation's parameters whose outputs are the equation's own,
    one to one (a call's body, a while's body, each branch of a cond)."""
    from jax.extend import core as jex

    found: list[Any] = []
    for value in params.values():
        for item in value if isinstance(value, tuple | list) else (value,):
            inner = getattr(item, "jaxpr", item)  # a ClosedJaxpr holds its Jaxpr
            if isinstance(inner, jex.Jaxpr) and len(inner.outvars) == n_out:
                found.append(inner)
    return found


def _static_start(eqn: Any) -> int | None:
    """The leading index a `slice` or `dynamic_slice` with literal starts reads from."""
    from jax.extend import core as jex

    if eqn.primitive.name == "slice":
        return int(eqn.params["start_indices"][0]) if eqn.params["start_indices"] else None
    if eqn.primitive.name == "dynamic_slice" and len(eqn.invars) > 1:
        first = eqn.invars[1]
        if isinstance(first, jex.Literal):
            return int(np.asarray(first.val))
    return None


def _position(
    var: Any, jaxpr: Any, seen: dict[int, dict[Any, tuple[int, int]]], iteration: int | None = None
) -> Position:
    """Where in `jaxpr` the value `var` is computed (see the module docstring); `seen`
    keeps each jaxpr's map from a value to the equation that made it."""
    from jax.extend import core as jex

    if isinstance(var, jex.Literal):
        return (-1,)
    if id(jaxpr) not in seen:
        seen[id(jaxpr)] = {
            v: (i, j) for i, eqn in enumerate(jaxpr.eqns) for j, v in enumerate(eqn.outvars)
        }
    producers = seen[id(jaxpr)]
    if var not in producers:  # an input of this jaxpr
        return (-1,)
    i, j = producers[var]
    eqn = jaxpr.eqns[i]
    name = eqn.primitive.name
    if name in MOVES and eqn.invars and not isinstance(eqn.invars[0], jex.Literal):
        # Only a slice says which row of its operand it reads; through the other moves the
        # leading axis is another one.
        return _position(eqn.invars[0], jaxpr, seen, _static_start(eqn))
    stacked = name == "stack" and eqn.params.get("axis") == 0
    if iteration is not None and (
        stacked or (name == "concatenate" and eqn.params["dimension"] == 0)
    ):
        # A row of a stack (`jnp.stack(acts)[i]`): where that row's operand was computed.
        for operand in eqn.invars:
            rows = 1 if stacked or not operand.aval.shape else int(operand.aval.shape[0])
            if iteration < rows:
                if isinstance(operand, jex.Literal):
                    return (-1,)
                return _position(operand, jaxpr, seen, None if stacked else iteration)
            iteration -= rows
        return (i,)
    subs = _sub_jaxprs(eqn.params, len(eqn.outvars))
    if not subs:
        return (i,)
    if name == "scan":
        length = int(eqn.params["length"])
        carry = j < int(eqn.params["num_carry"])
        if carry or iteration is None:  # a final carry, or the whole stack: the last step
            k = length - 1
        else:  # row `iteration` of the stacked outputs; a reverse scan makes the last row first
            k = min(max(iteration, 0), length - 1)
            k = length - 1 - k if eqn.params.get("reverse") else k
        return (i, k, *_position(subs[0].outvars[j], subs[0], seen))
    return (i, *min(_position(sub.outvars[j], sub, seen, iteration) for sub in subs))


def dataflow_order(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[str]:
    """The keys of `fn(*args, **kwargs)`'s outputs in the order its program computes them.

    **Arguments:**

    - `fn`: a function jax can trace (a `jax.jit`-ed one, or any function of jax arrays);
      it is traced, not run.
    - `args`, `kwargs`: what `fn` is called with.

    **Returns:** every output key, as `parity.judge.trees.flatten` names them
    (`taps.conv0`), earliest computed first; ties keep the outputs' own order. Raises
    `DataflowError` when `fn` does not trace (the reason in one line: return its outputs
    through `in_dataflow_order` from the traceable part, or declare the order yourself).

    **Example:**

    ```python
    keys = parity.dataflow_order(forward, params, x)  # ["input", "hidden0", ..., "head"]
    parity.assert_equivalent(forward(params, x), old_forward(params, x), order=keys)
    ```
    """
    import jax

    try:
        closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args, **kwargs)
    except Exception as e:
        raise DataflowError(
            f"{getattr(fn, '__name__', fn)!s} does not trace, so its dataflow order cannot be "
            f"read from its program ({type(e).__name__}: {_words(str(e), 200)})"
        ) from None
    order = _ranked(closed, shapes)
    return order


def _words(text: str, limit: int) -> str:
    """`text` on one line, at most `limit` characters, cut between words (never mid-word)."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return flat[:limit].rsplit(" ", 1)[0] + " ..."


def _ranked(closed: Any, shapes: Any) -> list[str]:
    """The output keys of a traced program, earliest computed first. Outputs computed at
    one place (the outputs of one call, a dict's values fanned out of one stacked array)
    keep the flattened outputs' own order (a dict's keys as jax sorts them)."""
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(shapes)
    markers = jax.tree_util.tree_unflatten(treedef, [np.int64(j) for j in range(len(leaves))])
    keys = {int(v): k for k, v in flatten(markers).items()}
    jaxpr = closed.jaxpr
    seen: dict[int, dict[Any, tuple[int, int]]] = {}
    places = [_position(v, jaxpr, seen) for v in jaxpr.outvars]
    ranked = sorted(range(len(leaves)), key=lambda j: (places[j], j))
    return [keys[j] for j in ranked if j in keys]


@contextlib.contextmanager
def numpy_conversions() -> Iterator[Conversions]:
    """While open, numpy's conversions record the numpy arrays they make of jax arrays (see
    the module docstring).

    **Yields:** the `Conversions` those arrays are appended to, each with the jax array it
    was made of (kept alive, so that `id` of an output names one of them for as long as
    the caller holds it).
    """
    import jax

    made = Conversions()

    def through(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def convert(x: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(x, *args, **kwargs)
            if isinstance(x, jax.Array):
                made.add(out, x)
            return out

        return convert

    def device_get(x: Any) -> Any:
        out = get(x)
        for leaf, source in zip(
            jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(x), strict=False
        ):
            if isinstance(leaf, np.ndarray):
                made.add(leaf, source)
        return out

    get = jax.device_get
    saved = {name: getattr(np, name) for name in ("asarray", "array", "asanyarray")}
    try:
        for name, original in saved.items():
            setattr(np, name, through(original))
        jax.device_get = device_get
        yield made
    finally:
        for name, original in saved.items():
            setattr(np, name, original)
        jax.device_get = get


def in_dataflow_order(fn: Callable[..., Any]) -> Callable[..., Dataflow]:
    """Wrap `fn` so that its outputs come back flat, in dataflow order.

    **Arguments:**

    - `fn`: a function jax can trace, returning a pytree of arrays (a dict of taps from a
      `jax.jit`-ed `apply`, say).

    **Returns:** a function taking `fn`'s arguments that runs `fn` and returns a `Dataflow`:
    `{key: array}` with the keys `parity.judge.trees.flatten` gives `fn`'s outputs, in the
    order `dataflow_order` finds. Return it from a producer, or pass it to
    `parity.assert_equivalent`: the first divergence is then the earliest computed key that
    differs. Raises `DataflowError` when `fn` does not trace.

    **Example:**

    ```python
    taps = parity.in_dataflow_order(jax.jit(forward))(params, x)
    list(taps)  # the keys as the program computed them, not jax's alphabetical dict order
    ```
    """

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Dataflow:
        out = fn(*args, **kwargs)
        order = dataflow_order(fn, *args, **kwargs)
        flat = flatten(out, to_array=lambda x: x)
        return Dataflow((k, flat[k]) for k in order)

    return wrapped


def alphabetical(keys: Sequence[str]) -> bool:
    """Whether `keys` (three or more) are in sorted order: what a dict flattened by jax
    gives, whatever order the program computed it in."""
    return len(keys) >= 3 and list(keys) == sorted(keys)


#: Said where a group's forward order is alphabetical and was not read from its program.
ALPHABETICAL_HINT = (
    "the forward order is alphabetical (jax sorts a dict's keys), so the first divergence "
    "may not be where the change first shows: return the producer's outputs as jax arrays "
    "(or numpy arrays made of them at the end), or through parity.in_dataflow_order "
    "(docs/adopting.md, section 2)"
)


#: Said where a group's forward order was not read from its program and is not alphabetical.
DECLARED_HINT = (
    "declared: the order the producer returned its keys in, not read from its program, so "
    "the first divergence is named in that order (docs/adopting.md, section 2)"
)


#: Said where no jax program computed a group's values: there is no program order to read.
HOST_HINT = (
    "host: no jax program the producer ran computed these values (they were made on the "
    "host), so they are compared in the order it returned them"
)


def order_hint(source: object, keys: Sequence[str]) -> str | None:
    """The one-line hint for a golden group's order, or None: every check of a group whose
    order was not read from its program says so in its header.

    **Arguments:**

    - `source`: how the order was made, as recorded in the golden's provenance (`order`):
      `"dataflow"`, `"declared"`, or None for a file pinned before it was recorded.
    - `keys`: the group's keys in its pinned order.

    **Returns:** None for a dataflow order; else `ALPHABETICAL_HINT` where the order is
    exactly alphabetical, `HOST_HINT` where no jax program computed the values,
    `DECLARED_HINT` otherwise.
    """
    if source == DATAFLOW:
        return None
    if alphabetical(keys):
        return ALPHABETICAL_HINT
    return HOST_HINT if source == HOST else DECLARED_HINT


def order_change(
    old_source: object, old_keys: Sequence[str], new_source: object, new_keys: Sequence[str]
) -> str:
    """One line naming how a repin changes a group's forward order (`"order: declared ->
    dataflow, 3 keys moved"`), or "" where neither how it was made nor the keys' order
    changed."""
    moved = sum(a != b for a, b in zip(old_keys, new_keys, strict=False))
    if old_source == new_source and not moved:
        return ""
    how = f"{old_source or 'not recorded'} -> {new_source}" if old_source != new_source else ""
    keys = f"{count(moved, 'key')} moved" if moved else ""
    return "order: " + ", ".join(x for x in (how, keys) if x)


def describe_order(source: object) -> str:
    """How a golden's forward order was made, in words, from its provenance's `order`."""
    if source == DATAFLOW:
        return "dataflow: as the producer's program computed the keys"
    if source == HOST:
        return "host: as the producer returned them (no jax program computed them)"
    return (
        "declared: the order the producer returned its keys in (parity did not read it from "
        "the program)" + ("" if source == DECLARED else "; not recorded, pinned before it was")
    )
