"""When a recording process clears jax's caches (`parity.origin._flushing`): where its
resident memory asks for it, never at every check, and by a count where it cannot be read."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from parity.origin import _flushing
from parity.origin._flushing import CHECK_EVERY, EVERY, HEADROOM, Flushing, resident_bytes

MiB = 2**20


class _Process:
    """A process whose resident memory grows by `grow` bytes a value and falls to `floor`
    where it clears."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, start: int, grow: int, floor: int):
        self.rss, self.grow, self.floor, self.cleared_at = start, grow, floor, []
        self.count = 0
        monkeypatch.setattr(_flushing, "resident_bytes", lambda: self.rss)
        monkeypatch.setattr(_flushing, "clear", self._clear)

    def _clear(self) -> None:
        self.cleared_at.append(self.count)
        self.rss = self.floor

    def record(self, flushing: Flushing, values: int) -> None:
        for i in range(values):
            self.count = i
            flushing.after(i)
            self.rss += self.grow


def test_the_resident_memory_of_this_process_is_read() -> None:
    rss = resident_bytes()
    assert (rss is None) == (not Path("/proc/self/statm").is_file())
    if rss is not None:  # what /proc/self/status says in its words (in KiB), within 8 MiB
        status = Path("/proc/self/status").read_text().splitlines()
        (line,) = (ln for ln in status if ln.startswith("VmRSS:"))
        assert 10 * MiB < rss and abs(rss - int(line.split()[1]) * 1024) < 8 * MiB


def test_it_clears_at_the_first_check_past_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    process = _Process(monkeypatch, start=1000 * MiB, grow=MiB // 2, floor=1000 * MiB)
    flushing = Flushing(above=1500 * MiB)
    process.record(flushing, 4000)
    # 500 MiB of room at half a MiB a value: past the bound after 1000 values, seen at the
    # next check, and so again after each clear (the floor leaves HEADROOM under the bound).
    assert process.cleared_at and flushing.clears == len(process.cleared_at)
    for at in process.cleared_at:
        assert at % CHECK_EVERY == 0
        last = max([0, *(c for c in process.cleared_at if c < at)])
        grown = process.floor + (at - last) * process.grow
        assert grown > 1500 * MiB >= grown - CHECK_EVERY * process.grow
    assert flushing.above == 1500 * MiB


def test_where_a_clear_leaves_the_process_high_the_next_waits_for_headroom(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The process holds more than the bound besides jax's programs: clearing at every check
    # would compile every program again each time. It waits until HEADROOM more is used.
    process = _Process(monkeypatch, start=1300 * MiB, grow=MiB // 4, floor=1300 * MiB)
    flushing = Flushing(above=1200 * MiB)
    process.record(flushing, 6000)
    gaps = [b - a for a, b in itertools.pairwise(process.cleared_at)]
    assert process.cleared_at[0] == CHECK_EVERY
    assert gaps and min(gaps) >= HEADROOM // (MiB // 4)
    assert flushing.above == 1300 * MiB + HEADROOM


def test_without_a_reading_it_clears_every_so_many_values(monkeypatch: pytest.MonkeyPatch) -> None:
    cleared: list[int] = []
    monkeypatch.setattr(_flushing, "resident_bytes", lambda: None)
    flushing = Flushing(above=0)
    monkeypatch.setattr(_flushing, "clear", lambda: cleared.append(1))
    for i in range(3 * EVERY + 1):
        flushing.after(i)
    assert flushing.clears == len(cleared) == 3
