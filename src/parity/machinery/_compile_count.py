"""How many programs this process compiled, and how many it loaded from jax's persistent
compilation cache instead.

jax reports both through `jax.monitoring`: `/jax/core/compile/backend_compile_duration` once
per program handed to XLA (the span covers the cache lookup too), and
`/jax/compilation_cache/cache_hits` once per program the cache answered. A compile is the
first minus the second. `install` registers the two listeners once per process. A compile
is also timed, by the program's name and by the test that was running
(`PYTEST_CURRENT_TEST`, which pytest sets and the processes a test starts inherit), so that a
log says where a suite's compile seconds went.

With `PARITY_COMPILE_LOG` naming a folder, a process that installed the counter writes its
figures there when it exits (`<pid>.json`); `read_log` adds them up. `tools/bench_suite.py`
sets it for a whole suite or main job, so the producer processes the CLI starts and the
workers of a distributed session are counted beside pytest's own.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from parity.judge._floats import count

__all__ = [
    "LOG_VAR",
    "Compiled",
    "Counts",
    "counts",
    "flush",
    "install",
    "read_compiles",
    "read_log",
]

#: The folder each counted process writes its figures to when it exits.
LOG_VAR = "PARITY_COMPILE_LOG"

_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT = "/jax/compilation_cache/cache_hits"


@dataclass(frozen=True)
class Counts:
    """**Fields:** `compiled` (programs XLA compiled), `loaded` (programs read from the
    persistent cache), `processes` (how many processes the figures add up)."""

    compiled: int = 0
    loaded: int = 0
    processes: int = 1

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.compiled + other.compiled,
            self.loaded + other.loaded,
            self.processes + other.processes,
        )

    def line(self) -> str:
        return (
            f"XLA compiled {count(self.compiled, 'program')} and loaded {self.loaded} from the "
            f"compilation cache ({count(self.processes, 'process', 'processes')})"
        )


_requests = 0
_hits = 0
_installed = False
#: (test, program name) -> [programs compiled, seconds]: the compiles, not the cache loads.
_timed: dict[tuple[str, str], list[float]] = {}
#: Whether the cache answered the request whose span is open (its hit event comes first).
_answered = False


def _on_duration(event: str, duration_secs: float, **kwargs: object) -> None:
    global _requests, _answered
    if event != _BACKEND_COMPILE:
        return
    _requests += 1
    if _answered:
        _answered = False
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    entry = _timed.setdefault((test, str(kwargs.get("fun_name", ""))), [0, 0.0])
    entry[0] += 1
    entry[1] += duration_secs


def _on_event(event: str, **_: object) -> None:
    global _hits, _answered
    if event == _CACHE_HIT:
        _hits += 1
        _answered = True


def install() -> None:
    """Count this process's compiles from now on; with `PARITY_COMPILE_LOG` set, write them
    there at exit. Idempotent."""
    global _installed
    if _installed:
        return
    import jax.monitoring

    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    jax.monitoring.register_event_listener(_on_event)
    _installed = True
    if os.environ.get(LOG_VAR):
        atexit.register(flush)


def counts() -> Counts:
    """This process's figures since `install`."""
    return Counts(_requests - _hits, _hits)


def flush() -> None:
    """Write this process's figures to `PARITY_COMPILE_LOG` now (again at exit: the last
    write stands). A no-op where it is not set. For processes that may end without running
    `atexit` (an xdist worker), called at the end of their session."""
    raw = os.environ.get(LOG_VAR)
    if not raw:
        return
    folder = Path(raw)
    c = counts()
    timed = [[test, name, n, secs] for (test, name), (n, secs) in sorted(_timed.items())]
    doc = {"argv": sys.argv[:3], "compiled": c.compiled, "loaded": c.loaded, "timed": timed}
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{os.getpid()}.json.tmp"
    tmp.write_text(json.dumps(doc))
    tmp.replace(folder / f"{os.getpid()}.json")


def read_log(folder: Path) -> Counts:
    """The sum of the figures the processes wrote to `folder`."""
    total = Counts(0, 0, 0)
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        total = total + Counts(int(doc["compiled"]), int(doc["loaded"]))
    return total


@dataclass(frozen=True)
class Compiled:
    """Compiles of one program name, or under one test, summed over the processes of a log.

    **Fields:** `name` (the program's name, or the test's node id), `programs` (how many
    were compiled), `seconds` (their compile seconds, cache look-ups included),
    `processes` (in how many processes)."""

    name: str
    programs: int
    seconds: float
    processes: int


def read_compiles(folder: Path, *, by: str) -> list[Compiled]:
    """The compiles the processes wrote to `folder`, summed by `"program"` (name) or by
    `"test"` (node id; `""` outside a test), most seconds first."""
    index = {"test": 0, "program": 1}[by]
    sums: dict[str, list[float]] = {}
    where: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.json")):
        for row in json.loads(path.read_text()).get("timed", []):
            entry = sums.setdefault(row[index], [0, 0.0])
            entry[0] += int(row[2])
            entry[1] += float(row[3])
            where.setdefault(row[index], set()).add(path.stem)
    rows = [Compiled(k, int(n), s, len(where[k])) for k, (n, s) in sums.items()]
    return sorted(rows, key=lambda r: (-r.seconds, r.name))
