"""Where the new program first computes what the old one never did, as one typed value
(`Origin`): the operation, its place and call chain, the kind of change it is against the
base's, and what the change's evidence names (its constants, the places it reads), which the
edit that made it is found by (`parity.origin._edit`).

This module imports the standard library and `parity.origin._change` only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from parity.origin._change import CHANGES

__all__ = ["Origin"]

#: How many of the frames that led to the origin its line shows (the JSON has them all).
_CHAIN_SHOWN = 3


@dataclass(frozen=True)
class Origin:
    """Where the new program first computes what the old one never did.

    **Fields:** `key` (the output it explains), `primitive`, `file` (relative to the root
    given, else as recorded), `line`, `function`, `shape`, `dtype`, `input_shapes`,
    `max_diff` (the largest `|new - old|` against the nearest old value of its shape and
    dtype, None when the old program has none; a lower bound when the old side was a
    summary), `matched_fraction` (the share of the new program's values, inputs aside, that
    matched), `position` (its place in dataflow order), `rho` (the matching tolerance) and
    `library` (where the operation runs inside an installed library such as optax, that
    library's frame, `file:line in function`; `file`, `line` and `function` are then the
    user's own line that called into it), `change` (the kind of change it is against the
    base's operation that plays its part: `parity.origin._change.CHANGES`; "" where not
    asked) and `change_detail` (what changed, in one clause: both constants, both values'
    places), `chain` (the user's own frames that led to the operation, innermost first, each
    `file:line in function`, paths relative to the root: the function a changed argument
    was passed from reads there), `read_by` (where the edit is not at the operation that
    first computes what the base never did but in a callee that gives out another value
    than the base's did, a step removed at its end (`parity.origin._change.Change.edit`):
    that operation, `primitive at file:line in function`; the fields before `max_diff` and
    `library` and `chain` are then the value given out, at its frame in the callee; else
    ""), `constants` (for a changed constant, the new program's as recorded, then the
    base's: the values an edit writes), `dtypes` (for a changed dtype, the new program's,
    then the base's where it had one), `places` and `base_places` (the frames
    `change_detail` names in the new program and in the base's, paths as `file`'s).
    """

    key: str
    primitive: str
    file: str
    line: int
    function: str
    shape: tuple[int, ...]
    dtype: str
    input_shapes: tuple[tuple[int, ...], ...]
    max_diff: float | None
    matched_fraction: float
    position: int
    rho: float
    library: str = ""
    change: str = ""
    change_detail: str = ""
    chain: tuple[str, ...] = ()
    read_by: str = ""
    constants: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    places: tuple[str, ...] = ()
    base_places: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line: the primitive, the source line, the shapes, the difference."""
        where = f"{self.file}:{self.line} in {self.function}" if self.file else "<no source>"
        ins = ", ".join(str(list(s)) for s in self.input_shapes)
        diff = (
            "no old value of its shape"
            if self.max_diff is None
            else (
                f"{self.max_diff:.3g} from the nearest old value of its shape"
                if self.max_diff
                else (
                    "no measured difference from the nearest old value of its shape, yet "
                    "not its bits"
                )
            )
        )
        if self.library:  # the operation runs inside an installed library, called from there
            where += f" (inside {self.library})"
        if len(self.chain) > 1:  # the frames that led there, the nearest first
            outer = self.chain[1 : 1 + _CHAIN_SHOWN]
            more = " < ..." if len(self.chain) > 1 + _CHAIN_SHOWN else ""
            where += f", called from {' < '.join(outer)}{more}"
        if self.read_by and self.max_diff is not None:  # measured on what reads it
            diff = f"{self.max_diff:.3g} from the nearest old value of what reads it"
        kind = f"{CHANGES[self.change]}: {self.change_detail}; " if self.change else ""
        return (
            f"{self.primitive} at {where}: {kind}{self.dtype}{list(self.shape)} from ({ins}), "
            f"{diff}; {self.matched_fraction:.1%} of the new program's values matched "
            f"(key {self.key})"
        )

    def to_dict(self) -> dict[str, Any]:
        """The origin as a JSON-safe dict."""
        return asdict(self)
