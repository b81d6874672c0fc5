"""The one module of parity that reads jax's private internals (`jax._src`): what this jax
lets the recorder do, and the hooks that let it see the programs a producer runs.

jax renames its internals in most releases, so nothing else in parity names them. On import
nothing is touched; `support()` looks once per process at what this jax offers and says, per
feature, whether it is here, what it needs and what a check falls back to without it:

- `programs`: see each jitted call made at the top level, with its jaxpr and its flat
  arguments, and each operation run eagerly (`Intercept`). It reads a producer's forward
  order and records a producer run op by op (the origin and the proof of `parity check`).
  jax 0.9 and later run a jitted call through `pjit._run_python_pjit`; jax 0.4.35 to 0.8
  through `pjit._python_pjit_helper`, whose result carries the jaxpr and flat arguments;
  an eager operation goes through `core.EvalTrace.process_primitive` in all of them.
  Without it: the order the producer declared, and no origin or proof for producer runs.
- `places`: the user's source line of a traced operation (`source_info_util.user_frames`,
  whose argument was a `SourceInfo` up to jax 0.7 and is a traceback since). Without it:
  origins are named by their operation, without a line.

`intercept(listener)` puts the hooks into jax only while it is open and takes them out after;
a check that needs no order and no recording never opens it. A hook never fails the call it
wraps: jax's own function runs exactly once, with its own result or exception, and any error
of the hook's reading around it (a private function whose arguments or result changed
shape) turns the interception off for the rest of the run, with the reason kept for the one
line the check prints (`Intercept.failure`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "Feature",
    "Intercept",
    "Listener",
    "Support",
    "current_source_info",
    "installed",
    "intercept",
    "quiet",
    "support",
    "user_frames",
]


@dataclass(frozen=True)
class Feature:
    """One thing the recorder can do on this jax, or why not.

    **Fields:** `name` (`"programs"`, `"places"`), `available`, `needs` (what it relies on,
    in words), `fallback` (what a check does without it), `why` (why it is missing here; ""
    where available).
    """

    name: str
    available: bool
    needs: str
    fallback: str
    why: str = ""

    def line(self, jax_version: str) -> str:
        """The one line a check prints where this feature is missing ("" where it is here)."""
        if self.available:
            return ""
        return (
            f"jax {jax_version} lets parity not {self.needs} ({self.why}); "
            f"the check falls back to {self.fallback}"
        )


@dataclass(frozen=True)
class Support:
    """What this jax lets the recorder do (`support()`).

    **Fields:** `jax` (its version), `programs` and `places` (`Feature`s; see the module
    docstring).
    """

    jax: str
    programs: Feature
    places: Feature

    def missing(self) -> list[str]:
        """One line per feature this jax lacks."""
        return [f.line(self.jax) for f in (self.programs, self.places) if not f.available]


class Listener(Protocol):
    """What `intercept` tells of the programs dispatched at the top level while it is open."""

    def jitted(self, jaxpr: Any, args: list[Any], outs: list[Any]) -> None:
        """A jitted call ran: its closed jaxpr, its flat arguments (a donated one as the host
        copy taken before the call) and its flat outputs."""
        ...

    def eager(
        self, primitive: Any, args: list[Any], params: dict[str, Any], outs: list[Any]
    ) -> None:
        """An operation ran eagerly, outside any jit."""
        ...


_PROGRAMS_NEEDS = "see the programs a producer runs (its jitted calls and eager operations)"
_PROGRAMS_FALLBACK = (
    "the order the producer declared its keys in, and no origin or proof op by op for producer runs"
)
_PLACES_NEEDS = "place a traced operation at the user's source line"
_PLACES_FALLBACK = "origins named by their operation, without a source line"


@dataclass(frozen=True)
class _Hooks:
    """How this jax runs a top-level jitted call: `style` `"run"` (jax 0.9 and later) or
    `"helper"` (0.4.35 to 0.8), with the module and names patched."""

    style: str
    pjit: Any
    core: Any
    call_name: str


def _detect_hooks() -> _Hooks:
    from jax._src import core, pjit

    if not (hasattr(core, "EvalTrace") and hasattr(core.EvalTrace, "process_primitive")):
        raise LookupError("jax._src.core.EvalTrace.process_primitive is not there")
    if not hasattr(core, "trace_state_clean") or not hasattr(pjit, "_get_fastpath_data"):
        raise LookupError("jax._src.core.trace_state_clean or pjit._get_fastpath_data is not there")
    run = getattr(pjit, "_run_python_pjit", None)
    if run is not None:
        names = list(inspect.signature(run).parameters)
        if names[:5] != ["p", "args_flat", "fun", "args", "kwargs"]:
            raise LookupError(f"jax._src.pjit._run_python_pjit takes {names}")
        return _Hooks("run", pjit, core, "_run_python_pjit")
    helper = getattr(pjit, "_python_pjit_helper", None)
    if helper is not None:
        names = list(inspect.signature(helper).parameters)
        if names[:2] != ["fun", "jit_info"]:
            raise LookupError(f"jax._src.pjit._python_pjit_helper takes {names}")
        return _Hooks("helper", pjit, core, "_python_pjit_helper")
    raise LookupError(
        "jax._src.pjit has neither _run_python_pjit (jax 0.9 and later) nor "
        "_python_pjit_helper (jax 0.4.35 to 0.8)"
    )


def _detect_places() -> Callable[[Any], Iterator[Any]]:
    """`frames(source_info)`: the user's frames of a `SourceInfo`, in this jax's way."""
    from jax._src import source_info_util

    user_frames = source_info_util.user_frames
    first = next(iter(inspect.signature(user_frames).parameters))
    if first == "source_info":
        return user_frames
    return lambda source_info: user_frames(source_info.traceback)


@functools.cache
def _detected() -> tuple[Support, _Hooks | None, Callable[[Any], Iterator[Any]] | None]:
    import jax

    hooks: _Hooks | None = None
    frames: Callable[[Any], Iterator[Any]] | None = None
    try:
        hooks = _detect_hooks()
        programs = Feature("programs", True, _PROGRAMS_NEEDS, _PROGRAMS_FALLBACK)
    except Exception as e:  # any jax: a moved name is a missing feature, never an error
        programs = Feature("programs", False, _PROGRAMS_NEEDS, _PROGRAMS_FALLBACK, _why(e))
    try:
        frames = _detect_places()
        places = Feature("places", True, _PLACES_NEEDS, _PLACES_FALLBACK)
    except Exception as e:
        places = Feature("places", False, _PLACES_NEEDS, _PLACES_FALLBACK, _why(e))
    return Support(jax.__version__, programs, places), hooks, frames


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"


def _failed(what: str, e: BaseException) -> str:
    """The one line of a hook that failed on this jax: what, why, and what the check falls
    back to."""
    import jax

    return (
        f"the recorder's {what} on jax {jax.__version__} ({_why(e)}); the check falls back "
        f"to {_PROGRAMS_FALLBACK}"
    )


def support() -> Support:
    """What this jax lets the recorder do, looked at once per process."""
    return _detected()[0]


def user_frames(source_info: Any) -> Iterator[Any]:
    """The user's frames (jax's `Frame`: `file_name`, `start_line`, `function_name`) of a
    jaxpr equation's `source_info`, innermost first; none where this jax cannot say."""
    frames = _detected()[2]
    if frames is None or source_info is None:
        return iter(())
    return frames(source_info)


