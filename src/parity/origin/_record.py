"""`record(fn, *args)`: run a function's program equation by equation, keeping every value.

`fn` is traced (`jax.make_jaxpr`) and its jaxpr evaluated one equation at a time, with
each primitive's own `bind` (`parity.origin._interpreter`): the numbers are what that
operation computes when run on its own. `record_programs` does the same for the programs a
producer dispatched (`parity.origin._programs.capture`), in one value space, and orders the
producer's keys by the values they were converted from.

jax is imported inside these functions only (the caller has it).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import traceback as tb
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from parity.judge._dataflow import Dataflow, DataflowError
from parity.judge._trees import flatten
from parity.origin._executables import Executables
from parity.origin._interpreter import (
    MOVES,
    Aval,
    Interpreter,
    LocaliseError,
    Ref,
    as_jax,
    dtype_of,
    shape_of,
    to_host,
)
from parity.origin._places import UNPLACED, user_frame_of
from parity.origin._progress import Progress
from parity.origin._recording import Recording

if TYPE_CHECKING:
    from parity.origin._programs import Capture

__all__ = [
    "BARE",
    "MOVES",
    "LocaliseError",
    "RecordingError",
    "dataflow_order",
    "in_dataflow_order",
    "record",
    "record_programs",
]

#: The key a bare array output gets (as `assert_equivalent` names a bare array).
BARE = "array"


class RecordingError(LocaliseError):
    """An operation raised while its program was recorded op by op (an operation that
    cannot run on its own: a callback that refuses to, a primitive this jax cannot bind
    alone), raised from the original exception (`__cause__`).

    **Fields:** `error` (the exception's type name) and `message` (its message, on one
    line); `primitive` (the operation being recorded) and `place` (its source line,
    `file:line in function`), each "" where unknown; `traceback` (the original traceback,
    whole, as text); and `reason`, `reason_with()` without a log.
    """

    def __init__(
        self, error: str, message: str, *, primitive: str = "", place: str = "", traceback: str = ""
    ) -> None:
        self.error, self.message = error, message
        self.primitive, self.place, self.traceback = primitive, place, traceback
        super().__init__(self.reason_with())

    def reason_with(self, log: Path | str | None = None) -> str:
        """The one-line reason: what raised, in which operation, where, and the log that
        keeps the traceback (`log`, where one was written)."""
        what = f"recording raised {self.error}"
        if self.primitive:
            what += f" in the operation {self.primitive}"
        if self.place:
            what += f" at {self.place}"
        said = self.message if len(self.message) <= 200 else self.message[:200] + " ..."
        kept = f" (traceback in {log})" if log else ""
        return f"{what}: {said}{kept}"

    @classmethod
    def of(cls, e: BaseException) -> RecordingError:
        """`e` as a `RecordingError`: the operation read from the interpreter's frame in
        its traceback (the innermost equation it was running; its own code is left as it
        is), the traceback kept as text."""
        eqn = _failing_equation(e.__traceback__)
        primitive, place = "", ""
        if eqn is not None:
            primitive = str(getattr(getattr(eqn, "primitive", None), "name", ""))
            with contextlib.suppress(Exception):  # a jax without this private API: unplaced
                (file, line, function), _, _ = user_frame_of(eqn.source_info)
                place = f"{file}:{line} in {function}" if file else ""
        said = str(e).strip()
        if "Traceback (most recent call last)" in said:  # a callback's error, carried by XLA:
            said = said.splitlines()[-1]  # its last line says what it was; the rest is kept
        return cls(
            type(e).__name__,
            " ".join(said.split()),
            primitive=primitive,
            place=place,
            traceback="".join(tb.format_exception(type(e), e, e.__traceback__)),
        )


def _failing_equation(trace: TracebackType | None) -> Any:
    """The equation the interpreter was running where the traceback `trace` ends: the
    innermost frame of `Interpreter.eqn` (a scan's or a call's body runs inside its own
    equation's frame, so the innermost is the operation that raised), or None."""
    found = None
    while trace is not None:
        frame = trace.tb_frame
        if frame.f_code.co_name == "eqn" and frame.f_code.co_filename.endswith("_interpreter.py"):
            found = frame.f_locals.get("eqn", found)
        trace = trace.tb_next
    return found


@contextlib.contextmanager
def _naming_the_operation() -> Iterator[None]:
    """Raise what an operation raised while recorded as a `RecordingError` naming it; a
    `LocaliseError` (the program is too large, ...) says what it is already."""
    try:
        yield
    except LocaliseError:
        raise
    except Exception as e:
        raise RecordingError.of(e) from e


def record(
    fn: Callable[..., Any],
    *args: Any,
    keep_arrays: bool = True,
    max_bytes: int | None = None,
    shadow: Any = None,
    executables: Executables | None = None,
    **kwargs: Any,
) -> Recording:
    """Run `fn(*args, **kwargs)`'s program equation by equation and keep every value.

    **Arguments:**

    - `fn`: a function jax can trace; arguments that are not arrays must be closed over.
    - `args`, `kwargs`: what `fn` is called with (the same for both sides of a comparison).
    - `keep_arrays`: keep each value's numbers (default); False keeps only fingerprints
      (`Recording.summary()`), for a recording matched later or in another process.
    - `max_bytes`: the most bytes the values may take together while recording (they are
      all held until the fingerprints are taken); past it, `LocaliseError` says the
      program is too large. None: no limit.
    - `shadow`: a shadow replay on the base's values (`parity.origin._shadow.Shadow`), told
      of each value as it is made; None: none.
    - `executables`: the programs its operations run (`parity.origin._executables`), given
      to share them with the other side of a comparison: an operation of a signature the
      other side ran is not lowered, compiled or loaded again; None: its own.

    **Returns:** a `Recording`. Raises `LocaliseError` when `fn` does not trace, and its
    `RecordingError` when an operation raises while recorded (which one, where, and the
    traceback).
    """
    import jax

    try:
        closed, shapes = jax.make_jaxpr(functools.partial(fn, **kwargs), return_shape=True)(*args)
    except Exception as e:
        raise LocaliseError(
            f"{getattr(fn, '__name__', fn)!s} does not trace, so its values cannot be recorded "
            f"({type(e).__name__}: {' '.join(str(e).split())[:200]})"
        ) from None
    interp = Interpreter(max_bytes, keep_arrays=keep_arrays, shadow=shadow, executables=executables)
    leaves = jax.tree_util.tree_leaves(args)
    ins = [interp.add(x, "input", "input", [], UNPLACED) for x in leaves]
    with _naming_the_operation():
        outs = interp.closed(closed, [(jax.numpy.asarray(x), i) for (x, i) in ins], UNPLACED)
    keys = _output_keys(shapes, BARE)
    # The order the program computes its outputs in: the one every check of parity uses.
    declared, ids = list(keys.values()), {k: j for j, k in keys.items()}
    order = _ordered(interp, declared, {k: outs[j][1] for j, k in keys.items()}) or declared
    return interp.recording(
        {k: outs[ids[k]][1] for k in order}, {k: to_host(outs[ids[k]][0]) for k in order}
    )


def _output_keys(shapes: Any, bare: str | None = None) -> dict[int, str]:
    """Output leaf index -> its key (`parity.judge._trees.flatten`'s), for a program's
    output pytree `shapes`, in the leaves' order."""
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(shapes)
    markers = jax.tree_util.tree_unflatten(treedef, [np.int64(j) for j in range(len(leaves))])
    return {int(v): k for k, v in flatten(markers, bare=bare).items()}


def dataflow_order(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[str]:
    """The keys of `fn(*args, **kwargs)`'s outputs in the order its program computes them:
    by the depth of the value each key reads (the longest chain of operations from an
    input), the order `parity check` reads from the programs a producer ran; one
    algorithm for both (`record_programs`).

    **Arguments:**

    - `fn`: a function jax can trace (a `jax.jit`-ed one, or any function of jax arrays);
      it is traced and its program walked for shapes and dataflow, not run.
    - `args`, `kwargs`: what `fn` is called with.

    **Returns:** every output key, as `parity.judge._trees.flatten` names them
    (`taps.conv0`), earliest computed first; ties keep the outputs' own order, and an
    output no operation computed (an input, a constant) stays after the key before it.
    Raises `DataflowError` when `fn` does not trace (the reason in one line: return its
    outputs through `in_dataflow_order` from the traceable part, or declare the order).

    **Example:**

    ```python
    keys = parity.dataflow_order(forward, params, x)  # ["input", "hidden0", ..., "head"]
    parity.assert_equivalent(forward(params, x), old_forward(params, x), order=keys)
    ```
    """
    import jax

    try:
        closed, shapes = jax.make_jaxpr(functools.partial(fn, **kwargs), return_shape=True)(*args)
    except Exception as e:
        said = " ".join(f"{type(e).__name__}: {e}".split())
        said = said if len(said) <= 200 else said[:200].rsplit(" ", 1)[0] + " ..."
        raise DataflowError(
            f"{getattr(fn, '__name__', fn)!s} does not trace, so its dataflow order cannot be "
            f"read from its program ({said})"
        ) from None
    interp = Interpreter(None, evaluate=False)
    ins = [
        interp.add(Aval(shape_of(x), dtype_of(x)), "input", "input", [], UNPLACED)
        for x in jax.tree_util.tree_leaves(args)
    ]
    outs = interp.closed(closed, ins, UNPLACED)
    keys = _output_keys(shapes)
    declared = list(keys.values())
    return _ordered(interp, declared, {k: outs[j][1] for j, k in keys.items()}) or declared


def in_dataflow_order(fn: Callable[..., Any]) -> Callable[..., Dataflow]:
    """Wrap `fn` so that its outputs come back flat, in dataflow order.

    **Arguments:**

    - `fn`: a function jax can trace, returning a pytree of arrays (a dict of taps from a
      `jax.jit`-ed `apply`, say).

    **Returns:** a function taking `fn`'s arguments that runs `fn` and returns a `Dataflow`:
    `{key: array}` with the keys `parity.judge._trees.flatten` gives `fn`'s outputs, in the
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


def record_programs(
    capture: Capture,
    outputs: Mapping[str, Any],
    *,
    sources: Mapping[int, Any] | None = None,
    evaluate: bool = True,
    keep_arrays: bool = False,
    max_bytes: int | None = None,
    flush_above: int | None = None,
    shadow: Any = None,
    progress: Progress | None = None,
    spill: Callable[[int, np.ndarray], None] | None = None,
) -> tuple[Recording | None, list[str] | None]:
    """Run the programs a producer dispatched (`parity.origin._programs.capture`) op by op,
    in the order it ran them, in one value space: an argument one of them made is that
    program's value, any other an input. Then link each output key to the value it was
    converted from.

    **Arguments:**

    - `capture`: what `capture()` kept while the producer ran.
    - `outputs`: the producer's flat `{key: array}`, in the order it declared them; a numpy
      array is traced back to the jax array it was made of through `sources`.
    - `sources`: `id` of a numpy output -> the jax array it was made of
      (`parity.judge._dataflow.Conversions.source`).
    - `evaluate`: compute every value (a recording); False walks the programs for their
      shapes and dataflow only (the order, at the cost of a trace walk).
    - `keep_arrays`, `max_bytes`: as `record`.
    - `flush_above`: clear jax's caches where the process's resident memory passes so many
      bytes, to bound the memory of a process that records
      (`parity.origin._flushing.FLUSH_ABOVE`); None: never.
    - `shadow`: as `record`.
    - `progress`: told of each value, program and scan step, to say how a long recording
      goes (`parity.origin._progress`); None: nothing said.
    - `spill`: told each value's numbers as they are made, to write them to disk
      (`parity.origin._stored.ArraysWriter.value`) where `keep_arrays` would hold them all;
      the recording returned is then a summary.

    **Returns:** `(recording, order)`: the `Recording` (None where not `evaluate`), and the
    keys in dataflow order: by the depth of the value each key reads (the longest chain of
    operations from an input, so that a tap of layer 2 comes before any of layer 3 whichever
    program computed it), a key no program computed right after the key declared before it.
    The order is None where no key is computed by the programs. Raises `LocaliseError`
    where the values pass `max_bytes`, or where the programs were not all seen
    (`Capture.failure`: this jax cannot be hooked, or a hook failed); its `RecordingError`
    where an operation raises while recorded.
    """
    import jax

    from parity.origin._programs import Link, quiet

    if capture.failure:
        raise LocaliseError(capture.failure)
    interp = Interpreter(
        max_bytes,
        evaluate=evaluate,
        keep_arrays=keep_arrays,
        flush_above=flush_above,
        shadow=shadow,
        progress=progress,
        spill=spill,
    )
    links: dict[str, Link] = {}
    for key, array in outputs.items():
        origin = array if isinstance(array, jax.Array) else (sources or {}).get(id(array))
        link = capture.link_of(origin) if origin is not None else None
        if link is not None:
            links[key] = link
    results: list[list[Ref]] = []
    inputs: dict[int, Ref] = {}
    held = _Held(capture.programs, links.values(), interp)
    with quiet(), _naming_the_operation():
        for k, program in enumerate(capture.programs, 1):
            if progress is not None:
                progress.program(k, len(capture.programs))
            args: list[Ref] = []
            for a in program.args:
                if isinstance(a, Link):
                    args.append(results[a.program][a.output])
                    continue
                if id(a) not in inputs:
                    value = as_jax(a) if evaluate else Aval(shape_of(a), dtype_of(a))
                    inputs[id(a)] = interp.add(value, "input", "input", [], UNPLACED)
                args.append(inputs[id(a)])
            results.append(interp.closed(program.jaxpr, args, program.frame))
            held.ran(k - 1, results)
    linked = {key: results[link.program][link.output] for key, link in links.items()}
    order = _ordered(interp, list(outputs), {k: i for k, (_, i) in linked.items()})
    if not evaluate:
        return None, order
    keys = order or list(outputs)
    recording = interp.recording(
        {k: linked[k][1] if k in linked else -1 for k in keys},
        {k: to_host(linked[k][0]) if k in linked else np.asarray(outputs[k]) for k in keys},
    )
    return recording, order


class _Held:
    """What of the programs' results a recording still holds: an output of one program is
    let go once the last program that reads it has run (an operation run outside any jit
    is a program of its own, so a producer's eager steps, a random initialisation's bits
    among them, would otherwise all be held to the end), unless a key of the producer's
    outputs is linked to it."""

    def __init__(self, programs: Sequence[Any], keys: Iterable[Any], interp: Interpreter) -> None:
        from parity.origin._programs import Link

        self.interp = interp
        self.last: dict[tuple[int, int], int] = {}
        for k, program in enumerate(programs):
            for a in program.args:
                if isinstance(a, Link):
                    self.last[(a.program, a.output)] = k
        self.kept = {(link.program, link.output) for link in keys}
        self.count: collections.Counter[int] = collections.Counter()
        self.done: dict[int, list[tuple[int, int]]] = {}
        for where, k in self.last.items():
            self.done.setdefault(k, []).append(where)

    def ran(self, k: int, results: list[list[Ref]]) -> None:
        """Program `k` has run: what nothing reads any more is let go."""
        for _, i in results[k]:
            self.count[i] += 1
        unread = [(k, o) for o in range(len(results[k])) if (k, o) not in self.last]
        for p, o in [*self.done.pop(k, []), *unread]:
            if (p, o) in self.kept:
                continue
            x, i = results[p][o]
            if x is None:
                continue
            results[p][o] = (None, i)
            self.count[i] -= 1
            if self.count[i] <= 0 and i >= 0:
                self.interp.release(i)


def _ordered(interp: Interpreter, declared: list[str], ids: Mapping[str, int]) -> list[str] | None:
    computed = [k for k, i in ids.items() if i >= 0 and interp.values[i].kind in ("op", "move")]
    if not computed:
        return None
    rank: dict[str, tuple[int, int, int]] = {}
    depth, position = -1, -1
    for n, key in enumerate(declared):
        i = ids.get(key, -1)
        if i >= 0:
            position = interp.stands_for(i)
            depth = interp.depth[position]
        rank[key] = (depth, position, n)
    return sorted(declared, key=rank.__getitem__)
