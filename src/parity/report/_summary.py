"""What every report of a `Comparison` shares: per-class summaries, the per-class table's
columns, the first divergences, the lines of a session's checks."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from parity.judge._compare import Comparison, Finding
from parity.judge._findings import PROVED, PROVED_ROUNDING, compiled_difference
from parity.judge._floats import count, json_float, sig

__all__ = [
    "CLASS_COLUMNS",
    "CLASS_RIGHT",
    "Checks",
    "ClassSummary",
    "arrays_failing",
    "check_lines",
    "class_row",
    "divergence",
    "num",
    "proved_words",
    "severity",
    "summarize",
    "value_text",
]


@dataclass(frozen=True)
class ClassSummary:
    """Counts and worst figures of one tolerance class in a comparison.

    **Fields:**

    - `class_name`, `allowed`: the class and its rule in words.
    - `arrays`, `passed`, `failed`, `bitwise_equal`: counts of keys (missing and unexpected
        keys count as failed).
    - `missing`, `unexpected`: how many of the failed keys are in the expected side only,
        or in the actual side only (no figure measured for either).
    - `max_abs`, `max_ulp`: the largest over the class's compared keys (`None` if no key
        has one).
    - `worst_key`: of the keys whose figures those columns show, the failing one with the
        largest error, or, if none fails, the one with the largest error; `None` when every
        compared key is bitwise equal. A missing key is never it: it has no figure.
    """

    class_name: str
    allowed: str
    arrays: int
    passed: int
    failed: int
    bitwise_equal: int
    max_abs: float | None
    max_ulp: int | None
    worst_key: str | None
    missing: int = 0
    unexpected: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-safe dict (non-finite floats as strings)."""
        return {
            "class": self.class_name,
            "allowed": self.allowed,
            "arrays": self.arrays,
            "passed": self.passed,
            "failed": self.failed,
            "missing": self.missing,
            "unexpected": self.unexpected,
            "bitwise_equal": self.bitwise_equal,
            "max_abs": _json_float(self.max_abs),
            "max_ulp": self.max_ulp,
            "worst_key": self.worst_key,
        }


def _json_float(x: float | None) -> float | str | None:
    return x if x is None else json_float(x)


def severity(f: Finding) -> tuple[bool, float, float, float]:
    # Failures first; absent or uncomparable keys (no figures) count as infinitely bad.
    if f.max_abs is None and not f.passed:
        return (True, math.inf, math.inf, math.inf)
    ratio = 0.0
    figure = float(f.max_ulp if f.unit == "ulp" and f.max_ulp is not None else f.max_abs or 0.0)
    if f.figure is not None:
        figure = f.figure
    if f.bound:
        ratio = figure / f.bound
    elif figure:
        ratio = math.inf
    return (not f.passed, ratio, f.max_abs or 0.0, float(f.max_ulp or 0))


def summarize(comparison: Comparison) -> list[ClassSummary]:
    """Per-class counts and worst figures, classes in order of first appearance.

    **Arguments:**

    - `comparison`: the comparison to summarise.

    **Returns:** one `ClassSummary` per class.
    """
    out: list[ClassSummary] = []
    for name, findings in comparison.by_class().items():
        abs_values = [f.max_abs for f in findings if f.max_abs is not None]
        ulp_values = [f.max_ulp for f in findings if f.max_ulp is not None]
        compared = [f for f in findings if f.verdict not in ("missing", "unexpected")]
        worst = max(compared, key=severity) if compared else None
        worst_key = None if worst is None or worst.bitwise_equal else worst.key
        out.append(
            ClassSummary(
                class_name=name,
                allowed=findings[0].allowed,
                arrays=len(findings),
                passed=sum(f.passed for f in findings),
                failed=sum(not f.passed for f in findings),
                bitwise_equal=sum(f.bitwise_equal for f in findings),
                max_abs=max(abs_values) if abs_values else None,
                max_ulp=max(ulp_values) if ulp_values else None,
                worst_key=worst_key,
                missing=sum(f.verdict == "missing" for f in findings),
                unexpected=sum(f.verdict == "unexpected" for f in findings),
            )
        )
    return out


def num(x: float | int | None) -> str:
    """A figure of the report (`parity.judge._floats.sig`, as every message prints one)."""
    return sig(x)