def current_source_info() -> Any:
    """jax's `SourceInfo` of the Python stack now (what an operation traced here would
    carry), or None where this jax cannot say."""
    try:
        from jax._src import source_info_util

        return source_info_util.current()
    except Exception:
        return None


_state = threading.local()


def _depth() -> int:
    return getattr(_state, "depth", 0)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """While open, nothing this thread dispatches is told to a listener (jax's own calls
    under a hooked one, and the recorder's own op-by-op evaluation)."""
    _state.depth = _depth() + 1
    try:
        yield
    finally:
        _state.depth -= 1


@dataclass
class Intercept:
    """What `intercept()` yields: `installed` (whether the hooks went in) and `failure`
    (why they stopped telling, or why they could not go in: one line; "" while fine)."""

    installed: bool = False
    failure: str = ""


class _Open:
    """The listener of the open interception and its `Intercept`."""

    def __init__(self, listener: Listener, status: Intercept) -> None:
        self.listener, self.status = listener, status

    def fail(self, where: str, e: BaseException) -> None:
        if not self.status.failure:
            self.status.failure = _failed(f"hook on {where} failed", e)


_lock = threading.Lock()
_open: list[_Open] = []


def _listening(hooks: _Hooks | None = None) -> _Open | None:
    """The open interception, where this call is one it should see (not quiet, not failed;
    with `hooks`, a jitted call, also at the top level: no trace open)."""
    if not _open or _depth():
        return None
    current = _open[-1]
    if current.status.failure or (hooks is not None and not hooks.core.trace_state_clean()):
        return None
    return current


