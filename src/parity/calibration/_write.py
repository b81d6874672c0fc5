"""A calibration recorded in a golden file's provenance (`calibration`): the per-class
summary and, per key, the spread under each perturbation, merged with what was recorded
before, which the `calibrated` class and environment-aware checks read.

Nothing here imports jax.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.calibration._perturbations import CalibrationError
from parity.store import GoldenFile, Provenance, write_goldens

if TYPE_CHECKING:
    from parity.calibration._calibrate import Calibration

__all__ = ["merge_spreads", "recorded_spreads", "write_calibration"]


def recorded_spreads(provenance: Provenance) -> dict[str, Any]:
    """The per-key spreads a golden file's provenance records (`calibration.spread`):
    `{"labels": [perturbation labels], "keys": {key: [max |a-b| per label, or None]}}`,
    empty lists where none is recorded."""
    cal = provenance.calibration
    spread = cal.get("spread") if cal is not None else None
    if not isinstance(spread, Mapping):
        return {"labels": [], "keys": {}}
    return {"labels": list(spread.get("labels", [])), "keys": dict(spread.get("keys", {}))}


def merge_spreads(
    old: Mapping[str, Any], new: Mapping[str, Mapping[str, float | None]], labels: Sequence[str]
) -> dict[str, Any]:
    """`old` (as `recorded_spreads` gives it) with the perturbations `labels` measured anew
    in `new` (key -> label -> spread): a label measured again replaces its old column, the
    others are kept, so calibrating one dimension at a time adds up."""
    all_labels = list(old["labels"]) + [lb for lb in labels if lb not in old["labels"]]
    keys: dict[str, list[float | None]] = {}
    for key in sorted(set(old["keys"]) | set(new)):
        row = old["keys"].get(key, [None] * len(old["labels"]))
        before = dict(zip(old["labels"], row, strict=True))
        before |= {lb: v for lb, v in new.get(key, {}).items() if lb in labels}
        keys[key] = [before.get(lb) for lb in all_labels]
    return {"labels": all_labels, "keys": keys}


def write_calibration(
    cal: Calibration, golden: GoldenFile, group: str, path: Path | None = None
) -> Path:
    """Write the group's measurement into its golden file's provenance (`calibration`):
    the per-class summary, and per key the spread under each perturbation (`spread`,
    merged with the spreads recorded before: see `merge_spreads`), which the
    `calibrated` class and environment-aware checks read.

    The arrays, their classes, the class map and the order are written back unchanged
    (the same bytes per array); only the provenance gains (or replaces) `calibration`, so
    the file's metadata checksum changes. The write is atomic (`write_goldens`); `golden`
    is closed once read. A later repin keeps the spreads of the keys it leaves unchanged
    (`parity.run._goldens.carry_calibration`).

    **Arguments:**

    - `cal`: the measurement.
    - `golden`: the group's golden file (read in full before writing).
    - `group`: which group of `cal` to record.
    - `path`: where to write; default over `golden` itself.

    **Returns:** the path written.
    """
    if group not in cal.groups:
        raise CalibrationError(f"calibration has no measurement of group {group!r}")
    arrays = {k: golden[k] for k in golden}
    classes = {k: golden.info(k).class_name for k in golden}
    provenance = golden.provenance
    from parity.store._provenance import collect_provenance

    here = collect_provenance()
    calibration = {
        "pinned": cal.pinned,
        # Where it was measured: every column holds the difference between that host and
        # the pin's, so a calibration on another processor than the pin's measures that too.
        "host": {"cpu": here.cpu, "processor": here.processor, "isa_caps": list(cal.host)},
        "perturbations": [p.label for p in cal.perturbations],
        "summary": cal.summary(group),
        "classes": [c.to_dict() for c in cal.classes(group)],
        "spread": merge_spreads(
            recorded_spreads(provenance), cal.spreads(group), [p.label for p in cal.perturbations]
        ),
    }
    provenance = dataclasses.replace(provenance, calibration=calibration)
    dest = Path(path) if path is not None else golden.path
    class_map_json, order = golden.class_map_json, golden.ordered_keys()
    golden.close()  # everything is read; the file is replaced below
    return write_goldens(
        dest,
        arrays,
        classes=classes,
        class_map_json=class_map_json,
        provenance=provenance,
        order=order,
    )
