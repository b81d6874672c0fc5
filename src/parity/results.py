"""What a check hands back: `CheckResult` (one golden group or live differential,
compared), or `CheckError` when its input cannot be used; its arrays saved in golden format
on failure, the header lines a report of several checks shows, and results as JSON between
processes. `parity.check` makes them; the CLI, the pytest plugin and the report session
read them."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parity.judge.compare import Comparison, Finding
from parity.store.provenance import collect_provenance

__all__ = [
    "CheckError",
    "CheckResult",
    "merged_header_lines",
    "results_from_json",
    "results_to_json",
    "save_arrays",
]


class CheckError(Exception):
    """Input a check cannot use: a missing or unusable golden group, a drift the policy
    refuses, a class the registry lacks. Its message is one line saying what to do."""


@dataclass(frozen=True)
class CheckResult:
    """One check: a golden group or a live differential, compared.

    **Fields:**

    - `name`: the check's name in reports (the group name, or the caller's).
    - `comparison`: every finding, in the check's forward order.
    - `group`: the golden group, or None for a live differential.
    - `node`: who ran it (a pytest node id, a command), for reports.
    - `header`: lines for the report header (golden path, base SHA, drift).
    - `checked_keys`: the golden keys this check covered.
    - `started`: when it started (seconds since the epoch), so reports list checks in the
      order they ran.
    - `produce_s`, `load_s`, `compare_s`: seconds spent producing (if the caller said),
      loading goldens, comparing.
    - `saved`: where the obtained arrays were written (on failure with `save_actual`).
    - `command`: a `parity diff` command that reproduces the table from `saved`.
    """

    name: str
    comparison: Comparison
    group: str | None = None
    node: str | None = None
    header: dict[str, str] = field(default_factory=dict)
    checked_keys: tuple[str, ...] = ()
    started: float = 0.0
    produce_s: float | None = None
    load_s: float = 0.0
    compare_s: float = 0.0
    saved: str | None = None
    command: str | None = None

    @property
    def passed(self) -> bool:
        """Whether every key holds its class."""
        return self.comparison.passed

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-safe dict; `CheckResult.from_dict` reads it back."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["comparison"] = [f.to_dict() for f in self.comparison.findings]
        out["checked_keys"] = list(self.checked_keys)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckResult:
        """Read a result written by `to_dict` (after a JSON round trip)."""
        kwargs = dict(data)
        kwargs["comparison"] = Comparison(tuple(Finding.from_dict(f) for f in data["comparison"]))
        kwargs["checked_keys"] = tuple(data.get("checked_keys", ()))
        return cls(**kwargs)


def save_arrays(
    directory: str | os.PathLike[str],
    name: str,
    arrays: Mapping[str, Any],
    *,
    classes: Callable[[str], str],
    order: Sequence[str] = (),
    provenance: Mapping[str, Any] | None = None,
) -> Path:
    """Write `arrays` in golden format to `directory/<name>.h5` (atomically), with the
    classes they were checked under, the forward order and the provenance of the process
    that produced them.

    **Arguments:**

    - `directory`: the folder to write into (created if missing).
    - `name`: the file's stem.
    - `arrays`: `{key: array}`.
    - `classes`: key -> the class it was checked under.
    - `order`: the forward order (keys not in `arrays` are left out).
    - `provenance`: the producing process's environment, when that was another process
      (`parity check` saves from its jax-free CLI process, whose XLA flags and ISA cap are
      not the producer's: recording them would make `parity diff` report a false drift);
      default this process's.

    **Returns:** the file written.
    """
    from parity.store import write_goldens

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    keys = [k for k in order if k in arrays]
    return write_goldens(
        out / f"{name}.h5",
        arrays,
        classes={k: classes(k) for k in arrays},
        provenance=dict(provenance) if provenance is not None else collect_provenance(),
        order=keys,
    )


#: The header lines a report shows once per check, named after it.
_PER_CHECK = ("calibration", "environment", "judge", "order")


def merged_header_lines(
    results: Sequence[CheckResult], header: Mapping[str, str]
) -> dict[str, str]:
    """The per-check header lines a report of several checks shows beside its own
    `header`: each drift line once (named after the first check that has it), and each
    check's calibration, environment, judge and order lines, named after the check."""
    out: dict[str, str] = {}
    for r in results:
        for k, v in r.header.items():
            new_drift = v not in header.values() and v not in out.values()
            if (k.startswith("drift") and new_drift) or k in _PER_CHECK:
                out[f"{k} ({r.name})"] = v
    return out


def results_to_json(results: Sequence[CheckResult]) -> str:
    """Results as JSON text (for handing them between processes)."""
    return json.dumps([r.to_dict() for r in results])


def results_from_json(text: str) -> list[CheckResult]:
    """Read `results_to_json` text back."""
    return [CheckResult.from_dict(d) for d in json.loads(text)]
