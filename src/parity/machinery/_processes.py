"""Runs over several processes on JAX's own multi-controller runtime (docs/design.md,
"Multi-process runs").

The launcher's half (`run_workers`, `free_port`, over `supervise`, the one process
supervisor, which a single producer process runs under too), imported by jax-free parents
(the `parity check` command, the pytest plugin's launching session), starts N worker
processes, watches them and owns them: a worker that exits badly, is killed or outlives the
timeout ends the whole run (every other worker is stopped, its process group killed), with
a `WorkerFailed` naming the worker and its last output lines; no process, port or
temporary file outlives the call. The worker's half is `parity.machinery._worker`.

Nothing here imports jax at module level.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from parity._errors import ParityError
from parity.machinery._signals import signals_reach_main_thread
from parity.machinery._worker import ENV_COORDINATOR, ENV_LAUNCHER, ENV_PROCESS_ID, ENV_PROCESSES

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "KILL_GRACE_S",
    "Layout",
    "NoSockets",
    "Supervised",
    "Supervision",
    "WorkerFailed",
    "free_port",
    "run_workers",
    "supervise",
    "supervised",
]

#: How long a multi-process run may take before its workers are stopped (seconds): room for
#: every group of a real subject on a loaded 2-core machine (a hang ends here, a failure at
#: once).
DEFAULT_TIMEOUT_S = 1800.0
#: After the first failure (or the timeout), how long a worker has between SIGTERM and
#: SIGKILL of its process group: the whole run ends within this bound (plus a poll).
KILL_GRACE_S = 5.0

_TAIL_LINES = 12
_POLL_S = 0.05


@dataclass(frozen=True)
class Layout:
    """How a run is laid out: `processes` processes with `devices` (simulated CPU)
    devices each."""

    processes: int = 1
    devices: int = 1

    def __str__(self) -> str:
        p = "process" if self.processes == 1 else "processes"
        d = "device" if self.devices == 1 else "devices"
        total = self.processes * self.devices
        return f"{self.processes} {p} x {self.devices} {d} ({total} in all)"


class WorkerFailed(ParityError, RuntimeError):
    """A multi-process run ended badly.

    **Fields:** `worker` (the process id that failed first, or None when the run timed out
    with several still running), `reason` (one line), `tail` (the last output lines of the
    worker, or of every worker still running at a timeout) and `output` (every worker's
    whole output, for a log file).
    """

    def __init__(self, worker: int | None, reason: str, tail: str, output: str):
        super().__init__(f"{reason}; last output lines:\n{tail}" if tail else reason)
        self.worker, self.reason, self.tail, self.output = worker, reason, tail, output


class NoSockets(WorkerFailed):
    """This machine lets no process open a TCP socket (a sandbox; some TPU VMs), so JAX's
    distributed runtime cannot start and no multi-process run is possible here. A
    `WorkerFailed` with no worker: every caller that reports a failed run says it in one
    line."""

    def __init__(self, error: OSError):
        reason = (
            f"this machine allows no TCP socket ({error.strerror or error}), so "
            "jax.distributed cannot start: a run of several processes is not possible here "
            "(run one process, or where sockets are allowed)"
        )
        super().__init__(None, reason, "", "")


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now (the coordinator's). Raises
    `NoSockets` where the machine allows no socket."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("localhost", 0))
            return int(s.getsockname()[1])
    except OSError as e:
        raise NoSockets(e) from None


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _tail(text: str, n: int = _TAIL_LINES) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()][-n:]


def _stop(procs: Sequence[subprocess.Popen[bytes]], grace: float) -> None:
    """SIGTERM every live worker's process group, then SIGKILL what is left after `grace`."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(p.poll() is None for p in live) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    for p in procs:
        # The group too, for grandchildren; a reaped worker's group may still have some.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=grace)


def _exit_zero(code: int) -> bool:
    return code == 0


@dataclass(frozen=True, kw_only=True)
class Supervision:
    """How `supervise` (and `run_workers`, over it) owns the processes it starts.

    **Fields:** `timeout` (seconds the whole run may take; None: no limit), `ok` (which exit
    statuses are not failures; default only 0: pytest also ends with 1 when a test fails,
    a verdict, not a fault), `echo` (where the first process's output is copied as it
    comes: the report is its), `progress` (receives the first process's output lines as
    they come, the last one too if it ends without a newline), `cwd` (the processes'
    working folder).
    """

    timeout: float | None = DEFAULT_TIMEOUT_S
    ok: Callable[[int], bool] = _exit_zero
    echo: IO[str] | None = None
    progress: Callable[[str], None] | None = None
    cwd: str | os.PathLike[str] | None = None


