"""Where the output of a producer run is kept for the user to read: `producers.log` in a
report folder where one is given, else a new file in the log folder (`log_folder`), which
keeps the newest `KEPT_LOGS` of each kind (`keep_log`). A failed producer run's output goes
there (`parity.commands._common.producer_failure`), and so does the traceback of a
recording that raised, written by the producer process itself
(`parity.machinery._runner_groups`), whose one-line reason names the file: every process
parity starts is handed the folder this one resolved (`LOGS_VAR`,
`parity.machinery._devices.isolated_env`). Nothing here imports jax.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["KEPT_LOGS", "LOGS_VAR", "keep_log", "log_folder"]

#: How many logs of each kind the log folder keeps (the newest); older ones are removed.
KEPT_LOGS = 20
#: The environment variable naming the log folder.
LOGS_VAR = "PARITY_LOGS"


def log_folder() -> Path:
    """Where logs go when no report folder is named: `PARITY_LOGS`, else
    `$XDG_CACHE_HOME/parity/logs`, else `~/.cache/parity/logs` (beside the baselines and
    jax's cache), pruned to the newest `KEPT_LOGS` of each kind."""
    if os.environ.get(LOGS_VAR):
        return Path(os.environ[LOGS_VAR])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "parity" / "logs"


def keep_log(output: str, report: Path | str | None = None, *, kind: str = "producers") -> Path:
    """Write `output` where the user will find it.

    **Arguments:** `output`, the text; `report`, a report folder (the log is then
    `<report>/<kind>.log`); `kind`, what the log holds (`producers`: a failed run's output;
    `recording`: the traceback of a recording that raised), the first word of its name.

    **Returns:** the file's path: in `report`, else a new file `<kind>-<time>-<pid>.log` in
    `log_folder()`, which keeps the newest `KEPT_LOGS` of that kind. Raises `OSError`
    where it cannot be written.
    """
    if report is not None:
        path = Path(report).resolve() / f"{kind}.log"
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = log_folder() / f"{kind}-{stamp}-{os.getpid()}-{time.monotonic_ns()}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(output)
    if report is None:
        logs = sorted(path.parent.glob(f"{kind}-*.log"), key=lambda p: p.stat().st_mtime_ns)
        for old in logs[:-KEPT_LOGS]:
            old.unlink(missing_ok=True)
    return path
