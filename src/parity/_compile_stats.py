"""What a jitted function costs to compile: timings, HLO size, loops and XLA's memory figures.

Used to show what a refactor did to compilation (an unrolled layer loop turned into a
`lax.scan` should keep HLO size flat in depth and add one `while`). jax is imported when
this module is; `import parity` does not import it.

**Counting rule.** Instructions are counted in the optimized HLO text that
`compiled.as_text()` returns: a line is an instruction if, after optional indentation and
an optional `ROOT `, it is an assignment `name = <type> <op>(...)`, with or without the
`%` sigil (`%dot.3 = f32[4,16]{1,0} dot(...)`, `ROOT tuple.1 = (...) tuple(...)`).
Computation headers, the `HloModule` line and metadata tables have no `name =` at the start,
so they do not count. Instructions of every computation count (fusion bodies and loop
bodies included), so the figure tracks the text XLA has to handle. A while loop is an
instruction whose op is `while`: a `lax.scan` or `lax.fori_loop` gives one, a Python loop
unrolled at trace time gives none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax

__all__ = ["CompileStats", "compile_stats", "count_instructions", "count_while_loops"]

_INSTRUCTION_RE = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<rest>.*)$")
# The op is the first identifier directly followed by "(" after the result type; types
# (tuples included) never have an identifier right before "(".
_OP_RE = re.compile(r"(?<![\w.\-%])(?P<op>[a-z][\w\-]*)\(")


@dataclasses.dataclass(frozen=True)
class CompileStats:
    """Compile figures of one jitted function at one set of argument shapes.

    - `name`: what was compiled.
    - `lower_s`, `compile_s`: seconds spent in `.lower(...)` and in `.compile()`.
    - `hlo_bytes`: UTF-8 size of the lowered module's text (`lowered.as_text()`, StableHLO).
    - `compiled_hlo_bytes`: size of the optimized HLO text (`compiled.as_text()`), or None.
    - `instructions`: HLO instructions in the optimized text (rule in the module docstring),
      or None if the backend gives no text.
    - `while_loops`: `while` instructions in the optimized text, or None.
    - `argument_bytes`, `output_bytes`, `temp_bytes`, `alias_bytes`, `generated_code_bytes`:
      from `compiled.memory_analysis()`; None where the backend reports none.
    - `backend`: where it was compiled, in words (`cpu`, `tpu (TPU v5 lite)`): a compile
      time means nothing without it.
    """

    name: str
    lower_s: float
    compile_s: float
    hlo_bytes: int
    compiled_hlo_bytes: int | None
    instructions: int | None
    while_loops: int | None
    argument_bytes: int | None
    output_bytes: int | None
    temp_bytes: int | None
    alias_bytes: int | None
    generated_code_bytes: int | None
    backend: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-serialisable dict."""
        return dataclasses.asdict(self)


def count_instructions(hlo_text: str) -> int:
    """Count HLO instructions in `hlo_text` (rule in the module docstring).

    **Arguments:**

    - `hlo_text`: HLO text, e.g. `compiled.as_text()`.

    **Returns:** the number of instruction lines.
    """
    return sum(1 for line in hlo_text.splitlines() if _INSTRUCTION_RE.match(line))


def count_while_loops(hlo_text: str) -> int:
    """Count `while` instructions in `hlo_text`.

    **Arguments:**

    - `hlo_text`: HLO text, e.g. `compiled.as_text()`.

    **Returns:** the number of instructions whose op is `while`.
    """
    n = 0
    for line in hlo_text.splitlines():
        m = _INSTRUCTION_RE.match(line)
        if m is None:
            continue
        op = _OP_RE.search(m.group("rest"))
        if op is not None and op.group("op") == "while":
            n += 1
    return n


def _memory(compiled: Any) -> dict[str, int | None]:
    fields = {
        "argument_bytes": "argument_size_in_bytes",
        "output_bytes": "output_size_in_bytes",
        "temp_bytes": "temp_size_in_bytes",
        "alias_bytes": "alias_size_in_bytes",
        "generated_code_bytes": "generated_code_size_in_bytes",
    }
    try:
        stats = compiled.memory_analysis()
    except (NotImplementedError, RuntimeError, AttributeError):
        # Some backends do not implement it; the figures are then unknown, not zero.
        stats = None
    if isinstance(stats, (list, tuple)):
        # One entry per program on multi-program backends; the first is the main one.
        stats = stats[0] if stats else None
    out: dict[str, int | None] = {}
    for ours, theirs in fields.items():
        value = getattr(stats, theirs, None) if stats is not None else None
        out[ours] = int(value) if value is not None else None
    return out


def _text(obj: Any) -> str | None:
    try:
        text = obj.as_text()
    except (NotImplementedError, RuntimeError, AttributeError):
        return None
    return text if isinstance(text, str) else None


def _backend() -> str:
    platform = jax.default_backend()
    devices = jax.devices()
    kind = str(devices[0].device_kind) if devices else ""
    return platform if platform == "cpu" or not kind else f"{platform} ({kind})"


@contextlib.contextmanager
def _no_persistent_cache() -> Iterator[None]:
    """The persistent compilation cache off, for certain: jax decides once per process
    whether it uses the cache (`compilation_cache.is_cache_used`, memoised at the first
    compile), so turning `jax_enable_compilation_cache` off after a compile changed nothing
    and a cache load was timed as a compile; resetting that decision makes the flag count."""
    from jax._src import compilation_cache

    old = jax.config.jax_enable_compilation_cache  # pyright: ignore[reportAttributeAccessIssue]
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", old)
        compilation_cache.reset_cache()


def compile_stats(
    fn: Callable[..., Any],
    *args: Any,
    name: str | None = None,
    fresh: bool = True,
    **kwargs: Any,
) -> CompileStats:
    """Lower and compile `fn(*args, **kwargs)` and measure it.

    **Arguments:**

    - `fn`: a jitted function, or any callable (it is wrapped in `jax.jit`).
    - `*args`, `**kwargs`: arguments, as arrays or `jax.ShapeDtypeStruct`s.
    - `name`: label for the figures; default the function's `__name__`.
    - `fresh`: measure a cold compile: jax's in-memory caches are cleared first
      (`jax.clear_caches()`, which makes later calls in this process retrace once) and the
      persistent compilation cache is off while compiling (`jax_enable_compilation_cache`,
      and jax's once-per-process decision to use it reset; restored afterwards), so a
      compile is timed, never a cache load. With `fresh=False` a cache hit may be what is
      timed.

    **Returns:** a `CompileStats`.
    """
    jitted: Any = fn if hasattr(fn, "lower") else jax.jit(fn)
    label = name or getattr(fn, "__name__", None) or type(fn).__name__
    if fresh:
        jax.clear_caches()
    with _no_persistent_cache() if fresh else contextlib.nullcontext():
        t0 = time.perf_counter()
        lowered = jitted.lower(*args, **kwargs)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
    hlo = lowered.as_text()
    compiled_text = _text(compiled)
    return CompileStats(
        name=str(label),
        lower_s=t1 - t0,
        compile_s=t2 - t1,
        hlo_bytes=len(hlo.encode("utf-8")),
        compiled_hlo_bytes=len(compiled_text.encode("utf-8")) if compiled_text else None,
        instructions=count_instructions(compiled_text) if compiled_text else None,
        while_loops=count_while_loops(compiled_text) if compiled_text else None,
        **_memory(compiled),
        backend=_backend(),
    )
