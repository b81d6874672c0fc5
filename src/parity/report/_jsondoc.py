"""The report as JSON for machines (strict: non-finite floats as strings)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from parity.judge._compare import Comparison, Finding
from parity.report._summary import Checks, summarize

__all__ = ["JSON_SCHEMA", "json_text", "to_json", "write_json"]

#: Identifies the layout of `to_json` output; bump on incompatible changes.
JSON_SCHEMA = "parity.report/1"


def to_json(
    comparison: Comparison,
    *,
    header: Mapping[str, str] | None = None,
    checks: Checks | None = None,
) -> dict[str, Any]:
    """The comparison as one JSON-safe object, for machines.

    **Arguments:**

    - `comparison`: the comparison to report.
    - `header`: provenance and the like, copied under `"header"` (values as strings).

    **Returns:** a dict with `schema`, `verdict` (`"pass"`/`"fail"`), `header`, `summary`
    (per class: `arrays`, `passed`, `failed`, `bitwise_equal`, `max_abs`, `max_ulp`,
    `worst_key`, `allowed`), `totals`, `first_not_bitwise` and `first_failure` (finding
    dicts or null) and `findings` (see `Finding.to_dict`; the class is under `"class"`).
    Non-finite floats are the strings `"nan"`, `"inf"`, `"-inf"`.

    With `checks` (as in `format_table`), the first divergences are per check, under
    `"checks"` (`name`, `verdict`, `n_arrays`, `n_failures`, `first_not_bitwise`,
    `first_failure`, in the order the checks ran), and the top-level ones are absent.
    """
    first_nb, first_fail = comparison.first_not_bitwise, comparison.first_failure
    verdicts = [f.verdict for f in comparison.findings]
    doc = {
        "schema": JSON_SCHEMA,
        "verdict": "pass" if comparison.passed else "fail",
        "inexact": comparison.inexact,
        "proved": [f.key for f in comparison.proved],
        "header": {str(k): str(v) for k, v in (header or {}).items()},
        "summary": {s.class_name: s.to_dict() for s in summarize(comparison)},
        "totals": {
            "arrays": len(verdicts),
            **{v: verdicts.count(v) for v in ("pass", "fail", "missing", "unexpected")},
        },
        "first_not_bitwise": None if first_nb is None else first_nb.to_dict(),
        "first_failure": None if first_fail is None else first_fail.to_dict(),
        "findings": [f.to_dict() for f in comparison.findings],
    }
    if checks is not None:
        del doc["first_not_bitwise"], doc["first_failure"]
        doc["checks"] = [
            {
                "name": name,
                "verdict": "pass" if comp.passed else "fail",
                "inexact": comp.inexact,
                "proved": [f.key for f in comp.proved],
                "n_arrays": len(comp.findings),
                "n_failures": len(comp.failures),
                "first_not_bitwise": _finding_json(comp.first_not_bitwise),
                "first_failure": _finding_json(comp.first_failure),
            }
            for name, comp in checks
        ]
    return doc


def _finding_json(f: Finding | None) -> dict[str, Any] | None:
    return None if f is None else f.to_dict()


def write_json(
    path: str | os.PathLike[str],
    comparison: Comparison,
    *,
    header: Mapping[str, str] | None = None,
) -> Path:
    """Write `to_json`'s object to `path` (indented, strict JSON: no NaN literals).

    **Returns:** the path written.
    """
    target = Path(path)
    target.write_text(json_text(to_json(comparison, header=header)), encoding="utf-8")
    return target


def json_text(doc: Mapping[str, Any]) -> str:
    """`doc` (from `to_json`) as `write_json` writes it: indented, strict JSON (no NaN
    literals), in its own order, a newline at the end."""
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"
