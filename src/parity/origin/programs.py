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

`parity.origin.record.record_programs` then runs the kept programs op by op, one value
space for all of them. jax is imported inside these functions only (the caller has it).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from parity.origin.interpreter import UNPLACED, Where

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
    `parity.origin.interpreter.user_frame_of`; an equation of the program that names no
    frame of its own, as in a library's jitted function, is placed there).
    """

    jaxpr: Any
    args: tuple[Any, ...]
    frame: Where = UNPLACED


@dataclass
class Capture:
    """What `capture()` kept while open.

    **Fields:** `programs` (in dispatch order), `made` (`id` of an output array -> its
    `Link` and a weak reference that says whether that array is still the one meant).
    """

    programs: list[Program] = field(default_factory=list)
    made: dict[int, tuple[Link, Any]] = field(default_factory=dict)

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


_state = threading.local()


def _active() -> Capture | None:
    if getattr(_state, "depth", 0):
        return None
    return getattr(_state, "capture", None)


@contextlib.contextmanager
def _nested() -> Iterator[None]:
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def quiet() -> contextlib.AbstractContextManager[None]:
    """While open, nothing this thread dispatches is kept (the recording's own op-by-op
    evaluation)."""
    return _nested()


def _user_frame_now() -> Where:
    from jax._src import source_info_util

    from parity.origin.interpreter import user_frame_of

    try:
        return user_frame_of(source_info_util.current().traceback)
    except Exception:  # a jax without this private API: the value stays unplaced
        return UNPLACED


_installed = threading.Event()


def _install() -> None:
    """Put the hooks in jax, once per process (they do nothing while no capture is open)."""
    if _installed.is_set():
        return
    from jax._src import core, pjit

    run_python_pjit = pjit._run_python_pjit
    get_fastpath_data = pjit._get_fastpath_data
    process_primitive = core.EvalTrace.process_primitive

    def run_and_keep(p: Any, args_flat: Any, fun: Any, args: Any, kwargs: Any) -> Any:
        cap = _active()
        if cap is None or not core.trace_state_clean():
            return run_python_pjit(p, args_flat, fun, args, kwargs)
        jaxpr = p.params["jaxpr"]
        frame = _user_frame_now()
        donated = p.params.get("donated_invars", ())
        kept_args = [_host_copy(a) if d else a for a, d in zip(args_flat, donated, strict=False)]
        kept_args += list(args_flat[len(kept_args) :])
        with _nested():
            result = run_python_pjit(p, args_flat, fun, args, kwargs)
        cap._keep(jaxpr, kept_args, result[1], frame)
        return result

    def no_fastpath(*a: Any, **k: Any) -> Any:
        if _active() is not None and core.trace_state_clean():
            return None  # every top-level call comes back through Python while capturing
        return get_fastpath_data(*a, **k)

    def eager(self: Any, primitive: Any, args: Any, params: Any, /) -> Any:
        cap = _active()
        if cap is None:
            return process_primitive(self, primitive, args, params)
        frame = _user_frame_now()
        with _nested():
            outs = process_primitive(self, primitive, args, params)
        flat = outs if primitive.multiple_results else [outs]
        try:
            jaxpr = _one_equation(primitive, args, params)
        except Exception:  # an operation jax cannot stage on its own: its outputs are inputs
            return outs
        cap._keep(jaxpr, list(args), list(flat), frame)
        return outs

    pjit._run_python_pjit = run_and_keep
    pjit._get_fastpath_data = no_fastpath
    core.EvalTrace.process_primitive = eager
    _installed.set()


def _host_copy(a: Any) -> Any:
    import jax
    import numpy as np

    if isinstance(a, jax.Array) and not jax.numpy.issubdtype(a.dtype, jax.dtypes.extended):
        return np.asarray(a)
    return a


def _one_equation(primitive: Any, args: Any, params: Any) -> Any:
    """A closed jaxpr of the one equation `primitive(*args, **params)`."""
    import jax

    def one(*xs: Any) -> Any:
        return primitive.bind(*xs, **params)

    with _nested():
        return jax.make_jaxpr(one)(*args)


def _forget_fast_paths() -> None:
    """Drop jax's C++ dispatch caches: a function called before the capture opened would
    otherwise be called from there, never reaching Python (its compiled program stays in
    jax's Python caches: the next call only looks it up)."""
    from jax._src import pjit

    for name in ("_cpp_pjit_cache_fun_only", "_cpp_pjit_cache_explicit_attributes"):
        cache = getattr(pjit, name, None)
        if cache is not None:
            cache.clear()


@contextlib.contextmanager
def capture() -> Iterator[Capture]:
    """Keep every program dispatched at the top level while open (module docstring).

    **Yields:** the `Capture` the programs are appended to.
    """
    _install()
    _forget_fast_paths()
    previous = getattr(_state, "capture", None)
    cap = Capture()
    _state.capture = cap
    try:
        yield cap
    finally:
        _state.capture = previous
