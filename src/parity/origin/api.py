"""`localise(new_fn, old_fn, *args)`: the first operation of the new program that computes
what the old one never did, at its source line; `locate` does the same for two recordings
made apart (one of them, say, in another process at a base commit).

jax is imported only inside the recording (the caller has it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from parity.judge.classes import REGISTRY, ToleranceClass
from parity.judge.compare import compare_trees
from parity.judge.tolerance import ClassMapLike, Overrides, class_resolver, to_class
from parity.origin.align import Origin, align, matching_tolerance
from parity.origin.record import LocaliseError, record
from parity.origin.recording import Recording

__all__ = ["localise", "locate", "origin_line"]


def _first_failing_key(
    new: Recording, old: Recording, resolve: Callable[[str], str],
    registry: Mapping[str, ToleranceClass],
) -> str | None:  # fmt: skip
    both = [k for k in new.outputs if k in old.outputs]
    comparison = compare_trees(
        {k: new.output_arrays[k] for k in both},
        {k: old.output_arrays[k] for k in both},
        resolve, registry=registry, order=both,
    )  # fmt: skip
    first = comparison.first_failure
    return None if first is None else first.key


def locate(
    new: Recording,
    old: Recording,
    *,
    class_map: ClassMapLike = "bitwise",
    overrides: Overrides = (),
    registry: Mapping[str, ToleranceClass] = REGISTRY,
    key: str | None = None,
    root: str | Path | None = None,
) -> Origin | None:
    """The origin of the first output of `new` that breaks its class against `old`.

    **Arguments:**

    - `new`, `old`: recordings of the two programs on the same inputs (`record`); `old` may
      be a summary (`Recording.summary()`, or read back with `Recording.from_arrays`).
    - `class_map`, `overrides`, `registry`: each output key's class, by the precedence
      every check uses (`parity.judge.tolerance.class_resolver`).
    - `key`: the output to explain; default: the first in dataflow order that fails its
      class (keys present on both sides only).
    - `root`: paths in the origin are given relative to it when they lie under it.

    **Returns:** the `Origin`, or None when no output fails, or when every value upstream
    of the failing output matched. Raises `LocaliseError` when the key is absent or its
    class gives no matching tolerance.
    """
    resolve = class_resolver(overrides=overrides, class_map=class_map)
    if key is None:
        key = _first_failing_key(new, old, resolve, registry)
        if key is None:
            return None
    if key not in old.output_arrays:
        raise LocaliseError(f"the old program has no output {key!r}; it has {list(old.outputs)}")
    rho = matching_tolerance(to_class(resolve(key), registry), old.output_arrays[key])
    return align(new, old, rho).origin(key, root=root)


def localise(
    new_fn: Callable[..., Any],
    old_fn: Callable[..., Any],
    *args: Any,
    class_map: ClassMapLike = "bitwise",
    overrides: Overrides = (),
    registry: Mapping[str, ToleranceClass] = REGISTRY,
    key: str | None = None,
    root: str | Path | None = None,
    **kwargs: Any,
) -> Origin | None:
    """Name the first operation of `new_fn`'s program that computes a value `old_fn`'s
    program never computed, and its source line.

    Both programs are run equation by equation on the same arguments, every intermediate
    kept (scans unrolled); each value of the new program is matched by value against the
    old program's, within a tolerance derived from the class of the failing output
    (docs/design.md, "Where it diverged"). The origin is the earliest unmatched value from
    which the failing output is reached through unmatched values only.

    **Arguments:**

    - `new_fn`, `old_fn`: functions jax can trace, taking the same arguments and returning
      pytrees with the same keys (as `parity.judge.trees.flatten` names them; a bare array
      is `array`). Arguments that are not arrays must be closed over.
    - `args`, `kwargs`: what both are called with.
    - `class_map`, `overrides`, `registry`, `key`, `root`: as `locate`.

    **Returns:** the `Origin` (`primitive`, `file`, `line`, `function`, `shape`,
    `max_diff`, `key`, `matched_fraction`, ...; `.describe()` for one line), or None when
    every output holds its class or every value upstream of the failing one matched. Raises
    `LocaliseError` when a function does not trace.
    """
    new = record(new_fn, *args, **kwargs)
    old = record(old_fn, *args, **kwargs)
    return locate(new, old, class_map=class_map, overrides=overrides, registry=registry,
                  key=key, root=root)  # fmt: skip


def origin_line(
    new_fn: Callable[..., Any], old_fn: Callable[..., Any], args: tuple[Any, ...],
    kwargs: Mapping[str, Any], *, key: str | None, **options: Any,
) -> str:  # fmt: skip
    """The `origin:` line a failure message ends with: the origin, why there is none, or
    why it could not be found (one line each)."""
    try:
        origin = localise(new_fn, old_fn, *args, key=key, **options, **kwargs)
    except LocaliseError as e:
        return f"origin: not named: {e.reason}\n"
    except Exception as e:  # the line explains a failure; it must not replace it
        return f"origin: not named: localise raised {type(e).__name__}: {e}\n"
    if origin is None:
        return (
            "origin: none: every value of the new program upstream of the failing output "
            "matched one of the old program's (or no output failed when run op by op)\n"
        )
    return f"origin: {origin.describe()}\n"
