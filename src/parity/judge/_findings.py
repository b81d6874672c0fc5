"""What a comparison finds: a `Finding` per array (what differed, by how much, where it was
worst, what was allowed) and a `Comparison` of many, in forward order, naming the first
divergence. Plain data, JSON-safe both ways."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from parity.judge._floats import count, from_json_float, json_float, sig

if TYPE_CHECKING:
    import numpy as np

    from parity.judge._classes import ToleranceClass

__all__ = [
    "PROVED",
    "PROVED_ROUNDING",
    "ArrayVerdict",
    "Basis",
    "Comparison",
    "Finding",
    "Scalar",
    "Verdict",
    "compiled_difference",
]

#: How a finding's verdict was reached beyond its class's rule on the two arrays, as data
#: (never read back from its words): `""` the rule alone; `"calibration"` a key its pinned
#: class fails passed by the calibrated bound of what the environment moved
#: (`parity.calibrated._bounds`); `"proved"` a key whose bits differ passed, proved op by op
#: (`parity.origin._proof`); `"rounding"` one passed, proved up to rounding by the shadow
#: replay on the base's values (`parity.origin._shadow`).
Basis = Literal["", "calibration", "proved", "rounding"]

#: How the note of a key proved op by op begins (`parity.origin._proof`): its bits differ
#: from the other side's, and both programs run op by op compute it the same way.
PROVED = "equivalent op by op"
#: And of a key proved up to rounding (basis `"rounding"`).
PROVED_ROUNDING = "equivalent up to rounding"


def compiled_difference(finding: Finding) -> str:
    """How far a proved key's compiled values moved, as its note and the verdict line say
    it: "compiled outputs differ by at most 9.83e-07, 380 of 512 elements"."""
    return (
        f"compiled outputs differ by at most {sig(finding.max_abs)}, "
        f"{finding.n_differ or 0} of {count(finding.n_elements, 'element')}"
    )


Verdict = Literal["pass", "fail", "missing", "unexpected"]
Scalar = bool | int | float | complex

# Float fields of a finding; `to_dict` writes their non-finite values as strings.
_FLOAT_FIELDS = (
    "share_differ",
    "max_abs",
    "max_rel",
    "worst_actual",
    "worst_expected",
    "bound",
    "figure",
)


def _json_float(x: Any) -> Any:
    # JSON has no NaN or inf; strings keep them readable and unambiguous (null means absent).
    if isinstance(x, float):
        return json_float(x)
    if isinstance(x, complex):
        return str(x)
    return x


@dataclass(frozen=True, kw_only=True)
class Finding:
    """The outcome of comparing one array (or one absent key) with its expected one.

    **Fields:**

    - `key`, `class_name`: the array key and the tolerance class it was checked under.
    - `verdict`: `"pass"`, `"fail"`, `"missing"` (only on the expected side) or `"unexpected"`
        (only in the actual outputs); all but `"pass"` are failures.
    - `shape_actual`, `shape_expected`, `dtype_actual`, `dtype_expected`: `None` on the side
        where the key is absent; dtypes by name (`"bfloat16"`, `"float32"`).
    - `n_elements`: elements of the expected array (of the actual array for `"unexpected"`).
    - `n_differ`, `share_differ`: elements whose bits differ, and their share; `None` when
        the arrays cannot be compared element by element (dtype or shape mismatch, absent).
    - `max_abs`, `max_rel`: largest `|a-b|` and `|a-b|/|b|` over positions where both are
        finite (`inf` where `b == 0` and `a != b`); 0.0 when bitwise equal. Integer and bool
        arrays have them too (exact up to 2**53). `None` when not comparable.
    - `max_ulp`: largest ulp distance over positions where both are finite; `None` for
        integer, bool and other non-float dtypes, where ulps mean nothing.
    - `worst_index`, `worst_actual`, `worst_expected`: the worst element and its two values
        (python scalars). Worst is: under *bitwise* the first differing element; under
        *close* and *ulp* the first NaN/inf position mismatch if any, else the largest
        `|a-b| / allowed` (*close*) or ulp distance (*ulp*), else (only -0.0/+0.0 or NaN
        payloads differ) the first differing element; for integers the largest `|a-b|`;
        for other dtypes the first differing element. `None` when bitwise equal.
    - `worst_is`: which element `worst_index` names, in the words every line uses before
        "at index" (a failure's reason, a first divergence on a PASS or FAIL line alike):
        `"worst"`, `"first differing element"` or `"first NaN/inf mismatch"`;
        `""` when bitwise equal.
    - `allowed`: the class's rule in words (`ToleranceClass.describe_allowed`).
    - `bitwise_equal`: same dtype, shape and bytes.
    - `reason`: why the array failed, naming key, class, rule, values, index and shape;
        `""` for a pass.
    - `order`: the key's place in the declared forward order, `None` if it has none.
    - `n_violating`: elements breaking the class (NaN/inf mismatches included).
    - `n_nan_inf_mismatch`: positions where NaN, +inf or -inf sit in one array only.
    - `bound`: the class's bound for this array, in its own unit: for *close* the largest
        allowed `|a-b|` (`atol_eff + rtol*max|expected|`), for *ulp* `max_ulp`, for *bitwise*
        (and integers under any class) 0.0. Reports plot errors against it.
    - `rule`: the kind of the class's rule (`"bitwise"`, `"ulp"`, `"close"`, ...).
    - `unit`: the unit of `bound` and of the figure reports set against it: `"abs"`
        (`max_abs`), `"ulp"` (`max_ulp`) or `"kl"` (`figure`); so that a finding reads
        without the registry.
    - `figure`: the worst figure in the rule's own unit when that is neither `|a-b|` nor
        ulps (a `logit_kl` class: the largest per-position KL); `None` otherwise.
    - `note`: what the rule says even of a passing array (a `budget` class: "below budget:
        repin to ratchet it down"); `""` when it says nothing.
    - `reference`: what the expected side was, in words: `"golden"` (a pinned file),
        `"baseline"` (the golden group re-produced at its base commit here) or
        `"expected"` (a live tree: `assert_equivalent`, `check_live`).
    - `basis`: how the verdict was reached beyond the class's rule (`Basis`): what the
        verdict line, the reports and the JSON read; `note` says it in words.
    - `proof_clause`: the clause `reason` ends with about a proof op by op (why the key is
        not proved, under a class that proves; "" otherwise), kept apart so that a proof
        replaces it whole (`parity.origin._proof.settle`) and no message is read back.
    """

    key: str
    class_name: str
    verdict: Verdict
    shape_actual: tuple[int, ...] | None
    shape_expected: tuple[int, ...] | None
    dtype_actual: str | None
    dtype_expected: str | None
    n_elements: int
    allowed: str
    bitwise_equal: bool
    reason: str
    # The figures: None where nothing was measured (an absent key, a shape or dtype mismatch).
    n_differ: int | None = None
    share_differ: float | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    max_ulp: int | None = None
    worst_index: tuple[int, ...] | None = None
    worst_actual: Scalar | None = None
    worst_expected: Scalar | None = None
    order: int | None = None
    n_violating: int | None = None
    n_nan_inf_mismatch: int | None = None
    bound: float | None = None
    rule: str | None = None
    unit: str | None = None
    figure: float | None = None
    note: str = ""
    reference: str = "golden"
    worst_is: str = ""
    basis: Basis = ""
    proof_clause: str = ""

    @property
    def passed(self) -> bool:
        """Whether the array is within its class."""
        return self.verdict == "pass"

    def to_dict(self) -> dict[str, Any]:
        """The finding as a JSON-safe dict.

        The class name is under `"class"`; shapes and the worst index are lists; `None`
        becomes `null`; non-finite floats become the strings `"nan"`, `"inf"` and `"-inf"`
        (so `json.dumps(..., allow_nan=False)` works); complex values become strings.
        """
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, tuple):
                value = list(cast(tuple[int, ...], value))
            out["class" if field.name == "class_name" else field.name] = _json_float(value)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """Read a finding back from `to_dict` output (after a JSON round trip)."""
        kwargs = {("class_name" if k == "class" else k): v for k, v in data.items()}
        for name in ("shape_actual", "shape_expected", "worst_index"):
            if kwargs.get(name) is not None:
                kwargs[name] = tuple(kwargs[name])
        for name in _FLOAT_FIELDS:
            if name in kwargs:
                kwargs[name] = from_json_float(kwargs[name])
        return cls(**kwargs)


@dataclass(frozen=True, kw_only=True)
class ArrayVerdict:
    """One array compared with its expected one, as plain data: the figures and the verdict,
    before any words (`parity.judge._reasons.array_reason` writes them; `compare_arrays` makes the
    `Finding`).

    **Fields:** `key`, `tol`, `reference` and `order` as `measure_array` was given them;
    both sides' shapes and dtypes; `mismatch` (`"dtype"` or `"shape"` where the arrays
    were not compared element by element, else `None`); `kind` (`"float"`, `"int"` or
    `"other"`: how the elements were compared; `None` on a mismatch); `verdict` (`"pass"`
    or `"fail"`); then the figures as `Finding` holds them (`None` where not measured);
    and the element a failure names: `worst_index`, `worst_is`, its two values in the
    array's dtype (`worst_actual`, `worst_expected`: the reason prints those), as the finding
    stores them (`worst_actual_value`, `worst_expected_value`) and the rule's words on it
    (`worst_detail`).
    """

    key: str
    tol: ToleranceClass
    reference: str
    order: int | None
    shape_actual: tuple[int, ...]
    shape_expected: tuple[int, ...]
    dtype_actual: np.dtype[Any]
    dtype_expected: np.dtype[Any]
    mismatch: Literal["dtype", "shape"] | None
    kind: Literal["float", "int", "other"] | None
    verdict: Verdict
    n_elements: int
    n_differ: int | None = None
    n_violating: int | None = None
    n_nan_inf_mismatch: int | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    max_ulp: int | None = None
    bound: float | None = None
    figure: float | None = None
    note: str = ""
    worst_index: tuple[int, ...] | None = None
    worst_is: str = ""
    worst_actual: Any = None
    worst_expected: Any = None
    worst_actual_value: Scalar | None = None
    worst_expected_value: Scalar | None = None
    worst_detail: str = ""


@dataclass(frozen=True)
class Comparison:
    """Every finding of one comparison, in forward order.

    **Fields:**

    - `findings`: one per key, sorted by the declared order (uncovered keys last, by name).
    - `inexact`: where a key passed by a calibrated bound, not bit for bit, where the
      check could have judged it exactly: which keys, why and what to do, one line for the
      verdict line of every report (docs/design.md, "A verdict says how exact it was");
      empty where nothing was judged more loosely than it could have been.
    """

    findings: tuple[Finding, ...]
    inexact: str = ""

    @property
    def passed(self) -> bool:
        """Whether every key is within its class (and none is missing or unexpected)."""
        return all(f.passed for f in self.findings)

    @property
    def failures(self) -> tuple[Finding, ...]:
        """The findings that are not `"pass"`, in order."""
        return tuple(f for f in self.findings if not f.passed)

    @property
    def proved(self) -> tuple[Finding, ...]:
        """The keys that passed proved op by op, their bits not equal, in order."""
        return tuple(f for f in self.findings if f.passed and f.basis in ("proved", "rounding"))

    @property
    def by_calibration(self) -> tuple[Finding, ...]:
        """The keys that failed their pinned class and passed by a calibrated bound, in
        order."""
        return tuple(f for f in self.findings if f.passed and f.basis == "calibration")

    @property
    def first_not_bitwise(self) -> Finding | None:
        """The first key in order that is not bitwise equal (absent keys included)."""
        return next((f for f in self.findings if not f.bitwise_equal), None)

    @property
    def first_failure(self) -> Finding | None:
        """The first key in order that breaks its class, or is missing or unexpected."""
        return next((f for f in self.findings if not f.passed), None)

    def finding(self, key: str) -> Finding:
        """The finding for `key`; raises `KeyError` if the comparison has none."""
        for f in self.findings:
            if f.key == key:
                return f
        raise KeyError(f"no finding for key {key!r} in this comparison")

    def by_class(self) -> dict[str, list[Finding]]:
        """Findings grouped by class name; classes in order of first appearance."""
        out: dict[str, list[Finding]] = {}
        for f in self.findings:
            out.setdefault(f.class_name, []).append(f)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The comparison as a JSON-safe dict (findings as in `Finding.to_dict`)."""
        first_nb, first_fail = self.first_not_bitwise, self.first_failure
        return {
            "verdict": "pass" if self.passed else "fail",
            "inexact": self.inexact,
            "n_findings": len(self.findings),
            "n_failures": len(self.failures),
            "first_not_bitwise": None if first_nb is None else first_nb.to_dict(),
            "first_failure": None if first_fail is None else first_fail.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
        }
