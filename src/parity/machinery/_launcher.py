"""The producer launcher: the producers file run against a code root in a fresh process
(`_producer_runner`, started by path), under the one process supervisor
(`parity.machinery._processes.supervise`), and what that process saved read back. `repin` pins
what it returns, `parity.run._produced` checks it. Every run that fails, of one process or
several, raises `ProducerRunError`: the one producer-run failure, with fields, whose
message says what the failed run leaves in the command that ran it (`LEAVES`).

Nothing here imports jax.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from parity._errors import ParityError
from parity._xla_env import DEFAULT_ISA_CAP
from parity.machinery._devices import isolated_env
from parity.machinery._processes import (
    DEFAULT_TIMEOUT_S,
    Supervised,
    Supervision,
    WorkerFailed,
    run_workers,
    supervised,
)

if TYPE_CHECKING:
    from parity.machinery._config import ParityConfig

__all__ = [
    "EXIT_MISSING_SYMBOL",
    "LEAVES",
    "TRACEBACK_LINES",
    "KeptRun",
    "Mode",
    "ProducerCommand",
    "ProducerRun",
    "ProducerRunError",
    "UnknownGroupsError",
    "UnusableClassError",
    "kept_producers",
    "run_producers",
]

_RUNNER = Path(__file__).with_name("_producer_runner.py")
EXIT_MISSING_SYMBOL = 3
EXIT_UNKNOWN_GROUP = 4
_UNKNOWN_GROUPS = "unknown_groups.json"  # `_producer_runner.UNKNOWN_GROUPS`
EXIT_UNUSABLE_CLASS = 5
_UNUSABLE_CLASSES = "unusable_classes.json"  # `_producer_runner.UNUSABLE_CLASSES`
#: What a kept run writes into a request's folder once done (`_runner_groups.RECORDED`).
_RECORDED = "recorded.json"


#: The commands that run the producers (the CLI's subcommands are `parity._cli.Command`).
ProducerCommand = Literal["repin", "check", "bisect", "calibrate", "baseline", "origin"]

#: What a producer run that failed leaves, in each command that runs one.
LEAVES: dict[ProducerCommand, str] = {
    "repin": "old goldens are untouched",
    "check": "nothing was checked",
    "bisect": "the commit is skipped",
    "calibrate": "nothing was measured or recorded",
    "baseline": "the baseline was not re-produced",
    "origin": "the origin is not named",
}


class ProducerRunError(ParityError, RuntimeError):
    """The producers did not run to the end, or what they saved cannot be used: a crash, a
    symbol the code lacks, a worker of a multi-process run that failed, a timeout, no
    provenance recorded. The one error of a producer run, whichever command ran it.

    **Fields:**

    - `command`: the command that ran the producers (`ProducerCommand`); the message says what the
      failed run leaves there (`LEAVES`: a repin's old goldens are untouched).
    - `failure`: what became of the run, one clause (`"the producers failed (exit 1)"`,
      `"the base commit 1a2b3c4d5e6f lacks a symbol the producers need"`, a worker's exit).
    - `reason`: one line saying why: the runner's own verdict (its last `[producers]`
      line) unless that is only a progress line, else the last line of the output (the
      exception of a traceback); in a multi-process run or a timeout, `failure`.
    - `output`: the output of the process (of every worker), traceback included, for a
      log file; may be empty.
    - `tail`: the lines to print above `reason`: in a multi-process run or a timeout, the
      last output lines of the worker (or workers) that failed; else the end of the
      producer's traceback, its last frames and the exception (`TRACEBACK_LINES`), which
      is otherwise only in the log; empty where the output holds no traceback.
    - `worker`: the process id that failed first in a multi-process run or a timeout (None:
      a single process that failed, or a timeout with several still running).

    Its text is `head` (the failure and what it leaves), then the output.
    """

    def __init__(
        self,
        command: ProducerCommand,
        failure: str,
        output: str = "",
        *,
        reason: str | None = None,
        tail: str | None = None,
        worker: int | None = None,
    ):
        self.command: ProducerCommand = command
        self.failure = failure
        self.output = output
        self.reason = reason if reason is not None else _failure_reason(output, failure)
        self.tail = tail if tail is not None else _traceback_tail(output)
        self.worker = worker
        super().__init__(f"{self.head} Producer output:\n{output}" if output else self.head)

    @property
    def head(self) -> str:
        """One sentence: the failure, and what it leaves in the command that ran it."""
        return f"{self.failure}; {LEAVES[self.command]}."

    @classmethod
    def of_workers(cls, command: ProducerCommand, e: WorkerFailed) -> ProducerRunError:
        """A multi-process run (or a timed-out one) that the supervisor stopped."""
        return cls(command, e.reason, e.output, reason=e.reason, tail=e.tail, worker=e.worker)


#: How many lines of a failed producer's traceback its error prints (the last frames and
#: the exception); the whole output goes to the log.
TRACEBACK_LINES = 12


def _traceback_tail(output: str) -> str:
    """The end of the last traceback in `output`: its last `TRACEBACK_LINES` lines (the
    innermost frames, the exception), without the runner's own `[producers]` lines and
    without the `Traceback (most recent call last):` header; empty if there is none."""
    lines = output.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call")]
    if not starts:
        return ""
    body = [ln for ln in lines[starts[-1] + 1 :] if ln.strip() and not ln.startswith("[producers]")]
    return "\n".join(f"  {ln}" for ln in body[-TRACEBACK_LINES:])


def _failure_reason(output: str, failure: str) -> str:
    """`ProducerRunError.reason` of a single process: the runner's own verdict (its last
    `[producers]` line) unless that is only a progress line, else the last line of the
    output (the exception of a traceback); `failure` where there is no output."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    logged = [
        ln.removeprefix("[producers]").strip() for ln in lines if ln.startswith("[producers]")
    ]
    if logged and not re.match(r"\[\d+/\d+\] .*: running$", logged[-1]):
        return logged[-1]
    return lines[-1] if lines else failure


