"""What a producer run saved for one group, loaded (`load_runner_output`, `RunnerOutput`):
its arrays (`OUT/<group>.npz`, ml_dtypes restored from their bits) and its manifest
(`OUT/<group>.json`: keys, dtypes, the producers' table, order, provenance),
as `parity.machinery._producer_runner` writes them. Nothing here imports jax.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from parity.judge._mldtypes import from_raw
from parity.machinery._launcher import ProducerCommand, ProducerRunError
from parity.machinery._producers_table import ProducersTable
from parity.store import Provenance

__all__ = ["RunnerOutput", "load_runner_output"]


@dataclass(frozen=True)
class RunnerOutput:
    """What the producer process saved for one group.

    - `arrays`: `{key: array}` in producer order.
    - `provenance`: the producer process's environment (`collect_provenance` run there,
      crossed as JSON: `Provenance.to_json_dict` there, `Provenance.from_json_dict` here).
    - `order`: how `arrays`' order was made: `"dataflow"` (read from the program,
      `parity.judge._dataflow`), `"declared"` (the order of the group's containers),
      `"host"` (no jax program computed them) or `"unread"` (not asked for).
    - `recorder`: why the programs the group ran could not be seen, in one line (this jax
      cannot be hooked, or a hook failed: `parity.origin._adapter`); "" where they were.
    - `table`: the producers' `CLASS_MAP`, `STACK` and `RENAME`
      (`parity.machinery._producers_table.ProducersTable`, read from the module where it
      ran).
    """

    arrays: dict[str, np.ndarray]
    provenance: Provenance
    order: str = "declared"
    recorder: str = ""
    table: ProducersTable = field(default_factory=ProducersTable)


def load_runner_output(out: Path, group: str, *, command: ProducerCommand) -> RunnerOutput:
    """What the runner saved for `group` in `out`, for `command`. Raises
    `ProducerRunError` if it recorded no provenance (it could not import parity)."""
    manifest = json.loads((out / f"{group}.json").read_text())
    with np.load(out / f"{group}.npz") as npz:
        arrays = {
            key: from_raw(npz[f"a{j}"], manifest["dtypes"][key])
            for j, key in enumerate(manifest["keys"])
        }
    provenance = manifest.get("provenance")
    if not isinstance(provenance, dict):
        raise ProducerRunError(
            command,
            f"the producer process recorded no provenance for group {group!r} (it could not "
            "import parity.store._provenance); check that parity is importable there",
        )
    return RunnerOutput(
        arrays,
        Provenance.from_json_dict(provenance),  # the JSON edge
        str(manifest.get("order", "declared")),
        str(manifest.get("recorder", "")),
        ProducersTable.from_json_dict(manifest),
    )
