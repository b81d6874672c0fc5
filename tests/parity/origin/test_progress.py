"""A long recording says how it goes (issue 76, `parity.origin._progress`): at most one line
every so many seconds, with the values recorded, the program of how many, the scan steps
it is in (the layer of a scanned model) and the source line of the last value."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from parity.origin._interpreter import Interpreter
from parity.origin._progress import Progress


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_line_is_said_at_most_every_so_many_seconds_with_where_it_is() -> None:
    clock, said = _Clock(), []
    progress = Progress(said.append, every=10.0, clock=clock)
    progress.program(2, 3)
    progress.step(0, 4, first=True)
    progress.step(2, 4, first=False)
    progress.step(0, 8, first=True)  # a scan inside the layer's
    for count in range(1, 2049):
        clock.now = count * 0.05  # 102 s over 2,048 values
        progress.value(count, "model.py:7 in block")
    # The clock is looked at every 256 values, 12.8 s apart: each look says a line.
    assert len(said) == 8, said
    assert said[0] == (
        "256 values recorded, program 2 of 3, scan step 3 of 4 > scan step 1 of 8, "
        "at model.py:7 in block"
    )
    progress.left()  # the inner scan, entered at 0 s and left at 102.4 s: how long it took
    assert said[-1] == (
        "a scan of 8 steps recorded in 102.4 s: 102.4 s a step (the median of 1), "
        "the slowest 102.4 s"
    )
    clock.now += 60
    progress.value(4096, "")
    assert said[-1] == "4,096 values recorded, program 2 of 3, scan step 3 of 4"
    for step, at in [(3, 170.0), (4, 171.0)]:  # the outer scan's steps: 0, 170, 1 and 1.5 s
        clock.now = at
        progress.step(step, 4, first=False)
    clock.now = 172.5
    progress.left()
    assert said[-1] == (
        "a scan of 4 steps recorded in 172.5 s: 1.5 s a step (the median of 4), the slowest 170.0 s"
    )


def test_a_recording_of_a_scanned_model_says_its_layer() -> None:
    said: list[str] = []

    def forward(ws: Any, x: Any) -> Any:
        def layer(h: Any, w: Any) -> Any:
            return jnp.tanh(h @ w), None

        return jax.lax.scan(layer, x, ws)[0]

    ws = jnp.ones((3, 4, 4)) * 0.1
    x = jnp.ones((2, 4))
    closed = jax.make_jaxpr(forward)(ws, x)
    ticks = iter(range(1_000_000))  # a second each time it looks
    progress = Progress(said.append, every=0.0, look=1, clock=lambda: float(next(ticks)))
    interp = Interpreter(progress=progress)
    ins = [interp.add(a, "input", "input", [], (("", 0, ""), "", "")) for a in (ws, x)]
    interp.closed(closed, ins, (("", 0, ""), "", ""))
    layers = {line.split("scan step ")[1].split(",")[0] for line in said if "scan step" in line}
    assert layers == {"1 of 3", "2 of 3", "3 of 3"}, said
    assert any("test_progress.py" in line for line in said), said  # where, in the user's code
    assert not progress.steps  # every scan it entered, it left
    assert said[-1].startswith("a scan of 3 steps recorded in "), said  # and how long