def run_workers(
    argv: Sequence[str],
    n: int,
    *,
    env: Mapping[str, str],
    how: Supervision,
    coordinator: str | None = None,
    process_id: int | None = None,
) -> list[int]:
    """Run `n` copies of `argv` as the processes of one distributed run, and own them.

    Worker `i` gets `env` plus `PARITY_PROCESS_ID=i`, `PARITY_PROCESSES=n` and
    `PARITY_COORDINATOR=localhost:<port>` (a port free when the run starts); `supervise`
    runs them. On a cluster, each host starts one worker of the run: `process_id` says
    which, `coordinator` where process 0 listens (`HOST0:PORT`).

    **Arguments:**

    - `argv`: the worker's command line, the same for every process.
    - `n`: the number of processes, at least 1.
    - `env`: the workers' environment.
    - `how`: the timeout, the exit statuses that pass, where worker 0's output goes, the
      working folder (`Supervision`).
    - `coordinator`: `HOST:PORT` of process 0's coordinator (default: a free local port).
    - `process_id`: start only this worker of the `n` (one process per host; the other
      hosts start theirs); default all `n`, here.

    **Returns:** the exit statuses, by local worker, once every worker exited with a status
    `how.ok` accepts. Raises `WorkerFailed` as soon as one worker exits with another status
    or is killed (every other worker stopped within `KILL_GRACE_S`), or at the timeout.
    """
    if n < 1:
        raise ValueError(f"a run needs at least 1 process, got {n}")
    if process_id is not None and not 0 <= process_id < n:
        raise ValueError(f"process id {process_id} is not one of the run's 0..{n - 1}")
    if process_id is not None and coordinator is None:
        raise ValueError("a run spread over hosts needs the coordinator's HOST:PORT")
    coordinator = coordinator or f"localhost:{free_port()}"
    ids = list(range(n)) if process_id is None else [process_id]
    envs = []
    for i in ids:
        worker_env = {**env, ENV_PROCESS_ID: str(i), ENV_PROCESSES: str(n)}
        worker_env[ENV_COORDINATOR] = coordinator
        worker_env[ENV_LAUNCHER] = str(os.getpid())
        envs.append(worker_env)
    return supervise(argv, envs, how, ids=ids, n=n)


def supervise(
    argv: Sequence[str],
    envs: Sequence[Mapping[str, str]],
    how: Supervision,
    *,
    ids: Sequence[int] | None = None,
    n: int | None = None,
) -> list[int]:
    """Run `argv` once per environment in `envs`, and own the processes: the one supervisor
    of a single producer process (`parity.machinery._launcher.run_producers`) and of the workers of
    a multi-process run (`run_workers`); `supervised` watched until every process exited.

    **Arguments:**

    - `argv`: the command line, the same for every process.
    - `envs`: one environment per process.
    - `how`: the timeout, the exit statuses that pass, where the first process's output
      goes, the working folder (`Supervision`).
    - `ids`: the processes' ids in messages (default 0, 1, ...); `n`: the size of the run
      they belong to (default `len(envs)`).

    **Returns:** the exit statuses, by process, once every process exited with a status
    `how.ok` accepts. Raises `WorkerFailed` as soon as one process exits with another status
    or is killed, or at the timeout.
    """
    with supervised(argv, envs, how, ids=ids, n=n) as run:
        codes = run.watch()
    assert codes is not None  # nothing to wait for but their exits
    return codes


@contextlib.contextmanager
def supervised(
    argv: Sequence[str],
    envs: Sequence[Mapping[str, str]],
    how: Supervision,
    *,
    ids: Sequence[int] | None = None,
    n: int | None = None,
    talk: bool = False,
) -> Iterator[Supervised]:
    """Start `argv` once per environment in `envs` and own the processes while the block
    runs (`Supervised`: watch them, talk to the first one).

    Each process runs in a process group of its own, stdin closed (`talk`: a pipe the
    first process reads its requests from, `Supervised.send`), its stdout and stderr going
    to an anonymous temporary file (no name on disk, so none is left even when this process
    is killed). No process or process group outlives the block: on its end, on a failure,
    at a timeout and on Ctrl-C or SIGTERM alike, every process still running gets SIGTERM
    and, `KILL_GRACE_S` later, SIGKILL. Arguments as `supervise` takes them.
    """
    ids = list(range(len(envs))) if ids is None else list(ids)
    n = len(envs) if n is None else n
    logs: list[IO[bytes]] = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for j, proc_env in enumerate(envs):
            log = tempfile.TemporaryFile(prefix="parity-workers-")  # noqa: SIM115 (closed below)
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    list(argv),
                    env=dict(proc_env),
                    cwd=how.cwd,
                    stdin=subprocess.PIPE if talk and j == 0 else subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        with signals_reach_main_thread():
            yield Supervised(procs, ids, n, logs, how)
    finally:
        _stop(procs, KILL_GRACE_S)
        for p in procs:
            if p.stdin is not None:
                with contextlib.suppress(OSError):
                    p.stdin.close()
        for log in logs:
            log.close()