def _jit_hook(hooks: _Hooks, original: Callable[..., Any]) -> Callable[..., Any]:
    """The wrapper put in place of this jax's top-level jitted-call function."""

    def run_and_tell(*a: Any, **k: Any) -> Any:
        current = _listening(hooks)
        if current is None:
            return original(*a, **k)
        try:
            before = _read_before(hooks, a, k)
        except Exception as e:
            current.fail(f"jax._src.pjit.{hooks.call_name}", e)
            return original(*a, **k)
        with quiet():
            result = original(*a, **k)
        try:
            jaxpr, args, outs = _read_after(hooks, before, a, result)
            current.listener.jitted(jaxpr, args, outs)
        except Exception as e:
            current.fail(f"jax._src.pjit.{hooks.call_name}", e)
        return result

    return run_and_tell


def _host_copy(a: Any) -> Any:
    import jax
    import numpy as np

    if isinstance(a, jax.Array) and not jax.numpy.issubdtype(a.dtype, jax.dtypes.extended):
        return np.asarray(a)
    return a


def _read_before(hooks: _Hooks, a: tuple[Any, ...], k: dict[str, Any]) -> Any:
    """What must be read before the call: the donated arguments, copied to the host (they
    are gone after it)."""
    import jax

    if hooks.style == "run":
        p, args_flat = a[0], a[1]
        donated = p.params.get("donated_invars", ())
        kept = [_host_copy(x) if d else x for x, d in zip(args_flat, donated, strict=False)]
        return kept + list(args_flat[len(kept) :])
    jit_info = a[1]
    if not (jit_info.donate_argnums or jit_info.donate_argnames):
        return {}
    leaves = jax.tree_util.tree_leaves((a[2:], k))
    return {id(x): _host_copy(x) for x in leaves if isinstance(x, jax.Array)}


def _read_after(
    hooks: _Hooks, before: Any, a: tuple[Any, ...], result: Any
) -> tuple[Any, list[Any], list[Any]]:
    """The call's closed jaxpr, flat arguments and flat outputs."""
    from jax.extend import core as jex

    if hooks.style == "run":
        p = a[0]
        jaxpr, args, outs = p.params["jaxpr"], before, list(result[1])
    else:  # (outs, out_flat, out_tree, args_flat, jaxpr, ...)
        jaxpr, outs = result[4], list(result[1])
        args = [_donated(x, before) for x in result[3]]
    if not isinstance(jaxpr, jex.ClosedJaxpr):
        raise TypeError(f"expected a ClosedJaxpr, found {type(jaxpr).__name__}")
    return jaxpr, args, outs


