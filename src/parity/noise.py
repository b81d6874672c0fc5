"""Measured noise as data: the per-key spreads `parity calibrate --write` records in a golden
file, and which of them apply to a check run in another environment.

A golden file's provenance may hold `calibration.spread`: perturbation labels (`isa=AVX`,
`devices=4`, `processes=2x2`, `repeat`) and, per key, the largest `|a-b|` against the
golden that each perturbation gave (`None` where it could not be compared). From that:

- `envelope(key)`: the largest spread of the key over every perturbation: the bound a key
  under the `calibrated` class gets in any environment (its noise, wherever it comes from);
- `differences(pinned, current)`: the calibrated dimensions in which a check's environment
  differs from the pin's: the process layout (`processes`, else `devices`), the ISA cap
  (`isa`), and the processor under the same cap (`cpu`, judged by the ISA spreads: XLA's
  CPU backend picks kernels by the instruction sets a processor has, which is what the ISA
  caps vary);
- `for_dimensions(key, dims)`: the spread of the key for those dimensions: the column of
  the exact environment where one was measured (`devices=4` for a check on 4 devices),
  else the largest column of the same kind, always with `repeat`'s column; `None` when no
  column of some differing kind was measured (that dimension is not calibrated).

Nothing here imports numpy, h5py or jax.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Dimension", "Spreads", "differences", "layout_of"]


def layout_of(provenance: Mapping[str, Any]) -> tuple[int, int]:
    """`(processes, devices per process)` of the run a provenance describes (files written
    before provenance recorded `processes` were single-process runs)."""
    processes = int(provenance.get("processes") or 1)
    total = int(provenance.get("device_count") or 1)
    return processes, max(1, total // processes)


@dataclass(frozen=True)
class Dimension:
    """One calibrated dimension in which a check's environment differs from the pin's.

    **Fields:** `kind` (`processes`, `devices`, `isa` or `cpu`), `label` (the perturbation
    label of the check's environment, e.g. `devices=4`; for `cpu`, `isa`) and `change`
    (in words, for the report's header: `devices 1 -> 4`).
    """

    kind: str
    label: str
    change: str

    @property
    def column_kind(self) -> str:
        """The perturbation kind whose measurements bound this dimension."""
        return "isa" if self.kind == "cpu" else self.kind


def differences(pinned: Mapping[str, Any], current: Mapping[str, Any]) -> list[Dimension]:
    """The calibrated dimensions in which `current` (a check's provenance) differs from
    `pinned` (the golden's), in a fixed order: layout, ISA, processor."""
    out: list[Dimension] = []
    (p0, d0), (p1, d1) = layout_of(pinned), layout_of(current)
    if p1 != p0:
        out.append(Dimension("processes", f"processes={p1}x{d1}", f"layout {p0}x{d0} -> {p1}x{d1}"))
    elif d1 != d0:
        out.append(Dimension("devices", f"devices={d1}", f"devices {d0} -> {d1}"))
    isa0, isa1 = pinned.get("isa_cap"), current.get("isa_cap")
    if isa0 != isa1:
        out.append(Dimension("isa", f"isa={isa1}", f"isa cap {isa0} -> {isa1}"))
    elif pinned.get("cpu") and current.get("cpu") and pinned.get("cpu") != current.get("cpu"):
        out.append(Dimension("cpu", "isa", "processor (same isa cap)"))
    return out


@dataclass(frozen=True)
class Spreads:
    """The per-key spreads recorded in a golden file (see the module docstring).

    **Fields:** `labels` (perturbation labels, one column each) and `keys` (key -> one
    spread per label, `None` where not measured).
    """

    labels: tuple[str, ...] = ()
    keys: Mapping[str, Sequence[float | None]] = ()  # pyright: ignore[reportAssignmentType]

    @classmethod
    def of(cls, provenance: Mapping[str, Any]) -> Spreads:
        """The spreads a golden's provenance records (none if it records none)."""
        cal = provenance.get("calibration")
        spread = cal.get("spread") if isinstance(cal, Mapping) else None
        if not isinstance(spread, Mapping):
            return cls((), {})
        return cls(tuple(spread.get("labels", ())), dict(spread.get("keys", {})))

    def __bool__(self) -> bool:
        return bool(self.labels)

    def _columns(self, key: str, wanted: Sequence[str]) -> float | None:
        row = self.keys.get(key)
        if row is None:
            return None
        got = [v for lb, v in zip(self.labels, row, strict=True) if lb in wanted]
        if not got or any(v is None for v in got):
            return None
        return max(float(v) for v in got if v is not None)

    def envelope(self, key: str) -> float | None:
        """The key's largest spread over every perturbation; `None` if the key was not
        calibrated, or some perturbation could not compare it."""
        return self._columns(key, self.labels)

    def columns_for(self, dims: Sequence[Dimension]) -> list[str] | None:
        """The labels whose spreads bound `dims` (plus `repeat` when measured), or `None`
        when some dimension has no column of its kind."""
        wanted: list[str] = [lb for lb in self.labels if lb == "repeat"]
        for dim in dims:
            if dim.label in self.labels:
                wanted.append(dim.label)
                continue
            same_kind = [lb for lb in self.labels if lb.partition("=")[0] == dim.column_kind]
            if not same_kind:
                return None
            wanted += same_kind
        return wanted

    def for_columns(self, key: str, columns: Sequence[str]) -> float | None:
        """The key's largest spread over `columns` (`columns_for`); `None` if not measured."""
        return self._columns(key, columns)
