"""When a process that records clears jax's compiled programs.

Each operation run on its own (`parity.origin._interpreter`) compiles a program of its own,
and jax keeps every one: a train group's three steps (41,180 values, 1,266 distinct
programs) took a recording process from 1.1 to 2.9 GiB. Clearing jax's caches
(`jax.clear_caches`) and handing the freed memory back (glibc's `malloc_trim`) bounds that,
but every program still in use is then compiled again, or read again from the persistent
compilation cache, which also lowers it again first: cleared every 4,000 values, the same
recording compiled or loaded 4,730 programs for its 1,266 (docs/design.md, "Cost").

So the process clears where its memory asks for it, not by a count: `Flushing` reads the
process's resident memory every `CHECK_EVERY` values and clears once it passes `above`.
Where what the process holds besides jax's programs (the producer's arrays, a recording's
values) already stands near `above` after a clear, the next clear waits for `HEADROOM` more,
so a process never clears at every check. Where the resident memory cannot be read (no
`/proc`), it clears every `EVERY` values, as before.

Asked for by the producer runner only (`FLUSH_ABOVE`), never in a user's own process, whose
compiled functions it would drop.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["CHECK_EVERY", "EVERY", "FLUSH_ABOVE", "HEADROOM", "Flushing", "resident_bytes"]

#: Resident memory past which the producer runner's recording clears jax's caches: 1.75
#: GiB, so that what a process grows by between two checks keeps it under 2 GiB.
FLUSH_ABOVE = 1792 * 2**20
#: How many values are recorded between two readings of the resident memory.
CHECK_EVERY = 250
#: What a clear leaves the process to grow by before the next, where the rest stays high.
HEADROOM = 384 * 2**20
#: Values between two clears where the resident memory cannot be read.
EVERY = 4000

_STATM = Path("/proc/self/statm")


def resident_bytes() -> int | None:
    """This process's resident memory in bytes (Linux's `/proc/self/statm`), or None."""
    try:
        pages = int(_STATM.read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def clear() -> None:
    """Drop jax's compiled programs and hand freed memory back (glibc's `malloc_trim`,
    where the C library has it)."""
    import ctypes

    import jax

    jax.clear_caches()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the memory stays
        ctypes.CDLL(None).malloc_trim(0)


class Flushing:
    """Clears jax's caches as a recording grows (the module docstring).

    **Arguments:** `above`, the resident bytes past which it clears; `also`, what else to
    clear with jax's caches (the recording's own programs, `parity.origin._executables`).

    **Fields:** `clears`, how many times it cleared.
    """

    def __init__(self, above: int, also: Callable[[], None] | None = None) -> None:
        self.above, self._also = above, also
        self.clears = 0
        self._measured = resident_bytes() is not None

    def after(self, count: int) -> None:
        """Told after each of a recording's `count` values: clears where it is time."""
        if not count:
            return
        if not self._measured:
            if count % EVERY == 0:
                self._clear()
            return
        if count % CHECK_EVERY:
            return
        rss = resident_bytes()
        if rss is not None and rss > self.above:
            self._clear()
            left = resident_bytes() or 0
            self.above = max(self.above, left + HEADROOM)

    def _clear(self) -> None:
        if self._also is not None:
            self._also()
        clear()
        self.clears += 1
