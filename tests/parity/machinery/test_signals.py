"""Signals reach the main thread wherever they land; cleanup defers them, never drops them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from parity.machinery._signals import deferred_signals

pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64", reason="tgkill is x86-64's 234")


@pytest.fixture
def sigint_as_in_a_terminal():
    """SIGINT raising KeyboardInterrupt, as in a terminal: a CI job started in the
    background of a non-interactive shell inherits SIGINT ignored, which Python keeps."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_a_sigint_during_a_deferred_block_is_raised_after_it_once(sigint_as_in_a_terminal):
    reached_end = False
    with pytest.raises(KeyboardInterrupt), deferred_signals():
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        reached_end = True
    assert reached_end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


_WAITER = """
    import ctypes, os, select, signal, sys, threading, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (see above)
    from parity.machinery._signals import signals_reach_main_thread
    {launcher}
    tid = []
    threading.Thread(target=lambda: (tid.append(threading.get_native_id()), time.sleep(600)),
                     daemon=True).start()
    while not tid:
        time.sleep(0.01)
    libc = ctypes.CDLL(None, use_errno=True)
    t0 = time.monotonic()
    try:
        with signals_reach_main_thread():
            libc.syscall(234, os.getpid(), tid[0], signal.SIGINT)  # tgkill: not the main thread
            {wait}
        print("not interrupted after", time.monotonic() - t0)
        sys.exit(0)
    except KeyboardInterrupt:
        print("interrupted after", round(time.monotonic() - t0, 1))
        sys.exit(130)
"""


@pytest.mark.parametrize(
    "wait",
    [
        "r, w = os.pipe(); select.select([r], [], [], 20)",  # blocked in a system call
        "x = 0\n            while time.monotonic() - t0 < 20: x += 1",  # running bytecode
    ],
    ids=["blocked", "busy"],
)
def test_a_sigint_delivered_to_another_thread_interrupts_the_main_thread_at_once(wait):
    code = textwrap.dedent(_WAITER.format(launcher="", wait=wait))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert time.monotonic() - t0 < 15, proc.stdout  # the wait alone lasts 20 s


_LAUNCHER = """
    import ctypes, os, pathlib, signal, sys, threading, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (see above)
    from parity.machinery._processes import Supervision, run_workers
    import numpy
    PIDS = pathlib.Path({pids!r})
    WORKER = "import os, time; open({pids!r}, 'a').write(str(os.getpid()) + ' '); time.sleep(60)"

    def _send_when_started():  # from a thread that is not the main one, to itself
        while not PIDS.exists() or len(PIDS.read_text().split()) < 2:
            time.sleep(0.05)
        # A thread Python does not run (numpy's OpenBLAS pool), as a user's Ctrl-C may hit.
        python = {{t.native_id for t in threading.enumerate()}}
        other = [int(t) for t in os.listdir("/proc/self/task") if int(t) not in python]
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall(234, os.getpid(), other[0], signal.SIGINT)
        time.sleep(600)

    threading.Thread(target=_send_when_started, daemon=True).start()
    try:
        how = Supervision(timeout=50)
        run_workers([sys.executable, "-c", WORKER], 2, env=dict(os.environ), how=how)
    except KeyboardInterrupt:
        sys.exit(130)
"""


def test_the_launcher_stops_its_workers_on_a_sigint_delivered_to_another_thread(tmp_path):
    import numpy as np  # noqa: F401

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("numpy's OpenBLAS starts no thread of its own on one core")
    pids = tmp_path / "pids"
    code = textwrap.dedent(_LAUNCHER.format(pids=str(pids)))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert time.monotonic() - t0 < 40, proc.stdout  # the workers sleep 60 s
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 2
    for pid in started:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
