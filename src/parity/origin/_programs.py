"""The programs a producer runs: each jitted function it calls and each operation it runs
eagerly, with the concrete arrays it was called with, in the order it ran (docs/design.md,
"The unit is the programs a producer runs").

A producer need not trace as a whole: it may load weights, place them on a mesh
(`jax.make_array_from_callback`), and call jitted functions in a Python loop. What always
exists is each program it dispatches. `capture()` keeps them while it is open:

- a call of a jitted function at the top level (no trace open) is kept with its closed
  jaxpr and its flat arguments. jax caches such calls in C++ after the first, and a cached
  call never reaches Python again: while `capture()` is open (and only for top-level user
  calls) jax is told the call has no fast path, so every call is seen;
- an operation bound eagerly outside any jit (`x.astype(...)`, `jax.device_put`) is kept as
  a program of one equation, tagged with the user's frame that ran it.

Each output array of a kept program is remembered (by weak reference) as what that program
made, so an argument of a later program that is one of them is *linked* to it: a train step
fed the state the previous step returned reads that step's values. An argument that no kept
program made (an array built from host data, a numpy array) is an input, matched by value.
A program that donates its arguments has them copied to the host first, as they are gone
after the call.

How jax is told to show them is `parity.origin._adapter`'s business (the one module that
reads jax's internals): the hooks are in jax only while `capture()` is open, and where this
jax cannot be hooked, or a hook fails, the capture says why in one line (`Capture.failure`)
and the producer runs as it would without it.

`parity.origin._record.record_programs` then runs the kept programs op by op, one value
space for all of them. jax is imported inside these functions only (the caller has it).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import parity.origin._adapter as adapter
from parity.origin._places import UNPLACED, Where

__all__ = ["Capture", "Link", "Program", "capture"]


@dataclass(frozen=True)
class Link:
    """An argument that an earlier kept program made: its output `output` of program
    `program` (positions in `Capture.programs`)."""

    program: int
    output: int


@dataclass(frozen=True)
class Program:
    """One program the producer dispatched.

    **Fields:** `jaxpr` (a closed jaxpr; an operation run outside any jit is a program of
    one equation), `args` (per flat argument a `Link` or the concrete array), `frame` (the
    user's own frame that called it and the library's frame beside it:
    `parity.origin._places.user_frame_of`; an equation of the program that names no
    frame of its own, as in a library's jitted function, is placed there).
    """

    jaxpr: Any
    args: tuple[Any, ...]
    frame: Where = UNPLACED


@dataclass
class Capture:
    """What `capture()` kept while open.

    **Fields:** `programs` (in dispatch order), `made` (`id` of an output array -> its
    `Link` and a weak reference that says whether that array is still the one meant),
    `status` (the interception's: whether the hooks went in, and why they stopped).
    """

    programs: list[Program] = field(default_factory=list)
    made: dict[int, tuple[Link, Any]] = field(default_factory=dict)
    status: adapter.Intercept = field(default_factory=adapter.Intercept)

    @property
    def failure(self) -> str:
        """Why the programs were not (all) seen, in one line; "" where they were."""
        return self.status.failure

    def link_of(self, array: Any) -> Link | None:
        """The `Link` of an array a kept program returned, or None."""
        entry = self.made.get(id(array))
        if entry is None:
            return None
        link, ref = entry
        return link if ref() is array else None

    def _keep(self, jaxpr: Any, args: Any, outs: Any, frame: Where) -> None:
        flat = [self.link_of(a) or a for a in args]
        index = len(self.programs)
        self.programs.append(Program(jaxpr, tuple(flat), frame))
        for k, out in enumerate(outs):
            try:
                ref = weakref.ref(out)
            except TypeError:  # not an array object (a token, a Python scalar)
                continue
            self.made[id(out)] = (Link(index, k), ref)


class _Keeper:
    """The `parity.origin._adapter.Listener` that keeps what it is told in a `Capture`."""

    def __init__(self, cap: Capture) -> None:
        self.cap = cap

    def jitted(self, jaxpr: Any, args: list[Any], outs: list[Any]) -> None:
        self.cap._keep(jaxpr, args, outs, _user_frame_now())

    def eager(
        self, primitive: Any, args: list[Any], params: dict[str, Any], outs: list[Any]
    ) -> None:
        try:
            jaxpr = _one_equation(primitive, args, params)
        except Exception:  # an operation jax cannot stage on its own: its outputs are inputs
            return
        self.cap._keep(jaxpr, args, outs, _user_frame_now())


def quiet() -> contextlib.AbstractContextManager[None]:
    """While open, nothing this thread dispatches is kept (the recording's own op-by-op
    evaluation)."""
    return adapter.quiet()


def _user_frame_now() -> Where:
    from parity.origin._places import user_frame_of

    try:
        return user_frame_of(adapter.current_source_info())
    except Exception:  # a jax without this private API: the value stays unplaced
        return UNPLACED


def _one_equation(primitive: Any, args: Any, params: Any) -> Any:
    """A closed jaxpr of the one equation `primitive(*args, **params)`."""
    import jax

    def one(*xs: Any) -> Any:
        return primitive.bind(*xs, **params)

    with adapter.quiet():
        return jax.make_jaxpr(one)(*args)


@contextlib.contextmanager
def capture() -> Iterator[Capture]:
    """Keep every program dispatched at the top level while open (module docstring). The
    hooks are in jax only while it is open (`parity.origin._adapter.intercept`); where this
    jax cannot be hooked, or a hook failed, `Capture.failure` says so in one line and the
    code under it runs all the same.

    **Yields:** the `Capture` the programs are appended to.
    """
    cap = Capture()
    with adapter.intercept(_Keeper(cap)) as status:
        cap.status = status
        yield cap
