"""A producer run written as golden files, and what a new file changed against the old one.

`write_run` writes one group of a `RunnerOutput` (`parity.machinery._runner_output`) as a golden
file with its provenance (the run's own, the base SHA, the producers' digest, how the forward
order was made); `write_golden` writes arrays under a class map. Both repin
(`parity.run._repin`) and the baselines re-produced off the pin's environment
(`parity.run._baseline`) write through them, so a baseline reads as a golden does.
`summarize_change` says what a repin changed in a file (`GroupChange`), and
`carry_calibration` what became of the old file's calibration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from parity.judge._dataflow import order_change
from parity.judge._floats import count, sig
from parity.judge._tolerance import ClassMap
from parity.machinery._runner_output import RunnerOutput
from parity.store import GoldenStoreError, Provenance, open_goldens, write_goldens

__all__ = [
    "GroupChange",
    "carry_calibration",
    "class_of",
    "golden_provenance",
    "summarize_change",
    "write_golden",
    "write_run",
]


@dataclass(frozen=True)
class GroupChange:
    """What a repin changed in one golden file."""

    group: str
    path: Path
    n_arrays: int
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[tuple[str, str], ...] = ()  # (key, how much)
    new_file: bool = False
    calibration: str = ""  # what became of the old file's calibration, one line
    order: str = ""  # how the forward order changed (`parity.judge._dataflow.order_change`)

    @property
    def unchanged(self) -> bool:
        return not (self.added or self.removed or self.changed or self.new_file or self.order)

    def describe(self, limit: int = 10) -> str:
        tail = "".join(f"\n  {x}" for x in (self.order, self.calibration) if x)
        if self.new_file:
            return f"{self.group}: new file, {count(self.n_arrays, 'array')}"
        if self.unchanged:
            return f"{self.group}: {count(self.n_arrays, 'array')}, unchanged{tail}"
        lines = [
            f"{self.group}: {count(self.n_arrays, 'array')}; {len(self.added)} added, "
            f"{len(self.removed)} removed, {len(self.changed)} changed"
        ]
        lines += [f"  + {k}" for k in self.added[:limit]]
        lines += [f"  - {k}" for k in self.removed[:limit]]
        lines += [f"  ~ {k}: {how}" for k, how in self.changed[:limit]]
        hidden = sum(max(0, len(x) - limit) for x in (self.added, self.removed, self.changed))
        if hidden:
            lines.append(f"  ... and {hidden} more")
        return "\n".join(lines) + tail


def _describe_change(old: np.ndarray, new: np.ndarray) -> str | None:
    if old.dtype != new.dtype or old.shape != new.shape:
        return f"{old.dtype}{list(old.shape)} -> {new.dtype}{list(new.shape)}"
    if old.tobytes() == new.tobytes():
        return None
    if old.dtype.kind in "fcV":
        a = old.astype(np.float64)
        b = new.astype(np.float64)
        with np.errstate(invalid="ignore"):
            diff = np.abs(a - b)
        n = int(np.sum(~((a == b) | (np.isnan(a) & np.isnan(b)))))
        finite = diff[np.isfinite(diff)]
        worst = float(finite.max()) if finite.size else float("nan")
        return f"{n}/{old.size} elements differ, max abs {sig(worst)}"
    return f"{int(np.sum(old != new))}/{old.size} elements differ"


def summarize_change(
    group: str, path: Path, new: Mapping[str, np.ndarray], order: str | None = None
) -> GroupChange:
    """Compare freshly produced arrays (in their forward order, made as `order` says:
    `"dataflow"` or `"declared"`, None to leave the order out) with the golden file at
    `path` (if any)."""
    if not path.exists():
        return GroupChange(group, path, len(new), new_file=True)
    try:
        old_file = open_goldens(path)
    except GoldenStoreError as e:
        return GroupChange(group, path, len(new), changed=(("<file>", f"unreadable: {e}"),))
    with old_file as old:
        old_keys = set(old.keys())
        changed = []
        for key in sorted(old_keys & set(new)):
            how = _describe_change(np.asarray(old[key]), np.asarray(new[key]))
            if how:
                changed.append((key, how))
        return GroupChange(
            group,
            path,
            len(new),
            added=tuple(sorted(set(new) - old_keys)),
            removed=tuple(sorted(old_keys - set(new))),
            changed=tuple(changed),
            order=""
            if order is None
            else order_change(old.provenance.order, old.ordered_keys(), order, list(new)),
        )


def carry_calibration(path: Path, change: GroupChange) -> tuple[dict[str, Any] | None, str]:
    """What a repin keeps of the calibration recorded in the old golden file at `path`.

    A key's spread measures the harmless noise of its computation; a repin that leaves the
    key's bytes alone leaves that computation alone, so its spread stays (the `calibrated`
    class and checks off the pin's environment go on reading it). A key that changed, was
    added or was removed loses its spread: its noise is measured again by `parity
    calibrate`.

    **Returns:** the calibration to record in the new file (None where the old file
    recorded none, or none of its keys stayed) and one line for the repin's summary (empty
    where there was nothing to keep).
    """
    if change.new_file:
        return None, ""
    try:
        with open_goldens(path) as old:
            calibration = old.provenance.calibration
    except GoldenStoreError:
        return None, ""
    if calibration is None:
        return None, ""
    spread = calibration.get("spread")
    keys = spread.get("keys", {}) if isinstance(spread, Mapping) else {}
    moved = {k for k, _ in change.changed} | set(change.removed) | set(change.added)
    kept = {k: v for k, v in keys.items() if k not in moved}
    lost = sorted(set(keys) - set(kept))
    redo = (
        f"parity calibrate --groups {change.group} --perturb isa,devices,processes,repeat "
        "--write measures them again"
    )
    if not kept:
        return None, f"calibration dropped: every calibrated key changed; {redo}"
    carried = {**calibration, "spread": {**spread, "keys": kept}}  # pyright: ignore[reportGeneralTypeIssues]
    if not lost and not change.added:
        spreads = "1 key's spread" if len(kept) == 1 else f"{len(kept)} keys' spreads"
        return carried, f"calibration kept: {spreads}, their arrays unchanged"
    return carried, (
        f"calibration kept for {count(len(kept), 'unchanged key')}, dropped for "
        f"{len(lost) + len(change.added)} changed or new ones; {redo}"
    )


def class_of(class_map: ClassMap, key: str) -> str:
    """`key`'s class under the producers' `CLASS_MAP`; `bitwise` where no rule matches
    (`CLASS_MAP` is optional)."""
    try:
        return class_map.class_for(key)
    except KeyError:
        return "bitwise"


def write_golden(
    path: Path,
    arrays: Mapping[str, np.ndarray],
    class_map: ClassMap,
    *,
    provenance: Provenance,
    order: Sequence[str],
) -> dict[str, str]:
    """Write `arrays` as a golden file at `path` (`parity.store.write_goldens`: atomic,
    byte-reproducible), each key under its class in the producers' `class_map`
    (`class_of`), that map, `provenance` and the forward `order` recorded beside them: what
    a repin, a reclass and a cached base write.

    **Returns:** key -> the class written for it.
    """
    classes = {k: class_of(class_map, k) for k in arrays}
    write_goldens(
        path,
        arrays,
        classes=classes,
        class_map_json=class_map.to_json(),
        provenance=provenance,
        order=order,
    )
    return classes


def write_run(
    path: Path,
    run: RunnerOutput,
    *,
    sha: str,
    digest: str,
    calibration: Mapping[str, Any] | None = None,
) -> None:
    """Write what a producer run saved for one group as a golden file at `path`
    (`write_golden`): a repin's new golden, a cached base.

    **Arguments:**

    - `run`: what the producer process saved (`parity.machinery._runner_output.load_runner_output`):
      the arrays in their forward order, classed by its `CLASS_MAP`; its provenance,
      collected in that process, so it describes the process that made the arrays.
    - `sha`, `digest`: the base commit the arrays were made at, the producers' digest
      (`digest_sources`), recorded with how the forward order was made.
    - `calibration`: what to record as the file's calibration (a repin's carried one,
      `carry_calibration`); None records none.
    """
    provenance = replace(run.provenance, base_sha=sha, producer_digest=digest, order=run.order)
    if calibration is not None:
        provenance = replace(provenance, calibration=calibration)
    class_map = ClassMap(rules=run.table.class_map)
    write_golden(path, run.arrays, class_map, provenance=provenance, order=list(run.arrays))


def golden_provenance(path: Path) -> Provenance:
    """The provenance recorded in a golden file."""
    with open_goldens(path) as g:
        return g.provenance
