"""What a search for the origin of a failure found, as one typed value from the process that
recorded the programs to the text, the JSON and the HTML of every report.

Four answers, told apart: the origin was *named* (an `Origin`, with the matched share of
the new program's values along it); every value upstream of the failing output *matched*
one of the old program's; *no output fails* its class when both programs run op by op; the
origin was *not named*, and why (the producer's outputs are not computed by jax, the class
gives no matching tolerance, the base cannot be re-produced, ...).

This module imports the standard library, `parity.origin._origin` and `parity.origin._edit`
only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from parity.origin._edit import Edit
from parity.origin._origin import Origin

__all__ = ["Localisation", "Status"]

#: `named`, `matched`, `no_failure` or `not_named` (module docstring).
Status = Literal["named", "matched", "no_failure", "not_named"]


@dataclass(frozen=True)
class Localisation:
    """What looking for the origin of a failing output found.

    **Fields:**

    - `status`: `named` (`origin` holds it), `matched` (every value upstream of `key`
      matched one of `against`'s), `no_failure` (no output breaks its class when run op by
      op), `not_named` (`reason` says why).
    - `origin`: the `Origin` (primitive, `file` relative to the repository root, `line`,
      `function`, `key`, `matched_fraction`, ...), for `named`.
    - `key`: the output explained (`""` where none failed).
    - `reason`: for `not_named`, why, in one line; for `named`, why the key's class gave no
      matching tolerance (the origin was then looked for at equality only), else `""`.
    - `against`: whose values the new program's were matched against (`"the base
      commit"`), for the lines.
    - `rho`: the matching tolerance (0: values had to be equal bit for bit).
    - `values`, `profile`, `origin_at`: for `named`, the new program's values counted (its
      inputs aside), their share equal to an old value in up to `PROFILE_BINS` equal bins
      along it in dataflow order, and where the origin sits along it (0 to 1).
    - `beyond`: for `named`, where the search by the class's matching tolerance (`rho`)
      alone names another value (the earliest from which `key` is reached through values
      beyond the tolerance only: a change squashed below it, by a softmax say, is named
      where it re-emerges), that one; `within`: run op by op, `key` itself is within the
      tolerance (its compiled values broke the class).
    - `proof`: for `matched`, why `key` is not proved op by op (`parity.origin._proof`: a
      value it is computed from equals none of `against`'s although its own does), `""`
      where it is proved: every value it is computed from and its own equal `against`'s
      bit for bit, so the class `op_by_op` passes it; for `named` at the key's own value,
      why (it equals a value of `against`'s, not `against`'s same key).
    - `edit`: for `named`, where the face knows how the tree differs from the base (a
      diff), the edit of it that made the origin, or that none did
      (`parity.origin._edit.Edit`); None where no diff was at hand.
    - `traceback`: for `not_named` because recording raised in this process
      (`parity.origin.LiveSides`), the original traceback as text
      (`parity.origin._record.RecordingError`), "" otherwise; `reason` names the operation.

    **Example:**

    ```python
    found = parity.localise(new_forward, old_forward, params, tokens)
    if found.status == "named":
        print(found.origin.function, found.origin.line)
    print(found.line)  # "origin: mul at model.py:19 in mix: ..."
    ```
    """

    status: Status
    origin: Origin | None = None
    key: str = ""
    reason: str = ""
    against: str = "the old program"
    rho: float = 0.0
    values: int = 0
    profile: tuple[float, ...] = ()
    origin_at: float = 0.0
    beyond: Origin | None = None
    within: bool = False
    proof: str = ""
    traceback: str = ""
    edit: Edit | None = None

    @property
    def named(self) -> bool:
        """Whether an origin was named."""
        return self.origin is not None

    @property
    def line(self) -> str:
        """The `origin:` line a failure message and a report show (one line)."""
        if self.origin is not None:
            line = f"origin: {self.origin.describe()}"
            if self.beyond is not None:
                b = self.beyond
                line += (
                    f"; by the class's tolerance alone: {b.primitive} at "
                    f"{b.file or '<no source>'}:{b.line} in {b.function}"
                )
            elif self.proof:
                line += f"; {self.proof}"
            elif self.reason:
                line += f"; at equality only: {self.reason}"
            elif self.within:
                line += f"; run op by op, {self.key} is within the class's tolerance"
            if self.edit is not None:
                line += f"; {self.edit.line}"
            return line
        if self.status == "matched":
            if self.rho == 0 and self.proof:
                return (
                    f"origin: none: {self.key} equals {self.against}'s when run op by op, "
                    f"but is not proved: {self.proof}"
                )
            if self.rho == 0:
                how = (
                    "equal bit for bit when run op by op (the difference is in how XLA "
                    "compiled them, not in the operations): the class op_by_op passes such "
                    "a key, proved op by op"
                )
            else:
                how = (
                    f"within the class's matching tolerance ({self.rho:.3g} of each value's "
                    "largest magnitude; equality op by op was not checked)"
                )
            upstream = f"{self.key} and every value upstream of it match {self.against}'s"
            return f"origin: none: {upstream}, {how}"
        if self.status == "no_failure":
            return "origin: none: no output breaks its class when both programs run op by op"
        return f"origin: not named: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: the origin's fields at the top level (None where none was named), as
        reports and `CheckResult.to_dict` carry it; `from_dict` reads it back."""
        out: dict[str, Any] = {"status": self.status, "line": self.line}
        out |= {
            f.name: _jsonable(getattr(self, f.name))
            for f in fields(self)
            if f.name not in ("origin", "beyond", "edit")
        }
        out["edit"] = None if self.edit is None else self.edit.to_dict()
        out["origin"] = None if self.origin is None else _jsonable(asdict(self.origin))
        out["beyond"] = None if self.beyond is None else _jsonable(asdict(self.beyond))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Localisation:
        """Read back what `to_dict` wrote (after a JSON round trip)."""
        known = {f.name for f in fields(cls)}
        kwargs = {
            k: v for k, v in data.items() if k in known and k not in ("origin", "beyond", "edit")
        }
        if data.get("edit") is not None:
            kwargs["edit"] = Edit.from_dict(data["edit"])
        kwargs["profile"] = tuple(float(x) for x in data.get("profile", ()))
        for name in ("origin", "beyond"):
            raw = data.get(name)
            if raw is not None:
                o = dict(raw)
                o["shape"] = tuple(o["shape"])
                o["input_shapes"] = tuple(tuple(s) for s in o["input_shapes"])
                o["max_diff"] = None if o["max_diff"] is None else float(o["max_diff"])
                for tuples in ("chain", "constants", "dtypes", "places", "base_places"):
                    o[tuples] = tuple(o.get(tuples, ()))
                kwargs[name] = Origin(**o)
        return cls(**kwargs)

    def json_origin(self) -> dict[str, Any] | None:
        """The flat JSON entry a report's check carries under `origin`: the origin's fields
        with `values`, `profile` and `origin_at`; None where no origin was named."""
        if self.origin is None:
            return None
        doc = _jsonable(asdict(self.origin))
        beyond = None if self.beyond is None else _jsonable(asdict(self.beyond))
        return doc | {
            "edit": None if self.edit is None else self.edit.to_dict(),
            "values": self.values,
            "profile": list(self.profile),
            "origin_at": self.origin_at,
            "beyond": beyond,
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value