def value_text(v: Any, dtype: str | None) -> str:
    # float64 values need repr to show every digit; narrower floats round-trip in 9 digits.
    if isinstance(v, float) and dtype != "float64":
        return f"{v:.9g}"
    return repr(v)


def divergence(label: str, f: Finding | None) -> str:
    if f is None:
        return f"{label}: none"
    if f.verdict in ("missing", "unexpected") or f.worst_index is None:
        return f"{label}: {f.key} [{f.class_name}, {f.verdict}] {f.reason}".rstrip()
    what = f.worst_is or "worst"
    where = f"{what} at index {f.worst_index}" if f.worst_index else f"the scalar ({what})"
    figures = f"max |a-b| {num(f.max_abs)}"
    if f.max_ulp is not None:
        figures += f", max ulp {f.max_ulp}"
    return (
        f"{label}: {f.key} [{f.class_name}, {f.verdict}], {where}: "
        f"actual {value_text(f.worst_actual, f.dtype_expected)} vs {f.reference} "
        f"{value_text(f.worst_expected, f.dtype_expected)}; {figures}; allowed {f.allowed}"
    )


#: The per-class table, shared by the text and HTML reports; right-aligned columns marked.
CLASS_COLUMNS = (
    "class",
    "allowed",
    "arrays",
    "passed",
    "failed",
    "bitwise",
    "max abs",
    "max ulp",
    "worst key",
)
CLASS_RIGHT = (False, False, True, True, True, True, True, True, False)


def class_row(s: ClassSummary) -> list[str]:
    absent = [f"{n} {what}" for n, what in ((s.missing, "missing"), (s.unexpected, "new")) if n]
    return [
        s.class_name,
        s.allowed,
        str(s.arrays),
        str(s.passed),
        f"{s.failed} ({', '.join(absent)})" if absent else str(s.failed),
        str(s.bitwise_equal),
        num(s.max_abs),
        num(s.max_ulp),
        s.worst_key or "-",
    ]


#: Checks of a session report: (name, comparison) in the order they ran.
Checks = Sequence[tuple[str, Comparison]]


def check_lines(
    checks: Checks, *, failing_only: bool = False, origins: Mapping[str, str] | None = None
) -> list[str]:
    """Per check: its verdict and first divergence, in that check's own forward order, and
    under a failing one its `origin:` line where `origins` (check name -> line) has one."""
    shown = [(n, c) for n, c in checks if not (failing_only and c.passed)]
    if failing_only and not shown:
        return [f"checks: all {len(checks)} pass"]
    what = "failing checks" if failing_only else "checks"
    lines = [
        f"{what} ({len(shown)} of {len(checks)}), in the order they ran; first divergence in "
        "each check's forward order:"
    ]
    for name, comp in shown:
        verdict = "PASS" if comp.passed else "FAIL"
        exact = ", not exact (the verdict line says why)" if comp.inexact else ""
        proved = f", {proved_words(comp.proved)}" if comp.proved else ""
        lines.append(f"  {verdict} {name} ({arrays_failing(comp)}){proved}{exact}")
        if comp.first_not_bitwise is not None:
            lines.append("      " + divergence("first not bitwise equal", comp.first_not_bitwise))
        if not comp.passed:
            lines.append("      " + divergence("first breaking its class", comp.first_failure))
            if origins and origins.get(name):
                lines.append("      " + origins[name])
    return lines


def proved_words(proved: Sequence[Finding]) -> str:
    """The keys proved op by op or up to rounding, for a verdict line: "logits equivalent
    op by op (compiled outputs differ by at most 9.83e-07, 380 of 512 elements)", or for
    several keys their count and the largest difference."""
    said = " or ".join(
        sorted({PROVED_ROUNDING if f.basis == "rounding" else PROVED for f in proved})
    )
    if len(proved) == 1:
        return f"{proved[0].key} {said} ({compiled_difference(proved[0])})"
    worst = max(f.max_abs or 0.0 for f in proved)
    keys = count(len(proved), "key")
    return f"{said}: {keys} (compiled outputs differ by at most {sig(worst)})"


def arrays_failing(comparison: Comparison) -> str:
    """How many of a comparison's arrays fail, as every verdict says it: "0 of 4 arrays
    fail", "1 of 1 array fails"."""
    failing = len(comparison.failures)
    verb = "fails" if failing == 1 else "fail"
    return f"{failing} of {count(len(comparison.findings), 'array')} {verb}"