class UnknownGroupsError(ProducerRunError):
    """Groups were asked for that the producers file does not define (a typo in
    `--groups`): an input error, not a producer that failed.

    **Fields:** `unknown` and `defined` (the groups asked for that it lacks, every group it
    defines), `producers` (the file), `message` (the one line every command says) and
    those of `ProducerRunError`.
    """

    def __init__(
        self,
        command: ProducerCommand,
        unknown: Sequence[str],
        defined: Sequence[str],
        producers: Path,
        output: str,
    ):
        self.unknown = tuple(unknown)
        self.defined = tuple(defined)
        self.producers = producers
        names = ", ".join(repr(g) for g in self.unknown)
        listed = ", ".join(self.defined) or "none"
        self.message = (
            f"no group named {names}: the producers ({producers}) define {listed}; pass one "
            "of them to --groups"
        )
        super().__init__(command, self.message, output)

    @property
    def head(self) -> str:
        return self.message


class UnusableClassError(ProducerRunError):
    """The producers' `CLASS_MAP` names a class parity cannot pin (a typo such as
    `fp32_reasoc`, a parameter missing): an input error, found before any group ran (a
    repin, a check and the pytest plugin ask, a `ProducerRun` with `check_classes`).

    **Fields:** `problems`, one sentence per such rule (the pattern, the name, the nearest
    known class and every known one: `parity.judge._tolerance.class_problem`), and those of
    `ProducerRunError`."""

    def __init__(self, command: ProducerCommand, problems: Sequence[str]):
        self.problems = tuple(problems)
        message = "; ".join(self.problems) + "; fix CLASS_MAP and run again"
        super().__init__(command, message)

    @property
    def head(self) -> str:
        if self.command == "repin":
            return f"{self.failure}: nothing was produced or written, the goldens are untouched"
        return f"{self.failure}: {LEAVES[self.command]}"