def _read(log: IO[bytes], start: int = 0) -> bytes:
    """What a process wrote to `log` from byte `start` on. `pread` leaves the file offset,
    which the writing process shares, where that process put it."""
    fd = log.fileno()
    return os.pread(fd, max(os.fstat(fd).st_size - start, 0), start)


class Supervised:
    """The processes `supervised` started: `watch` them (until they exit, or until a
    condition holds with them still running), `send` the first one a request, read its
    `output`."""

    def __init__(
        self,
        procs: Sequence[subprocess.Popen[bytes]],
        ids: Sequence[int],
        n: int,
        logs: Sequence[IO[bytes]],
        how: Supervision,
    ):
        self._procs, self._ids, self._n, self._logs, self._how = procs, ids, n, logs, how
        self._seen, self._pending = 0, ""  # what of the first process's output went on

    def output(self, j: int = 0) -> str:
        """What the `j`th process wrote so far."""
        return _read(self._logs[j]).decode("utf-8", "replace")

    def send(self, line: str) -> None:
        """Write one line to the first process's stdin (`supervised(talk=True)`). A process
        that exited already is left to `watch` to report."""
        pipe = self._procs[0].stdin
        if pipe is None:
            raise ValueError("the processes were started without a pipe to talk to")
        with contextlib.suppress(BrokenPipeError):
            pipe.write(line.rstrip("\n").encode() + b"\n")
            pipe.flush()

    def close_input(self) -> None:
        """Close the first process's stdin (`supervised(talk=True)`): a process that reads
        its requests there until it closes ends."""
        pipe = self._procs[0].stdin
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()

    def _everything(self) -> str:
        return "\n".join(f"--- process {i} ---\n{self.output(j)}" for j, i in enumerate(self._ids))

    def _forward(self, last: bool = False) -> None:
        how = self._how
        if how.echo is None and how.progress is None:
            return
        chunk = _read(self._logs[0], self._seen)
        self._seen += len(chunk)
        text = self._pending + chunk.decode("utf-8", "replace")
        if how.echo is not None:
            how.echo.write(text[len(self._pending) :])
            how.echo.flush()
        lines = text.split("\n")
        self._pending = lines.pop()
        if last and self._pending:
            lines.append(self._pending)
            self._pending = ""
        if how.progress is not None:
            for line in lines:
                how.progress(line)

    def watch(self, until: Callable[[], bool] | None = None) -> list[int] | None:
        """Forward the first process's output until every process exited, or `until()`
        holds first (the processes still running), within the supervision's timeout from
        this call.

        **Returns:** the exit statuses, by process, once every process exited with a status
        the supervision accepts; None where `until()` held first. Raises `WorkerFailed` as
        soon as one process exits with another status or is killed, or at the timeout.
        """
        procs, ids, how = self._procs, self._ids, self._how
        deadline = None if how.timeout is None else time.monotonic() + how.timeout
        while True:
            self._forward()
            codes = [p.poll() for p in procs]
            for j, code in enumerate(codes):
                if code is not None and not how.ok(code):
                    _stop(procs, KILL_GRACE_S)
                    self._forward(last=True)
                    tail = "\n".join(f"  {ln}" for ln in _tail(self.output(j)))
                    others = (
                        "the other processes were stopped"
                        if len(procs) > 1
                        else "it ran alone here"
                    )
                    raise WorkerFailed(
                        ids[j],
                        f"process {ids[j]} of {self._n} {_describe_exit(code)}; {others}",
                        tail,
                        self._everything(),
                    )
            if all(c is not None for c in codes):
                self._forward(last=True)
                return [c for c in codes if c is not None]
            if until is not None and until():
                self._forward()
                return None
            if deadline is not None and time.monotonic() > deadline:
                running = [i for i, c in enumerate(codes) if c is None]
                _stop(procs, KILL_GRACE_S)
                tail = "\n".join(
                    f"  process {i}: {ln}" for i in running for ln in _tail(self.output(i), 4)
                )
                raise WorkerFailed(
                    running[0] if len(running) == 1 else None,
                    f"the run timed out after {how.timeout:g} s with process(es) "
                    f"{', '.join(map(str, running))} of {len(procs)} still running (a hang, or "
                    "a run longer than the timeout: raise the timeout); they were stopped",
                    tail,
                    self._everything(),
                )
            time.sleep(_POLL_S)
