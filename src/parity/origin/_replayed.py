"""A shadow replay's answers, made where the programs ran and read where the check settles.

A producer run records the tree's programs; where a key of a class that proves up to
rounding failed, it records them with the replay on the base's values (`Shadow`), then
answers what the settling side asks of a replay (`Replay`: each key's `RoundingProof`, and
the origin of the first key not proved) as JSON (`Replayed`, written whole by the runner). The
settling side (`parity.run._origins`) reads them back and settles by them as
`assert_equivalent` settles by a live `Shadow`: one replay serves the proof and the origin.

Nothing here imports jax.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from parity.origin._localisation import Localisation
from parity.origin._origin import Origin
from parity.origin._recording import Recording
from parity.origin._rounding_proof import RoundingProof

__all__ = ["REPLAYED", "Replay", "Replayed", "answered", "read_replayed"]

#: Beside a recording `<group>.origin.npz`: its replay's answers.
REPLAYED = ".replay.json"


class Replay(Protocol):
    """What settling a failure asks of a replay of the new program on the base's values:
    a live `Shadow`, or its answers read back (`Replayed`)."""

    def proofs(
        self, new: Recording, keys: Iterable[str] | None = None, *, root: str | Path | None = None
    ) -> dict[str, RoundingProof]: ...

    def origin(
        self, new: Recording, proof: RoundingProof, *, root: str | Path | None = None
    ) -> Origin | None: ...


@dataclass(frozen=True)
class Replayed:
    """A replay's answers, by key: `answers` (each key asked, proved up to rounding or
    told why not) and `origins` (for the first key not proved, where its way first
    computes what the base never did, with the kind of change; absent where none was
    named)."""

    answers: Mapping[str, RoundingProof]
    origins: Mapping[str, Origin] = field(default_factory=dict)

    def proofs(
        self, new: Recording, keys: Iterable[str] | None = None, *, root: str | Path | None = None
    ) -> dict[str, RoundingProof]:
        """As `Shadow.proofs`, from the answers (`new` and `root` were the run's); a key the
        replay was not asked about is not proved, and says so."""
        del new, root
        why = "the producer run replayed other keys than this one"
        wanted = self.answers if keys is None else keys
        return {k: self.answers.get(k) or RoundingProof(k, False, why) for k in wanted}

    def origin(
        self, new: Recording, proof: RoundingProof, *, root: str | Path | None = None
    ) -> Origin | None:
        """As `Shadow.origin`, from the answers."""
        del new, root
        return None if proof.proved else self.origins.get(proof.key)

    def to_json(self) -> str:
        """The answers as one JSON document; `from_json` reads it back."""
        origins = {
            k: Localisation("named", origin=o, key=k).to_dict() for k, o in self.origins.items()
        }
        answers = [dataclasses.asdict(p) for p in self.answers.values()]
        return json.dumps({"proofs": answers, "origins": origins})

    @classmethod
    def from_json(cls, text: str) -> Replayed:
        data = json.loads(text)
        answers = {p["key"]: RoundingProof(**p) for p in data["proofs"]}
        origins: dict[str, Origin] = {}
        for k, d in data["origins"].items():
            o = Localisation.from_dict(d).origin
            if o is not None:
                origins[k] = o
        return cls(answers, origins)


def answered(
    replay: Replay, new: Recording, keys: Iterable[str], *, root: str | Path | None = None
) -> Replayed:
    """Everything settling `keys` asks of `replay` (a live `Shadow` over `new`), answered
    now: each key's proof, and the origin of the first key not proved, in the order of
    `keys` (the check's order: settling names the origin of its first failure only)."""
    answers = replay.proofs(new, keys, root=root)
    first = next((p for p in answers.values() if not p.proved), None)
    named = None if first is None else replay.origin(new, first, root=root)
    return Replayed(answers, {} if first is None or named is None else {first.key: named})


def read_replayed(path: Path) -> Replayed | None:
    """The answers written to `path`, or None where there are none."""
    if not path.is_file():
        return None
    return Replayed.from_json(path.read_text())
