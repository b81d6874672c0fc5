"""What a provenance is, as data: `Provenance`, one typed field per key that
`parity.store._provenance.collect_provenance` records and the harness adds (`order`,
`calibration`), read from and written to the golden file's JSON at one edge each
(`Provenance.from_json_dict`, `Provenance.to_json_dict`).

A file written by another parity version reads and writes back unchanged: keys this parity
does not know, and known keys whose value is not of the field's type, are kept as recorded
(`Provenance.unknown`); a known key recorded as null stays null (`Provenance.nulls`), and
one the file lacks stays absent. Imports nothing heavy: `parity diff` and `parity show` read
provenances without loading what collects them.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

__all__ = ["FIELD_NAMES", "Provenance"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Provenance:
    """The environment of a run, and how a golden file was made (see the module docstring).

    **Fields** (each None where not recorded):

    - `python`, `jax`, `jaxlib`, `numpy`, `h5py`, `ml_dtypes`: versions.
    - `platform`, `machine`, `processor`: the host, as `platform` says it (`processor` from
      /proc/cpuinfo's model name where there is one).
    - `cpu`: vendor, family, model and vector instruction sets of the host's processor.
    - `backend`: jax's platform (`cpu`, `gpu`, `tpu`); None where jax's backends were not
      started in the process that recorded it (a CPU run, `parity._environment.backend_of`).
    - `device_kind`: the device's kind (`TPU v5 lite`).
    - `device_count`: jax's global device count (every process's devices).
    - `processes`: the processes of a multi-process run.
    - `xla_flags`: `XLA_FLAGS` as set; `isa_cap`: its ISA cap.
    - `x64`: jax's x64 mode; `matmul_precision`: jax's default matmul precision.
    - `base_sha`: the git commit the goldens were produced from; `producer_digest`: the
      digest of the producer code (`digest_sources`).
    - `packages`: the version of every distribution the producers imported (`optax`,
      `equinox`, ...; not those the harness imported before them), by name; None where
      not recorded (goldens pinned before it was, a check's own process).
    - `order`: how the file's forward order was made (`parity.judge._dataflow`).
    - `calibration`: what `parity calibrate --write` recorded (a JSON mapping,
      `parity.calibration._write`).
    - `unknown`: keys this parity does not know, and known keys whose value is not of the
      field's type, as recorded (the field stays None).
    - `nulls`: the known keys recorded as null (where a field is None, its key is written
      only if it is here).

    Edit one with `dataclasses.replace` (`replace(p, base_sha=sha)`).

    **Example:**

    ```python
    prov = parity.Provenance.from_json_dict({"jax": "0.4.30", "future_key": 1})
    assert prov.jax == "0.4.30" and prov.to_json_dict() == {"jax": "0.4.30", "future_key": 1}
    ```
    """

    python: str | None = None
    jax: str | None = None
    jaxlib: str | None = None
    numpy: str | None = None
    h5py: str | None = None
    ml_dtypes: str | None = None
    platform: str | None = None
    machine: str | None = None
    processor: str | None = None
    cpu: str | None = None
    backend: str | None = None
    device_kind: str | None = None
    device_count: int | None = None
    processes: int | None = None
    xla_flags: str | None = None
    isa_cap: str | None = None
    x64: bool | None = None
    matmul_precision: str | None = None
    base_sha: str | None = None
    producer_digest: str | None = None
    packages: Mapping[str, str] | None = None
    order: str | None = None
    calibration: Mapping[str, Any] | None = None
    unknown: Mapping[str, Any] = dataclasses.field(default_factory=dict[str, Any])
    nulls: frozenset[str] = frozenset()

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> Provenance:
        """The provenance a JSON object records (a golden file's root attribute, a producer
        run's manifest).

        **Arguments:** `data`, the parsed JSON object.

        **Returns:** the `Provenance`; `to_json_dict()` gives `data` back.
        """
        known: dict[str, Any] = {}
        unknown: dict[str, Any] = {}
        nulls: set[str] = set()
        for name, value in data.items():
            kind = _KINDS.get(name)
            if kind is None:
                unknown[name] = value
            elif value is None:
                nulls.add(name)
            elif isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
                known[name] = value
            else:
                unknown[name] = value  # of another type than this parity reads: kept as is
        return cls(**known, unknown=unknown, nulls=frozenset(nulls))

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON object this provenance is written as: every `unknown` key as recorded,
        and each field that holds a value (over a raw value of its key) or is recorded as
        null (`nulls`).

        **Returns:** a dict of JSON values (the golden file sorts its keys).
        """
        out: dict[str, Any] = {}
        for name in FIELD_NAMES:
            value = getattr(self, name)
            if value is not None or name in self.nulls:
                out[name] = value
        return dict(self.unknown) | out  # a field set since reading wins over its raw value

    def by_name(self) -> dict[str, Any]:
        """Every field by name (None where not recorded) and every `unknown` key as
        recorded: what a field-by-field comparison walks (`parity._environment`)."""
        return dict.fromkeys(FIELD_NAMES) | self.to_json_dict()

    @property
    def is_empty(self) -> bool:
        """Whether it records nothing (a plain HDF5 file's, or `{}`)."""
        return not self.to_json_dict()


#: The names of `Provenance`'s recorded fields (all but `unknown` and `nulls`), in order.
FIELD_NAMES: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(Provenance) if f.name not in ("unknown", "nulls")
)


def _kinds() -> dict[str, type]:
    """Field name -> the type its JSON value must have: its annotation without None
    (`Mapping` for `calibration`)."""
    hints = typing.get_type_hints(Provenance)
    out: dict[str, type] = {}
    for name in FIELD_NAMES:
        (kind,) = (a for a in typing.get_args(hints[name]) if a is not type(None))
        out[name] = typing.get_origin(kind) or kind
    return out


_KINDS = _kinds()
