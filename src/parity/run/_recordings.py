"""The programs of a group recorded op by op: in a producer run of their own
(`record_groups`) or in the run that made the arrays (`record_kept`), each with its shadow
replay on a base's values where asked (`parity.origin._replayed`), and beside a cached
baseline (`parity.run._baseline`: `<group>.h5`, and `<group>.origin.npz` or, where they
could not be recorded, why in `<group>.origin.json`), as the producer runner writes them
(`--record-origin`) and a failing check reads them (`parity.run._origins`). Nothing here
imports jax.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from parity.machinery._config import ParityConfig
from parity.machinery._launcher import KeptRun, ProducerRun, ProducerRunError, run_producers
from parity.origin._recording import FORMAT, format_of
from parity.origin._replayed import REPLAYED, Replayed, read_replayed
from parity.origin._settling import NotRecorded
from parity.run._produced import Checkout

__all__ = [
    "ARRAYS",
    "NOT_RECORDED",
    "RECORDING",
    "Made",
    "Record",
    "Replaying",
    "keep_recording",
    "record_groups",
    "record_kept",
    "recorded",
]

#: What of its programs a baseline entry keeps recorded: nothing (False), the recording's
#: summary (True), or every value's numbers too (`ARRAYS`: what a shadow replay runs on).
ARRAYS: Literal["arrays"] = "arrays"
Record = bool | Literal["arrays"]


#: Beside a cached baseline `<group>.h5`: its programs recorded op by op at the base, or
#: why they could not be (`{"reason": ...}`), as the producer runner writes them.
RECORDING, NOT_RECORDED = ".origin.npz", ".origin.json"


def recorded(path: Path, *, arrays: bool = False) -> Path | NotRecorded | None:
    """The recording beside the cached baseline at `path`: its file, why there is none
    (`parity.origin.NotRecorded`), or None where it was not asked for (with `arrays`: also where it
    keeps no value's numbers, which a shadow replay runs on)."""
    npz, why = path.with_suffix(RECORDING), path.with_suffix(NOT_RECORDED)
    if npz.is_file():
        try:  # one an older parity wrote is made again
            with np.load(npz) as data:
                whole = not arrays or "array.0" in data or data["meta.kind"].size == 0
                return npz if format_of(data) == FORMAT and whole else None
        except (OSError, ValueError):  # unreadable: made again
            return None
    if why.is_file():
        return NotRecorded(str(json.loads(why.read_text())["reason"]))
    return None


def keep_recording(out: Path, group: str, path: Path) -> None:
    """Move what the run wrote of `group`'s recording (`out/<group>.origin.*`) beside the
    baseline at `path`, atomically (the entry's lock is held)."""
    for suffix in (RECORDING, NOT_RECORDED):
        made = out / f"{group}{suffix}"
        target = path.with_suffix(suffix)
        if made.is_file():
            staged = target.with_suffix(".part")
            shutil.copyfile(made, staged)
            os.replace(staged, target)
            return
    why = {"reason": "the producers recorded nothing for it"}
    target = path.with_suffix(NOT_RECORDED)
    target.write_text(json.dumps(why))


@dataclass(frozen=True)
class Replaying:
    """A group to record with its shadow replay: `base`, the base's recording with every
    value's numbers (`ARRAYS`); `keys`, those to prove up to rounding; `root`, what the
    origins' paths are given relative to."""

    base: Path
    keys: Sequence[str]
    root: Path

    def request(self) -> dict[str, object]:
        """As the producer runner reads it (`--replay`, a kept run's request)."""
        return {"base": str(self.base), "keys": list(self.keys), "root": str(self.root)}


@dataclass(frozen=True)
class Made:
    """One group's recording on the tree: its file, or why there is none; and its replay's
    answers where one was asked for and made."""

    recording: Path | NotRecorded
    replayed: Replayed | None = None


Progress = Callable[[str], None]


def record_groups(
    at: Checkout,
    config: ParityConfig,
    groups: Sequence[str],
    out: Path,
    *,
    replay: Mapping[str, Replaying] | None = None,
    arrays: bool = False,
    progress: Progress = lambda _: None,
    timeout: float | None = None,
) -> dict[str, Made]:
    """Record `groups`' programs in the code `at` in one producer run (`--record-origin`),
    into `out`, in one process with the device count and ISA cap of `config`; a group
    `replay` names with its shadow replay on that base's values; with `arrays`, every
    value's numbers kept too (what another recording's replay runs on).

    **Returns:** group -> what was made of it.
    """
    code = at.name
    asked = None
    if replay:
        asked = out / "replay-request.json"
        asked.write_text(json.dumps({g: r.request() for g, r in replay.items()}))
    try:
        run = ProducerRun.of(
            config,
            out,
            command="origin",
            mode="record",
            code_root=at.root,
            processes=1,
            groups=groups,
            drop_paths=at.drop_paths,
            timeout=timeout,
            code=code,
            replay=asked,
            record_arrays=arrays,
        )
        run_producers(run, progress=progress)
    except ProducerRunError as e:
        return dict.fromkeys(
            groups, Made(NotRecorded(f"the producers cannot run at {code}: {e.reason}"))
        )
    return _found(out, groups, code)


def record_kept(
    kept: KeptRun,
    groups: Sequence[str],
    out: Path,
    *,
    code: str,
    replay: Mapping[str, Replaying] | None = None,
) -> dict[str, Made]:
    """Record `groups`' programs into `out` in the producer run that made their arrays,
    kept alive (`parity.machinery._launcher.KeptRun.record`): no other run starts.

    **Returns:** as `record_groups`.
    """
    try:
        kept.record(groups, out, replay={g: r.request() for g, r in (replay or {}).items()})
    except ProducerRunError as e:
        return dict.fromkeys(
            groups, Made(NotRecorded(f"the producers cannot record at {code}: {e.reason}"))
        )
    return _found(out, groups, code)


def _found(out: Path, groups: Sequence[str], code: str) -> dict[str, Made]:
    """Group -> its recording's file in `out` (or the line saying why it has none) and its
    replay's answers where there are some."""
    found: dict[str, Made] = {}
    for g in groups:
        path, why = out / f"{g}{RECORDING}", out / f"{g}{NOT_RECORDED}"
        replayed = read_replayed(out / f"{g}{REPLAYED}")
        if path.is_file():
            found[g] = Made(path, replayed)
        elif why.is_file():
            found[g] = Made(NotRecorded(str(json.loads(why.read_text())["reason"])))
        else:
            found[g] = Made(NotRecorded(f"the producers recorded nothing for it at {code}"))
    return found