def _runner_argv(
    roots: Sequence[Path],
    producers: Path,
    out: Path,
    *,
    code: str,
    drop_paths: Sequence[Path],
    groups: Sequence[str],
) -> list[str]:
    """The producer runner's command line: its code roots (the first is `--src`), the
    producers file, the output folder, the paths to drop and the groups to run."""
    cmd = [sys.executable, str(_RUNNER), "--parent-pid", str(os.getpid())]
    cmd += ["--code", code, "--src", str(roots[0]), "--producers"]
    for extra in roots[1:]:
        cmd += ["--also-src", str(extra)]
    cmd += [str(producers), "--out", str(out)]
    for path in drop_paths:
        cmd += ["--drop-path", str(path)]
    if groups:
        cmd += ["--groups", ",".join(groups)]
    return cmd


#: What a producer run makes: each group's arrays (`produce`), the producers' table alone
#: (`CLASS_MAP`, `STACK`, `RENAME`), no group run (`class_map`: `out/table.json`,
#: `parity.machinery._producers_table.ProducersTable`), or each group's programs recorded
#: op by op instead of its arrays (`record`: `out/<group>.origin.npz`, or `.origin.json`
#: saying why not; `parity.run._origins`).
Mode = Literal["produce", "class_map", "record"]


@dataclass(frozen=True, kw_only=True)
class ProducerRun:
    """One run of the producers, described whole (`run_producers` runs it).

    **Fields:**

    - `code_root`, `producers`, `out`: the code imported (from `code_root/src`, or from
      each of `src`, relative to it, first one first), the producers file, where the run
      saves; `drop_paths`, folders taken off the run's `sys.path` (the user's own tree's,
      in a run at another commit); `code`, that code's name in messages (`"commit
      1a2b3c4d5e6f"`: a symbol the producers need and it lacks is reported as lacking
      there).
    - `command`: the command the run serves, for its messages (`LEAVES`).
    - `mode`: `Mode`; `check_classes`: a `CLASS_MAP` naming a class parity cannot use stops
      the run before any group runs (a repin, a check); `groups`: the groups to run (all
      where empty); `read_order`: read each group's forward order from the programs it
      runs (the recorder's hooks go into jax while it runs); False leaves it unread and
      installs no hook (a check whose goldens pin an order read so already); `keep`:
      a run of one process stays alive once its groups are saved, to record some of them
      op by op on request (`kept_producers`); `record_arrays` (mode `record`): each
      recording keeps every value's numbers (a base a shadow replay runs on); `replay`
      (mode `record`): a JSON file, group -> `{"base", "keys", "root"}`, each group recorded
      with its replay on that base's values (`parity.origin._replayed`); `goldens_layout`:
      a JSON file, group -> its golden keys and shapes, on which the producers' `CONVERT`
      is probed (`parity.machinery._converters`).
    - `devices`, `processes`, `isa`: the layout (`processes` workers of one JAX distributed
      run, `devices` each, process 0 saving) and the ISA cap; `coordinator` (`HOST0:PORT`)
      and `process_id` start only this host's worker of a cluster's run.
    - `timeout`: seconds before the supervisor stops the run (a single process has none
      unless given; several default to `parity.machinery._processes.DEFAULT_TIMEOUT_S`).
    """

    code_root: Path
    producers: Path
    out: Path
    command: ProducerCommand
    mode: Mode = "produce"
    check_classes: bool = False
    groups: Sequence[str] = ()
    read_order: bool = True
    keep: bool = False
    record_arrays: bool = False
    replay: Path | None = None
    goldens_layout: Path | None = None
    src: Sequence[str] | None = None
    drop_paths: Sequence[Path] = ()
    code: str = "the code under test"
    devices: int = 1
    processes: int = 1
    isa: str | None = DEFAULT_ISA_CAP
    timeout: float | None = None
    coordinator: str | None = None
    process_id: int | None = None

    @classmethod
    def of(
        cls, config: ParityConfig, out: Path, *, command: ProducerCommand, **fields: Any
    ) -> ProducerRun:
        """A run of `config`'s producers against its root, src roots, layout and ISA cap,
        `fields` given over them."""
        base: dict[str, Any] = {
            "code_root": config.root,
            "producers": config.need_producers(),
            "src": config.src_relative(),
            "devices": config.devices,
            "processes": config.processes,
            "isa": config.isa,
        }
        return cls(out=out, command=command, **(base | fields))


