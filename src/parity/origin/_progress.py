"""How a long recording goes, said as it goes (issue 76): a recording of a large model runs
for minutes, one operation at a time, and a user who sees nothing for that long cannot tell
a slow run from a stuck one.

A `Progress` is told of each value the recorder makes (`value`), of the program it is in
among those a producer dispatched (`program`) and of each step of a `lax.scan` it unrolls
(`step`, `left`: the layer of a scanned model), and says, at most every `every` seconds, one
line: the values recorded so far, the program of how many, the scan steps it is in, and
the user's source line of the last value. Leaving a scan that took at least `every`
seconds, it says how long its steps took (a scanned model's layers: each should take about
as long as the one before, so the whole stays linear in the layers).

This module imports nothing of jax, nor of parity.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["EVERY", "LOOK", "Progress"]

#: Seconds between two lines of a recording's progress.
EVERY = 10.0
#: Values between two looks at the clock (a recording makes tens of thousands a minute).
LOOK = 256


class Progress:
    """Says a recording's progress through `say` (one line a call), at most every `every`
    seconds of `clock`, which it looks at every `look` values."""

    def __init__(
        self,
        say: Callable[[str], None],
        *,
        every: float = EVERY,
        look: int = LOOK,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.say, self.every, self.look, self.clock = say, every, look, clock
        self.said = clock()
        self.programs = (0, 0)  # (the one it is in, counted from 1; how many)
        self.steps: list[tuple[int, int]] = []  # per scan it is inside: (step, length)
        self.began: list[float] = []  # per scan it is inside: when its step began
        self.took: list[list[float]] = []  # per scan it is inside: its steps' seconds

    def program(self, k: int, of: int) -> None:
        """It is recording program `k` (from 1) of the `of` a producer dispatched."""
        self.programs = (k, of)

    def step(self, k: int, length: int, *, first: bool) -> None:
        """It is in step `k` (from 0) of a scan of `length` steps (`first`: a scan it just
        entered)."""
        now = self.clock()
        if first or not self.steps:
            self.steps.append((k, length))
            self.began.append(now)
            self.took.append([])
        else:
            self.steps[-1] = (k, length)
            self.took[-1].append(now - self.began[-1])
            self.began[-1] = now

    def left(self) -> None:
        """It left the innermost scan it was in: where that took `every` seconds or more,
        how long its steps took."""
        if not self.steps:
            return
        (_, length), began, took = self.steps.pop(), self.began.pop(), self.took.pop()
        took.append(self.clock() - began)
        total = sum(took)
        if total >= self.every and total > 0:
            middle, slowest = sorted(took)[len(took) // 2], max(took)
            each = f"{middle:.1f} s a step (the median of {len(took)})"
            self.say(f"a scan of {length} steps recorded in {total:.1f} s: {each}, "
                     f"the slowest {slowest:.1f} s")  # fmt: skip

    def value(self, count: int, place: str) -> None:
        """It has made `count` values, the last at `place` (`file:line in function`, or "")."""
        if count % self.look or self.clock() - self.said < self.every:
            return
        self.said = self.clock()
        line = f"{count:,} values recorded"
        k, of = self.programs
        if of > 1:
            line += f", program {k} of {of}"
        if self.steps:
            line += ", " + " > ".join(f"scan step {s + 1} of {n}" for s, n in self.steps)
        self.say(line + (f", at {place}" if place else ""))
