"""Measured noise as data: the per-key spreads `parity calibrate --write` records in a golden
file, and which of them apply to a check run in another environment.

A golden file's provenance may hold `calibration.spread`: perturbation labels (`isa=AVX`,
`devices=4`, `processes=2x2`, `repeat`) and, per key, the largest `|a-b|` against the
golden that each perturbation gave (`None` where it could not be compared). From that:

- `envelope(key)`: the largest spread of the key over every perturbation: the bound a key
  under the `calibrated` class gets in any environment (its noise, wherever it comes from);
- `columns_for(dims)` and `for_columns(key, columns)`: the spread of the key for the
  calibrated dimensions in which a check's environment differs from the pin's
  (`parity._environment.EnvironmentDifference.dimensions`; the processor under the same cap
  is judged by the ISA spreads: XLA's CPU backend picks kernels by the instruction sets a
  processor has, which is what the ISA caps vary): the column of
  the exact environment where one was measured (`devices=4` for a check on 4 devices),
  else the largest column of the same kind, always with `repeat`'s column; `None` when no
  column of some differing kind was measured (that dimension is not calibrated).

Nothing here imports numpy, h5py or jax.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from parity._environment import Dimension
    from parity.store._provenance_record import Provenance

__all__ = ["Spreads"]


@dataclass(frozen=True)
class Spreads:
    """The per-key spreads recorded in a golden file (see the module docstring).

    **Fields:** `labels` (perturbation labels, one column each) and `keys` (key -> one
    spread per label, `None` where not measured).
    """

    labels: tuple[str, ...] = ()
    keys: Mapping[str, Sequence[float | None]] = field(default_factory=dict[str, Any])

    @classmethod
    def of(cls, provenance: Provenance) -> Spreads:
        """The spreads a golden's provenance records (none if it records none)."""
        cal = provenance.calibration
        spread = cal.get("spread") if cal is not None else None
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
