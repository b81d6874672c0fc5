"""What parity knows about the order of a producer's outputs, wherever it was read: how a
golden's order was made (`DATAFLOW`, `DECLARED`, `HOST`, `UNREAD`), the hints a check
gives where it was not read from the programs, and `Dataflow`, the flat dict a producer
returns already in dataflow order.

The order itself is read in one place, from the programs that computed the outputs, by
one algorithm for a live function and for the programs a producer ran
(`parity.origin._record`: `dataflow_order`, `in_dataflow_order`, `record_programs`): each
output at the depth of the value it reads, the longest chain of operations from an input.
jax sorts a dict's keys when it flattens a pytree, so the outputs of a jitted function
come back in alphabetical order, whatever order the function built them in; a first
divergence named in that order names the wrong place.

A function that converts its outputs to numpy at the end (`jax.tree.map(np.asarray, out)`,
`jax.device_get(out)`, `{k: np.asarray(v) ...}` on what a jitted `apply` returned) gives
numpy arrays; `numpy_conversions()` remembers, while open, the jax array each numpy array
`np.asarray`, `np.array`, `np.asanyarray` or `jax.device_get` made was converted from, so
that a caller that ran the function knows which value of its programs each output is
(`parity.machinery._producer_runner`).

jax is imported only inside these functions (the caller has it), never at import.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from parity._errors import ParityError
from parity.judge._floats import count

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
    "describe_order",
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
