"""How the producer runner (`parity.machinery._producer_runner`) runs one group and reads
its order, and how a kept run records its groups on request.

A group runs with the programs it dispatches kept (`parity.origin._programs.capture`, one
process only) where its order is wanted or its recording; its keys are then put in the
order those programs compute them (`parity.origin._record.record_programs`), and, recorded,
the recording's summary is saved as `OUT/<group>.origin.npz`, or why not as
`OUT/<group>.origin.json` (`{"reason": ...}`).

A kept run (`--keep`: `parity.machinery._launcher.kept_producers`) stays alive once every
group is saved, and answers the launcher's requests on stdin, one JSON line each
(`{"record": [group, ...], "out": folder}`): each group recorded op by op into `out` from
the programs its run kept, or, where the run kept none (`--no-order`: no hook went into
jax for the verdict), by running the group again here with the recorder's hooks in (the
programs compiled already, the code imported already), then `out/recorded.json` written
(atomically) to say the request is done. The run exits when stdin closes.

Imported by the runner only; nothing here imports jax at module level.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from parity.origin._record import RecordingError

#: The suffixes of what a recording writes per group: the recording, or why there is none.
ORIGIN_RECORDING = ".origin.npz"
ORIGIN_REASON = ".origin.json"
#: The most bytes a recording's values may take together (`parity.origin._record`).
ORIGIN_MAX_BYTES = 2 << 30
#: What a kept run writes into a request's folder once it recorded what was asked.
RECORDED = "recorded.json"


def log(msg: str) -> None:
    """One `[producers]` line on stderr, which the launcher forwards as progress."""
    print(f"[producers] {msg}", file=sys.stderr, flush=True)


@dataclass
class Kept:
    """What a kept run holds of one group it ran: the group itself (run again where it
    kept no programs), and the programs it dispatched, what it returned (flat, each leaf as
    the group returned it) and the record of its numpy conversions, where kept (None
    otherwise)."""

    group: Callable[[], Any]
    programs: Any = None
    returned: dict[str, Any] | None = None
    converted: Any = None


def _forward_order(
    name: str,
    result: Any,
    returned: dict[str, Any] | None,
    arrays: dict[str, Any],
    converted: Any,
    programs: Any,
    out: Path | None,
    **recording: Any,
) -> tuple[str, dict[str, Any]]:
    """How the group's forward order is made, and its arrays in that order; with `out`
    (`--record-origin`), the group's recording saved there too (`recording`: how, as
    `_recorded_order` takes it).

    A `Dataflow` (the group returned `parity.in_dataflow_order`'s outputs) is in dataflow
    order already. Otherwise the programs the group dispatched (`programs`: a
    `parity.origin._programs.Capture`, None in a multi-process run) are walked, or with
    `out` run op by op (`parity.origin._record.record_programs`), and each key placed where
    the value it was converted from (`converted`: `numpy_conversions`' record) is computed.
    A group whose keys no program computed (numpy computed by numpy), or a multi-process
    run, keeps the order the group declared: its containers' order, which every check's
    header then names."""
    from parity.judge._dataflow import DATAFLOW, DECLARED, HOST, Dataflow

    dataflow = isinstance(result, Dataflow)
    if programs is None or returned is None:
        return (DATAFLOW if dataflow else DECLARED), arrays
    order, recorded = _recorded_order(name, returned, converted, programs, out, **recording)
    if dataflow:
        return DATAFLOW, arrays
    if order is None:  # no program computed a key: an order of the host's, or not read
        return (HOST if recorded else DECLARED), arrays
    if sorted(order) != sorted(arrays):
        return DECLARED, arrays
    return DATAFLOW, {k: arrays[k] for k in order}


def _recorded_order(
    name: str,
    arrays: dict[str, Any],
    converted: Any,
    programs: Any,
    out: Path | None,
    *,
    with_arrays: bool = False,
    replay: Mapping[str, Any] | None = None,
) -> tuple[list[str] | None, bool]:
    """The keys' order read from the group's programs (None where no program computed a
    key) and whether they could be walked; with `out`, the recording (its summary, or with
    `with_arrays` every value's numbers too) saved as `OUT/<name>.origin.npz`, or why not as
    `OUT/<name>.origin.json`; with `replay` (`{"base": recording file, "keys": [...],
    "root": ...}`), recorded with its shadow replay on the base's values and the replay's
    answers saved as `OUT/<name>.replay.json` (`parity.origin._replayed`)."""
    import numpy as np

    from parity.origin import LocaliseError
    from parity.origin._flushing import FLUSH_ABOVE
    from parity.origin._progress import Progress
    from parity.origin._record import RecordingError, record_programs
    from parity.origin._stored import ArraysWriter

    reason, recording, order = None, None, None
    shadow, unreplayed = _shadow(replay) if out is not None else (None, None)
    # Every value's numbers go to the file as they are made, not held until the end.
    writer = ArraysWriter(out / f"{name}{ORIGIN_RECORDING}") if with_arrays and out else None
    try:
        recording, order = record_programs(
            programs,
            arrays,
            sources=converted.source,
            evaluate=out is not None,
            spill=None if writer is None else writer.value,
            max_bytes=ORIGIN_MAX_BYTES,
            flush_above=FLUSH_ABOVE,
            shadow=shadow,
            progress=None if out is None else Progress(lambda line: log(f"{name}: {line}")),
        )
    except RecordingError as e:  # an operation that cannot run on its own: say so, do not fail
        reason = _kept(name, e)
    except LocaliseError as e:
        reason = e.reason
    except Exception as e:  # raised around the operations (linking the outputs, say)
        reason = _kept(name, RecordingError.of(e))
    if out is None:
        if reason is not None:
            log(f"group {name!r}: the forward order stays the declared one: {reason}")
        return order, reason is None
    if reason is None and order is None:
        reason = "the producer's outputs are not computed by the jax programs it ran"
    if (reason is not None or recording is None) and writer is not None:
        writer.abandon()
    if reason is not None or recording is None:
        reason = reason or "nothing was recorded"
        (out / f"{name}{ORIGIN_REASON}").write_text(json.dumps({"reason": reason}))
        log(f"group {name!r}: not recorded: {reason}")
        return order, recording is not None or order is not None
    if writer is not None:
        writer.commit(recording.to_arrays())
    else:
        np.savez(out / f"{name}{ORIGIN_RECORDING}", **recording.to_arrays())  # pyright: ignore[reportArgumentType]
    log(f"group {name!r}: recorded {len(recording.values)} values")
    if replay is not None:
        _answer_replay(name, out, replay, shadow, recording, unreplayed)
    return order, True


def _kept(name: str, failure: RecordingError) -> str:
    """The one-line reason of a recording that raised (`parity.origin._record.
    RecordingError`: the operation, its source line), naming the log its whole traceback
    is kept in (`parity.machinery._logs.keep_log`, in the folder the command that started
    this run uses); the traceback goes to this run's output too."""
    from parity.machinery._logs import keep_log

    print(failure.traceback, file=sys.stderr, flush=True)
    try:
        log = keep_log(f"group {name!r}: {failure.reason}\n\n{failure.traceback}", kind="recording")
    except OSError as e:  # the line still says what raised, and where
        return f"{failure.reason} (its traceback could not be kept: {e})"
    return failure.reason_with(log)


def _shadow(replay: Mapping[str, Any] | None) -> tuple[Any, str | None]:
    """The shadow replay over the base's recording `replay` names, or None and why not."""
    if replay is None:
        return None, None
    from parity.origin._recording import Recording
    from parity.origin._shadow import Shadow

    try:
        return Shadow(Recording.read(replay["base"])), None
    except (OSError, ValueError, KeyError) as e:
        return None, f"the base's recording cannot be replayed on: {e}"


def _answer_replay(
    name: str, out: Path, replay: Mapping[str, Any], shadow: Any, recording: Any, why: str | None
) -> None:
    """The replay's answers for the keys `replay` asks about, written to
    `OUT/<name>.replay.json`."""
    from parity.origin._replayed import REPLAYED, Replayed, answered
    from parity.origin._rounding_proof import RoundingProof
    from parity.store._writer import write_atomic

    path = out / f"{name}{REPLAYED}"
    keys = list(replay["keys"])
    if shadow is None:
        unproved = {k: RoundingProof(k, False, why or "nothing was replayed") for k in keys}
        write_atomic(path, Replayed(unproved).to_json().encode())
        return
    write_atomic(
        path, answered(shadow, recording, keys, root=replay.get("root")).to_json().encode()
    )
    log(f"group {name!r}: replayed on the base's values for {len(keys)} keys")


def run_group(
    name: str,
    group: Callable[[], Any],
    flat: Callable[[Any], dict[str, Any]],
    args: argparse.Namespace,
    one_process: bool,
) -> tuple[str, str, dict[str, Any], Kept]:
    """Run one group: how its forward order was made, why the recorder could not see its
    programs ("" where it could), its flat arrays (`flat` of what it returned), in that
    order, and what a kept run keeps of it. The programs the group dispatches are kept (one
    process only: a recording is made in one) where its order is wanted or, with
    --record-origin, its recording; otherwise no hook goes into jax (`--no-order`)."""
    from parity.judge._dataflow import UNREAD, numpy_conversions
    from parity.judge._trees import flatten
    from parity.origin._programs import capture

    unread = args.no_order and not args.record_origin
    keep = capture() if one_process and not unread else contextlib.nullcontext()
    with numpy_conversions() as converted, keep as programs:
        result = group()
    arrays = flat(result)
    recorder = "" if programs is None else programs.failure
    if unread:
        return UNREAD, recorder, arrays, Kept(group)
    # Keyed as `arrays`, but each leaf as the group returned it (a jax array, or a numpy
    # array made of one while it ran), not the host copy made since: flattened once, for
    # the order and for the kept run's recording alike.
    returned = None if programs is None else flatten(result, to_array=lambda x: x)
    recording_to = Path(args.out) if args.record_origin else None
    how = {"with_arrays": args.record_arrays, "replay": _replays(args.replay).get(name)}
    order_source, arrays = _forward_order(
        name, result, returned, arrays, converted, programs, recording_to, **how
    )
    if programs is None or not args.keep:
        return order_source, recorder, arrays, Kept(group)
    return order_source, recorder, arrays, Kept(group, programs, returned, converted)


def _replays(path: str | None) -> dict[str, Any]:
    """Group -> what its replay on the base's values needs (`_recorded_order`'s `replay`),
    from the file `--replay` names (none without it)."""
    return {} if path is None else dict(json.loads(Path(path).read_text()))


def serve(kept: dict[str, Kept], out: Path) -> None:
    """Say the run is ready (`out/recorded.json`, asked for nothing), then answer the
    launcher's requests on stdin until it closes it (module docstring)."""
    _answer(out, [])
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        folder = Path(request["out"])
        replays = request.get("replay", {})
        for name in request["record"]:
            log(f"recording {name} op by op, in the run that produced it")
            _record_kept(name, kept.get(name), folder, replays.get(name))
        _answer(folder, request["record"])


def _answer(folder: Path, groups: list[str]) -> None:
    """Write `folder/recorded.json` (the groups recorded), whole or not at all."""
    staged = folder / f"{RECORDED}.part"
    staged.write_text(json.dumps({"record": groups}))
    os.replace(staged, folder / RECORDED)


def _record_kept(
    name: str, kept: Kept | None, out: Path, replay: Mapping[str, Any] | None = None
) -> None:
    """Record group `name` into `out` from what its run kept, or by running it again with
    the recorder's hooks in, with its `replay` on the base's values where asked; why not,
    in `out`, where it cannot be."""
    if kept is None:
        why = {"reason": f"group {name!r} was not run in this producer run"}
        (out / f"{name}{ORIGIN_REASON}").write_text(json.dumps(why))
        return
    from parity.judge._dataflow import numpy_conversions
    from parity.judge._trees import flatten
    from parity.origin._programs import capture

    programs, returned, converted = kept.programs, kept.returned, kept.converted
    if programs is None or returned is None:
        try:
            with numpy_conversions() as converted, capture() as programs:
                result = kept.group()
            returned = flatten(result, to_array=lambda x: x)
        except Exception as e:  # it ran once already: say why it cannot run again
            why = {"reason": f"running it again to record it raised {type(e).__name__}: {e}"}
            (out / f"{name}{ORIGIN_REASON}").write_text(json.dumps(why))
            return
    if programs.failure:
        (out / f"{name}{ORIGIN_REASON}").write_text(json.dumps({"reason": programs.failure}))
        return
    _recorded_order(name, returned, converted, programs, out, replay=replay)