def _command_line(run: ProducerRun) -> tuple[list[str], dict[str, str]]:
    """The runner's command line for `run`, and its environment (the ISA cap and device
    count set before jax starts)."""
    env = isolated_env(run.devices, isa_cap=run.isa)
    env["PYTHONHASHSEED"] = "0"
    roots = [run.code_root / r for r in run.src] if run.src else [run.code_root / "src"]
    cmd = _runner_argv(
        roots, run.producers, run.out, code=run.code, drop_paths=run.drop_paths, groups=run.groups
    )
    switches = {
        "--class-map-only": run.mode == "class_map",
        "--check-classes": run.check_classes,
        "--record-origin": run.mode == "record",
        "--no-order": not run.read_order and run.mode == "produce",
        "--keep": run.keep and run.processes == 1 and run.mode == "produce",
        "--record-arrays": run.record_arrays and run.mode == "record",
    }
    cmd += [flag for flag, on in switches.items() if on]
    if run.replay is not None and run.mode == "record":
        cmd += ["--replay", str(run.replay)]
    if run.goldens_layout is not None:
        cmd += ["--goldens-layout", str(run.goldens_layout)]
    return cmd, env


def run_producers(run: ProducerRun, *, progress: Callable[[str], None] = print) -> str:
    """Run the producers as `run` describes, in a subprocess (a fresh interpreter, the ISA
    cap and device count set before jax starts), `progress` given its `[producers]` lines.

    One process or several, the run goes through one supervisor
    (`parity.machinery._processes.supervise`), which stops it after `run.timeout` seconds; with
    several (`parity.machinery._processes.run_workers`), the first failure stops them all.

    **Returns:** the XLA flags the subprocess ran under. Raises `ProducerRunError` (its
    message fits `run.command`) with the producer's output (traceback included) if it
    fails, when a worker of a multi-process run fails, and when the run, of one process or
    several, outlives its timeout; its `UnknownGroupsError` when `run.groups` names a group
    the producers do not define, its `UnusableClassError` (with `check_classes`) for such a
    `CLASS_MAP`.
    """
    if run.processes == 1:
        with kept_producers(dataclasses.replace(run, keep=False), progress=progress) as kept:
            return kept.flags
    cmd, env = _command_line(run)

    def forward(line: str) -> None:
        if line.startswith("[producers]"):
            progress(line)

    timeout = DEFAULT_TIMEOUT_S if run.timeout is None else run.timeout
    try:
        run_workers(
            cmd,
            run.processes,
            env=env,
            how=Supervision(timeout=timeout, progress=forward),
            coordinator=run.coordinator,
            process_id=run.process_id,
        )
    except WorkerFailed as e:
        raise ProducerRunError.of_workers(run.command, e) from None
    return env["XLA_FLAGS"]


