"""The name of an environment for the baseline cache (`parity.run._baseline`): a short
digest of what in a provenance can move XLA's bits, compared as
`parity._environment.environment_difference` compares it, so that two runs with one
fingerprint produce the same bits from the same code.

This module imports the standard library and `parity._environment` only.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

from parity._environment import BITS_FIELDS, backend_of, flags_of

if TYPE_CHECKING:  # a layer above this one: its type only
    from parity.store._provenance_record import Provenance

__all__ = ["environment_fingerprint"]


def environment_fingerprint(prov: Provenance) -> str:
    """A short digest of everything in a provenance that can move XLA's bits (the
    `BITS_FIELDS` but `packages`, and `processor`, compared as `environment_difference`
    compares them: XLA flags as a set, the device count by its own field): two runs with the
    same fingerprint produce the same bits from the same code. Names a baseline in its cache
    (`parity.run._baseline`)."""
    recorded = prov.by_name()
    # Not the producers' packages: the base's producers may import others than the tree's
    # (a refactor's new import), and a check's own process records none; both run here.
    fields = {f: recorded[f] for f in (*BITS_FIELDS, "processor") if f != "packages"}
    # The fields recorded since backends were: left out at their CPU defaults, so that a
    # CPU baseline cached before them keeps its name.
    if backend_of(prov) == "cpu":
        del fields["backend"], fields["device_kind"]
    if fields["matmul_precision"] is None:
        del fields["matmul_precision"]
    fields["processes"] = int(fields["processes"] or 1)
    fields["xla_flags"] = flags_of(recorded["xla_flags"])
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
