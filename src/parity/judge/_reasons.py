"""The words of a finding, apart from the figures (as chex keeps an assertion's message
apart from its comparator): `array_reason` turns a comparator's result (`ArrayVerdict`,
`parity.judge._compare.measure_array`) into the reason a `Finding` holds, `absent_reason`
says the same of a key on one side only."""

from __future__ import annotations

from typing import Any, cast

from parity.judge._findings import ArrayVerdict, Verdict
from parity.judge._floats import count, sig

__all__ = ["UNPROVED", "UNPROVED_ROUNDING", "absent_reason", "array_reason", "proof_clause"]

#: How a failure under a class that proves op by op (`op_by_op`) ends before anyone proved it:
#: the comparator has the arrays, not the programs (`parity.origin._proof` replaces it).
UNPROVED = (
    "; not proved op by op: only a check that records both programs can prove it "
    "(parity check, the pytest plugin against goldens, assert_equivalent with new_fn and "
    "old_fn)"
)

#: The same for a class that proves up to rounding (`up_to_rounding`): its replay on the
#: base's values needs both programs recorded, the base's with its values.
UNPROVED_ROUNDING = (
    "; not proved up to rounding: only a check that records both programs, the base's with "
    "its values, can prove it (parity check, the pytest plugin against goldens, "
    "assert_equivalent with new_fn and old_fn)"
)


def _fmt(x: Any) -> str:
    # The dtype's own str: shortest repr that round-trips in that dtype (0.1, not 0.1000000015).
    return str(x)


def absent_reason(
    key: str, shape: tuple[int, ...], dtype: str, verdict: Verdict, reference: str
) -> str:
    """The reason of a key on one side only (`verdict` `"missing"` or `"unexpected"`)."""
    live = reference not in ("golden", "baseline")  # a live tree, not a pinned or re-produced file
    if verdict == "missing":
        return (
            f"key {key!r} (shape {shape}, {dtype}) is in the "
            f"{'expected tree' if live else reference} but not in the "
            "actual outputs: the change dropped or renamed it; restore it"
            + (", or leave it out of the expected tree" if live else ", or repin the goldens")
            + " if the change is intended"
        )
    return f"key {key!r} (shape {shape}, {dtype}) is in the actual outputs but not in the " + (
        "expected tree: add it there, or stop producing it"
        if live
        else f"{reference}: repin the goldens to pin it, or stop producing it"
    )


def array_reason(v: ArrayVerdict) -> str:
    """The message of `measure_array`: why the array fails, naming the key, the class and
    its rule, how many elements break it, the worst element (index and both values), the
    figures, the shape and dtype; `""` for a pass.

    **Arguments:** `v`, a comparator's result.

    **Returns:** the text `Finding.reason` holds, before any clause about a proof op by op
    (`proof_clause`: `UNPROVED` under a class that proves).
    """
    key, tol, reference = v.key, v.tol, v.reference
    dtype = v.dtype_expected.name
    if v.mismatch == "dtype":
        return (
            f"key {key!r}: dtype {v.dtype_actual.name} (actual) does not match {dtype} "
            f"({reference}); parity compares dtypes strictly, without casting. Produce "
            f"{dtype}"
            + (", or repin the goldens" if reference == "golden" else "")
            + " if the dtype change is intended"
        )
    if v.mismatch == "shape":
        return (
            f"key {key!r}: shape {v.shape_actual} (actual) does not match {v.shape_expected} "
            f"({reference}), {dtype}; parity compares shapes strictly, without broadcasting"
        )
    if v.verdict == "pass":
        return ""
    n, n_violating = v.n_elements, cast(int, v.n_violating)
    share = n_violating / n
    notes: list[str] = []
    if v.n_nan_inf_mismatch:
        notes.append(
            f"{count(v.n_nan_inf_mismatch, 'NaN/inf position')} "
            f"{'differs' if v.n_nan_inf_mismatch == 1 else 'differ'} (NaN and ±inf must sit at the "
            "same positions under every class)"
        )
    if v.kind == "int" and tol.rule.tolerant:
        notes.append(f"{dtype} arrays are compared exactly under every class")
    if v.kind == "other" and tol.rule.tolerant:
        notes.append(f"{dtype} has no float rule in parity; compared exactly")
    what = "break the rule" if tol.rule.tolerant else "differ in their bits"
    values = f"actual {_fmt(v.worst_actual)} vs {reference} {_fmt(v.worst_expected)}"
    figures = []
    if v.max_abs is not None:
        figures.append(f"max |a-b| {sig(v.max_abs)}")
    if v.max_rel is not None:
        figures.append(f"max rel {sig(v.max_rel)}")
    if v.max_ulp is not None:
        figures.append(f"max ulp {v.max_ulp}")
    reason = (
        f"key {key!r} breaks class {tol.name!r} ({tol.describe_allowed()}): "
        f"{n_violating} of {count(n, 'element')} ({sig(100 * share)}%) {what}; {v.worst_is} "
        f"at index {v.worst_index}: {values}"
    )
    reason += f"{v.worst_detail}; {', '.join(figures)}; shape {v.shape_expected}, {dtype}"
    if notes:
        reason += "; " + "; ".join(notes)
    return reason


def proof_clause(v: ArrayVerdict, reason: str) -> str:
    """The clause a failure's reason ends with about a proof op by op: `UNPROVED` where its
    class proves (`Rule.proves`) and nobody proved it yet; "" otherwise. Kept apart in the
    finding (`Finding.proof_clause`), so that a proof replaces it whole, not by its words."""
    if not reason or not v.tol.rule.proves:
        return ""
    return UNPROVED_ROUNDING if v.tol.rule.rounds else UNPROVED