class KeptRun:
    """A producer run of one process, its groups saved (`kept_producers`): `flags`, the XLA
    flags it ran under; `record(groups, out)` has it record groups op by op, in the same
    process, where it is kept alive (`run.keep`)."""

    def __init__(self, run: ProducerRun, flags: str, live: Supervised | None, tail: list[str]):
        self.run, self.flags, self._live, self._tail = run, flags, live, tail

    def record(
        self, groups: Sequence[str], out: Path, *, replay: Mapping[str, Any] | None = None
    ) -> None:
        """Record `groups` op by op into `out` (`<group>.origin.npz`, or `.origin.json`
        saying why not), from the programs the run kept or by running each group again in
        it (`parity.machinery._runner_groups`), within the run's timeout; a group `replay`
        names (`{"base", "keys", "root"}`) with its replay on that base's values, the
        answers in `<group>.replay.json`. Raises
        `ProducerRunError` where the run is not kept, or ends or fails first."""
        command = self.run.command
        if self._live is None:
            raise ProducerRunError(command, "the producer run was not kept alive", "")
        out.mkdir(parents=True, exist_ok=True)
        (out / _RECORDED).unlink(missing_ok=True)  # an answer to an earlier request
        request = {"record": list(groups), "out": str(out), "replay": dict(replay or {})}
        self._live.send(json.dumps(request))
        try:
            codes = self._live.watch(until=(out / _RECORDED).is_file)
        except WorkerFailed as e:
            self._live = None
            raise ProducerRunError.of_workers(command, e) from None
        if codes is not None:
            self._live = None
            why = f"the kept producer run ended (exit {codes[0]}) before recording"
            raise ProducerRunError(command, why, "\n".join(self._tail))

    def close(self) -> None:
        """End the kept process now (its stdin closed, its exit waited for), so that what it
        holds is free (an accelerator, which one process holds at a time); `record` then
        raises. Nothing where it is not kept."""
        live, self._live = self._live, None
        if live is None:
            return
        live.close_input()
        with contextlib.suppress(WorkerFailed):
            live.watch()


@contextlib.contextmanager
def kept_producers(
    run: ProducerRun, *, progress: Callable[[str], None] = print
) -> Iterator[KeptRun]:
    """Run the producers of `run` (one process) as `run_producers` does, and, with
    `run.keep`, keep the process alive while the block runs, its groups saved, so that a
    failing check records them in it (`KeptRun.record`) without starting another run. The
    process is stopped when the block ends. Raises as `run_producers` does.
    """
    if run.processes != 1:
        raise ValueError(f"a kept run is one process; this one has {run.processes}")
    cmd, env = _command_line(run)
    out, command = run.out, run.command
    tail: list[str] = []

    def collect(line: str) -> None:
        tail.append(line)
        del tail[:-200]
        if line.startswith("[producers]"):
            progress(line)

    ready = out / _RECORDED  # the runner's first answer: every group saved
    how = Supervision(timeout=run.timeout, ok=lambda _: True, progress=collect)
    with supervised(cmd, [env], how, talk=run.keep) as live:
        try:  # one process: a `WorkerFailed` is a timeout
            codes = live.watch(until=ready.is_file if run.keep else None)
        except WorkerFailed as e:
            raise ProducerRunError.of_workers(command, e) from None
        if codes is not None:
            _refuse_exit(run, codes[0], tail)
            if run.keep:
                raise ProducerRunError(command, "the producer run ended before it was done", "")
        ready.unlink(missing_ok=True)
        yield KeptRun(run, env["XLA_FLAGS"], live if run.keep else None, tail)
        # The block is done with it: the supervisor stops a kept process as the block ends.


def _refuse_exit(run: ProducerRun, rc: int, tail: list[str]) -> None:
    """Raise what a single producer process's exit status `rc` says went wrong, if it did."""
    out, command, producers = run.out, run.command, run.producers
    if rc == EXIT_UNKNOWN_GROUP and (out / _UNKNOWN_GROUPS).is_file():
        doc = json.loads((out / _UNKNOWN_GROUPS).read_text())
        unknown, defined, output = doc["unknown"], doc["defined"], "\n".join(tail)
        raise UnknownGroupsError(command, unknown, defined, producers, output)
    if rc == EXIT_UNUSABLE_CLASS and (out / _UNUSABLE_CLASSES).is_file():
        raise UnusableClassError(command, json.loads((out / _UNUSABLE_CLASSES).read_text()))
    if rc != 0:
        failure = (
            f"{run.code} lacks a symbol the producers need"
            if rc == EXIT_MISSING_SYMBOL
            else f"the producers failed (exit {rc})"
        )
        raise ProducerRunError(command, failure, "\n".join(tail))
