"""What a check hands back: `CheckResult` (one golden group or live differential, compared),
or `CheckError` when its input cannot be used; `BaselineUnavailable`, why there is no
baseline to compare with (raised by a `parity.check._request.BaselineSource`,
named by the verdict); the header lines a report of several checks shows, and results as
JSON between processes. `parity.check` makes them; the CLI, the pytest plugin and the
report session read them. Writing arrays is the store's
(`parity.store._writer.save_arrays`)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parity._errors import ParityError
from parity.judge._compare import Comparison, Finding
from parity.judge._tolerance import ClassMap, ClassMapLike, Overrides
from parity.origin._localisation import Localisation

__all__ = [
    "BaselineUnavailable",
    "CheckError",
    "CheckHeader",
    "CheckResult",
    "diff_command",
    "merged_header_lines",
    "results_from_json",
    "results_to_json",
]


class CheckError(ParityError):
    """Input a check cannot use: a missing or unusable golden group, a drift the policy
    refuses, a class the registry lacks. Its message is one line saying what to do."""


class BaselineUnavailable(ParityError):
    """The golden's baseline cannot be re-produced here (at its base commit, in this
    environment).

    **Fields:** `reason` (one line: why) and `hint` (one line: what to do).
    """

    def __init__(self, reason: str, hint: str):
        super().__init__(f"{reason}; {hint}")
        self.reason = reason
        self.hint = hint


#: Each field of a `CheckHeader` that is one line, by the name its line has in reports.
_LINES = {
    "golden": "golden",
    "pinned on": "pinned_on",
    "checked on": "checked_on",
    "sees": "sees",
    "base_sha": "base_sha",
}
_LAST_LINES = {
    "order": "order",
    "calibration": "calibration",
    "reference": "reference",
    "environment": "environment",
}


@dataclass(frozen=True, kw_only=True)
class CheckHeader(Mapping[str, str]):
    """What a golden check says about itself before its table (`parity.check._conclusion`
    writes it): typed fields, read as the report's lines (a `Mapping`: name -> line, in
    order, a field left empty not shown). A live check's header is empty.

    **Fields:** `golden` (the golden file), `pinned_on` and `checked_on` (the two sides'
    backends), `sees` (what a check on an accelerator can see), `base_sha` (the base
    commit), `drift` (the drift policy's lines), `order` (how the forward order was made),
    `calibration` (the golden's calibration summary), `reference` (what the tree was
    compared with, `parity.check._against_baseline.reference_line`), `environment` (how the
    environment differs where keys were judged by calibration).
    """

    golden: str = ""
    pinned_on: str = ""
    checked_on: str = ""
    sees: str = ""
    base_sha: str = ""
    drift: tuple[str, ...] = ()
    order: str = ""
    calibration: str = ""
    reference: str = ""
    environment: str = ""

    def lines(self) -> dict[str, str]:
        """The header as the report shows it: name -> line, in order."""
        out = {name: getattr(self, f) for name, f in _LINES.items() if getattr(self, f)}
        out |= {f"drift {i}": line for i, line in enumerate(self.drift)}
        out |= {name: getattr(self, f) for name, f in _LAST_LINES.items() if getattr(self, f)}
        return out

    @classmethod
    def from_lines(cls, lines: Mapping[str, str]) -> CheckHeader:
        """Read `lines()` back (after a JSON round trip)."""
        fields = {f: lines[name] for name, f in (_LINES | _LAST_LINES).items() if name in lines}
        drift = tuple(v for k, v in lines.items() if k.startswith("drift "))
        return cls(drift=drift, **fields)

    def __getitem__(self, name: str) -> str:
        return self.lines()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.lines())

    def __len__(self) -> int:
        return len(self.lines())


@dataclass(frozen=True)
class CheckResult:
    """One check: a golden group or a live differential, compared.

    **Fields:**

    - `name`: the check's name in reports (the group name, or the caller's).
    - `comparison`: every finding, in the check's forward order.
    - `group`: the golden group, or None for a live differential.
    - `node`: who ran it (a pytest node id, a command), for reports.
    - `header`: what a golden check says about itself before its table (`CheckHeader`:
      the golden, both sides' backends, base SHA, drift, the reference); empty for a live
      check.
    - `checked_keys`: the golden keys this check covered.
    - `started`: when it started (seconds since the epoch), so reports list checks in the
      order they ran.
    - `produce_s`, `load_s`, `compare_s`: seconds spent producing (if the caller said),
      loading goldens, comparing.
    - `saved`: where the actual arrays were written (on failure with `save_actual`).
    - `command`: a `parity diff` command that reproduces the table from `saved`.
    - `origin`: for a failing check whose origin was looked for (`parity.run._origins`),
      what was found (`parity.origin.Localisation`: the `Origin` with its file relative to
      the repository root, line, function, primitive, key and matched share, or why there
      is none); None where nobody asked. `origin_line` is its one line.
    """

    name: str
    comparison: Comparison
    group: str | None = None
    node: str | None = None
    header: CheckHeader = field(default_factory=CheckHeader)
    checked_keys: tuple[str, ...] = ()
    started: float = 0.0
    produce_s: float | None = None
    load_s: float = 0.0
    compare_s: float = 0.0
    saved: str | None = None
    command: str | None = None
    origin: Localisation | None = None

    @property
    def passed(self) -> bool:
        """Whether every key holds its class."""
        return self.comparison.passed

    @property
    def origin_line(self) -> str | None:
        """The `origin:` line shown under the first divergence: the origin, why there is
        none, or why it was not named (one line); None where nobody asked."""
        return None if self.origin is None else self.origin.line

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-safe dict; `CheckResult.from_dict` reads it back."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["comparison"] = [f.to_dict() for f in self.comparison.findings]
        out["inexact"] = self.comparison.inexact
        out["checked_keys"] = list(self.checked_keys)
        out["header"] = self.header.lines()
        # For readers of the JSON: the origin's fields flat (None where none was named)
        # and its line; for `from_dict`, the whole typed value.
        out["origin"] = None if self.origin is None else self.origin.json_origin()
        out["origin_line"] = self.origin_line
        out["localisation"] = None if self.origin is None else self.origin.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckResult:
        """Read a result written by `to_dict` (after a JSON round trip)."""
        kwargs = dict(data)
        findings = tuple(Finding.from_dict(f) for f in data["comparison"])
        kwargs["comparison"] = Comparison(findings, inexact=kwargs.pop("inexact", ""))
        kwargs["checked_keys"] = tuple(data.get("checked_keys", ()))
        kwargs["header"] = CheckHeader.from_lines(data.get("header") or {})
        found = kwargs.pop("localisation", None)
        kwargs.pop("origin_line", None)
        kwargs["origin"] = None if found is None else Localisation.from_dict(found)
        return cls(**kwargs)


#: The header lines a report shows once per check, named after it.
_PER_CHECK = ("calibration", "environment", "order", "reference")
#: The header lines naming the two sides of a check (`parity.check._conclusion`): shown once, as
#: drift lines are, where every check has the same.
_SIDES = ("pinned on", "checked on", "sees")


def diff_command(
    saved: Path, golden: Path | None, overrides: Overrides, class_map: ClassMapLike = None
) -> str:
    """The `parity diff` command that compares `saved` with `golden` as the check did
    (`CheckResult.command`): its overrides, then the caller's class map (its rules as
    further `--override`s, its default as `--class`), so that the table it prints is the
    check's."""
    caller = ClassMap(default=class_map) if isinstance(class_map, str) else class_map
    rules = [*overrides, *(caller.rules if caller is not None else ())]
    parts = ["python -m parity diff", str(saved), str(golden) if golden else "<expected>"]
    parts += [f"--override '{p}={c}'" for p, c in rules]
    if caller is not None and caller.default is not None:
        parts.append(f"--class '{caller.default}'")
    return " ".join(parts)


def merged_header_lines(
    results: Sequence[CheckResult], header: Mapping[str, str]
) -> dict[str, str]:
    """The per-check header lines a report of several checks shows beside its own
    `header`: each drift line and each side's (`pinned on`, `checked on`) once (named
    after the first check that has it), and each
    check's calibration, environment, order and reference lines, named after the check."""
    out: dict[str, str] = {}
    for r in results:
        for k, v in r.header.items():
            new_drift = v not in header.values() and v not in out.values()
            if ((k.startswith("drift") or k in _SIDES) and new_drift) or k in _PER_CHECK:
                out[f"{k} ({r.name})"] = v
    return out


def results_to_json(results: Sequence[CheckResult]) -> str:
    """Results as JSON text (for handing them between processes)."""
    return json.dumps([r.to_dict() for r in results])


def results_from_json(text: str) -> list[CheckResult]:
    """Read `results_to_json` text back."""
    return [CheckResult.from_dict(d) for d in json.loads(text)]
