"""Ctrl-C and SIGTERM that always reach the main thread, and cleanup they cannot cut short.

**Why.** The kernel delivers a signal sent to a process (`kill PID`, Ctrl-C) to any of its
threads that does not block it. numpy starts OpenBLAS worker threads at import, jax starts
many more, and none of them blocks SIGINT. When the signal lands on such a thread,
CPython 3.11's C handler marks it pending but computes "this thread cannot handle
signals" and does not wake the main thread: a main thread blocked in a read of a child's
output (a repin waiting for its producer) sleeps on, and one running Python code runs on
to the end. Measured: a SIGINT sent with `tgkill` to the OpenBLAS thread of a process in a
3 s Python loop raised `KeyboardInterrupt` only when the loop ended; a repin whose SIGINT
landed there waited for its producer, wrote the new goldens and exited 0 (the flaky
`test_sigint_leaves_old_goldens_and_no_worktree`).

**How.** `signals_reach_main_thread` installs a wakeup fd (CPython's C handler writes the
signal number to it from whichever thread it runs on) and a relay thread that reads it and
sends the main thread a *nudge*, `SIGURG` with a Python handler that does nothing. The
nudge is delivered to the main thread itself, so it interrupts a blocking call there
(EINTR) and marks the pending signals for the main thread; CPython then runs the real
handler (`KeyboardInterrupt` for SIGINT) exactly once, however many nudges were sent. A
signal that landed on the main thread in the first place is handled as usual and its
nudge finds nothing to do.

A process started with SIGINT ignored keeps ignoring it: a command run in the background
(`cmd &`) of a non-interactive shell gets SIGINT set to ignore by the shell, its children
inherit that, and CPython installs its `KeyboardInterrupt` handler only where SIGINT was not
ignored at start. parity honours that (it is how `nohup` and background jobs are meant to
behave); a test that sends SIGINT to a child it started must give the child the terminal's
handler itself. The repin SIGINT test failed that way too, in fresh-clone CI runs started
in the background: the repin never saw the signal and exited 0 after its producer's sleep.

`deferred_signals` holds SIGINT and SIGTERM back during a cleanup (removing a worktree)
and raises them again when it is done, where the old code ignored them: a second Ctrl-C
can neither leave debris nor be lost.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["NUDGE", "deferred_signals", "interruption", "signals_reach_main_thread", "terminated"]

#: The signal the relay sends to the main thread. SIGURG's default action is to ignore it,
#: so a nudge that arrives after the relay's handler is gone does no harm.
NUDGE = signal.SIGURG

_lock = threading.Lock()
_depth = 0


class _Terminated(KeyboardInterrupt):
    """SIGTERM as an interrupt (`terminated`): not an error of parity's, a way out."""


def terminated(signum: int) -> KeyboardInterrupt:
    """SIGTERM, to raise in the main thread where a command turns it into an exception (a
    temporary worktree is open), so that the cleanup a Ctrl-C runs runs for it too: a
    `KeyboardInterrupt`, which the command line says in one line and exits 143 for (128 +
    SIGTERM), as a shell reports it (`interruption`)."""
    return _Terminated(f"signal {signum}")


def interruption(e: KeyboardInterrupt) -> tuple[str, int]:
    """What stopped a command, in words (`"interrupted (Ctrl-C)"`, `"terminated
    (SIGTERM)"`), and its exit code (130, 143)."""
    if isinstance(e, _Terminated):
        return "terminated (SIGTERM)", 128 + signal.SIGTERM
    return "interrupted (Ctrl-C)", 128 + signal.SIGINT


def _nudged(signum: int, frame: FrameType | None) -> None:
    """The nudge's handler: nothing. Its delivery to the main thread is the point."""


def _relay(read_fd: int, main_ident: int, forward_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 512)
        except OSError:
            return
        if not data:  # the write end was closed: the context is over
            return
        if forward_fd >= 0:  # whoever had the wakeup fd before us still hears of it
            with contextlib.suppress(OSError):
                os.write(forward_fd, data)
        if any(b != NUDGE for b in data):
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pthread_kill(main_ident, NUDGE)


@contextlib.contextmanager
def signals_reach_main_thread() -> Iterator[None]:
    """Within the block, every signal that has a Python handler (SIGINT's
    `KeyboardInterrupt`, a SIGTERM handler) is handled by the main thread promptly,
    whichever thread the kernel delivered it to. Nested uses share one relay; in a thread
    other than the main one it does nothing (only the main thread handles signals)."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with _lock:
        _depth += 1
        first = _depth == 1
    if not first:
        try:
            yield
        finally:
            with _lock:
                _depth -= 1
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    old_handler = signal.signal(NUDGE, _nudged)
    old_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    relay = threading.Thread(
        target=_relay,
        args=(read_fd, threading.main_thread().ident, old_fd),
        name="parity-signal-relay",
        daemon=True,
    )
    relay.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        os.close(write_fd)  # the relay reads end-of-file and returns
        relay.join(timeout=5)
        os.close(read_fd)
        signal.signal(NUDGE, old_handler)
        with _lock:
            _depth -= 1


@contextlib.contextmanager
def deferred_signals(*signums: int) -> Iterator[None]:
    """Hold `signums` (default SIGINT and SIGTERM) back for the block, then raise each one
    that arrived, once, in this thread, so its usual handler runs after the block. In a
    thread other than the main one it does nothing."""
    signums = signums or (signal.SIGINT, signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if signum not in arrived:
            arrived.append(signum)

    # A handler installed from C (getsignal gives None) cannot be put back: left alone.
    old = {s: signal.signal(s, hold) for s in signums if signal.getsignal(s) is not None}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        for s in arrived:
            # Handlers that Python did not install (SIG_DFL, SIG_IGN, C handlers) act as
            # the process would have without the deferral.
            signal.raise_signal(s)
