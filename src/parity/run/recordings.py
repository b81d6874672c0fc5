"""The programs of a group recorded op by op beside its cached baseline (`parity.run.baseline`:
`<group>.h5`, and `<group>.origin.npz` or, where they could not be recorded, why in
`<group>.origin.json`), as the producer runner writes them (`--record-origin`) and the
origin of a failing check reads them (`parity.run.origins`). Nothing here imports jax.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from parity.origin.recording import FORMAT, format_of

__all__ = ["NOT_RECORDED", "RECORDING", "keep_recording", "recorded"]


#: Beside a cached baseline `<group>.h5`: its programs recorded op by op at the base, or
#: why they could not be (`{"reason": ...}`), as the producer runner writes them.
RECORDING, NOT_RECORDED = ".origin.npz", ".origin.json"


def recorded(path: Path) -> Path | str | None:
    """The recording beside the cached baseline at `path`: its file, the one line saying
    why there is none, or None where it was not asked for."""
    npz, why = path.with_suffix(RECORDING), path.with_suffix(NOT_RECORDED)
    if npz.is_file():
        try:  # one an older parity wrote is made again
            with np.load(npz) as data:
                return npz if format_of(data) == FORMAT else None
        except (OSError, ValueError):  # unreadable: made again
            return None
    if why.is_file():
        return str(json.loads(why.read_text())["reason"])
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