def _donated(x: Any, copies: dict[int, Any]) -> Any:
    deleted = getattr(x, "is_deleted", None)
    if deleted is not None and id(x) in copies and deleted():
        return copies[id(x)]
    return x


def _eager_hook(hooks: _Hooks, original: Callable[..., Any]) -> Callable[..., Any]:
    """The wrapper put in place of `EvalTrace.process_primitive`."""

    def eager(self: Any, primitive: Any, args: Any, params: Any, /) -> Any:
        current = _listening()  # an eager operation runs with no trace open
        if current is None:
            return original(self, primitive, args, params)
        with quiet():
            outs = original(self, primitive, args, params)
        try:
            flat = list(outs) if primitive.multiple_results else [outs]
            current.listener.eager(primitive, list(args), dict(params), flat)
        except Exception as e:
            current.fail("jax._src.core.EvalTrace.process_primitive", e)
        return outs

    return eager


def _fastpath_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def no_fastpath(*a: Any, **k: Any) -> Any:
        if _open and not _depth():
            return None  # every top-level call comes back through Python while intercepting
        return original(*a, **k)

    return no_fastpath


def _forget_fast_paths(hooks: _Hooks) -> None:
    """Drop jax's C++ dispatch caches: a function called before the interception opened
    would otherwise be called from there, never reaching Python."""
    for name in ("_cpp_pjit_cache_fun_only", "_cpp_pjit_cache_explicit_attributes"):
        cache = getattr(hooks.pjit, name, None)
        clear = getattr(cache, "clear", None)
        if clear is not None:
            clear()


#: What `_install` replaced: (owner, attribute) -> the original, taken out by `_uninstall`.
_saved: dict[tuple[Any, str], Any] = {}


def _install(hooks: _Hooks) -> None:
    """Put the three hooks into jax, each original kept in `_saved` as it is replaced (one
    that fails half way is taken out again by `_uninstall`)."""
    pjit, eval_trace = hooks.pjit, hooks.core.EvalTrace
    wraps: list[tuple[Any, str, Callable[[Any], Any]]] = [
        (pjit, hooks.call_name, lambda f: _jit_hook(hooks, f)),
        (pjit, "_get_fastpath_data", _fastpath_hook),
        (eval_trace, "process_primitive", lambda f: _eager_hook(hooks, f)),
    ]
    for owner, name, wrap in wraps:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        hook = wrap(original)
        _saved[owner, name] = original
        setattr(owner, name, hook)


def _uninstall() -> None:
    """Put back every original `_install` replaced."""
    while _saved:
        (owner, name), original = _saved.popitem()
        setattr(owner, name, original)


@contextlib.contextmanager
def intercept(listener: Listener) -> Iterator[Intercept]:
    """Tell `listener` of every program dispatched at the top level while open.

    The hooks go into jax when the first interception opens and come out when the last
    closes. Where this jax offers no way in (`support().programs`), or putting the hooks in
    fails, nothing is installed and `Intercept.failure` says why; the code under the
    interception runs all the same.

    **Yields:** the `Intercept` (whether installed, and any failure).
    """
    status = Intercept()
    entry = _Open(listener, status)
    detected, hooks = _detected()[0], _detected()[1]
    if hooks is None:
        status.failure = detected.programs.line(detected.jax)
    else:
        with _lock:
            try:
                if not _open:
                    _install(hooks)
                _forget_fast_paths(hooks)
                status.installed = True
                _open.append(entry)
            except Exception as e:
                if not _open:
                    _uninstall()
                status.failure = _failed("hooks could not go into jax", e)
    if hooks is None or not status.installed:
        yield status
        return
    try:
        yield status
    finally:
        with _lock:
            _open.remove(entry)
            if not _open:
                _uninstall()


def installed() -> bool:
    """Whether the hooks are in jax now (for tests: only while an interception is open)."""
    return bool(_saved)
