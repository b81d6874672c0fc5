"""The report as text: the per-class table, the first divergence, every failing key."""

from __future__ import annotations

import collections
import sys
from collections.abc import Mapping, Sequence
from typing import IO

from parity.judge._compare import Comparison, Finding
from parity.report._summary import (
    CLASS_COLUMNS,
    CLASS_RIGHT,
    Checks,
    arrays_failing,
    check_lines,
    class_row,
    divergence,
    proved_words,
    summarize,
)

__all__ = ["format_table", "print_report", "text_table", "verdict_line"]


def verdict_line(comparison: Comparison) -> str:
    """The report's first line: PASS or FAIL, how many arrays fail and, where a key was
    judged more loosely than the check could have judged it (`Comparison.inexact`), "not
    exact" with which keys, why and what to do."""
    verdict = "PASS" if comparison.passed else "FAIL"
    line = f"parity: {verdict} ({arrays_failing(comparison)})"
    if proved := comparison.proved:
        line += f", {proved_words(proved)}"
    return f"{line}, not exact: {comparison.inexact}" if comparison.inexact else line


def text_table(rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    """`rows` (the first one the column titles) as aligned text lines: columns two spaces
    apart, each left-aligned or, where `right` says so, right-aligned; a line of dashes
    under the titles; no trailing spaces."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def format_table(
    comparison: Comparison,
    *,
    header: Mapping[str, str] | None = None,
    checks: Checks | None = None,
    failing_checks_only: bool = False,
    failures: bool = True,
    order: str = "forward order",
    origins: Mapping[str, str] | None = None,
) -> str:
    """The comparison as a plain-text table, for a terminal or a log.

    **Arguments:**

    - `comparison`: the comparison to report.
    - `header`: lines to show first, for example provenance and its drift.
    - `checks`: for a session of several checks, each check's own comparison in the
      order they ran; the first divergence is then named per check (a divergence across
      unrelated checks means nothing), and `comparison` serves the per-class table.
    - `failing_checks_only`: list only the checks that fail (for a terminal summary).
    - `failures`: end with every failing key and its reason (a terminal summary leaves them
      out: each test printed its own).
    - `order`: what the comparison's order is, in the first divergence's heading:
      `"forward order"`, or `"container order"` where nobody derived or declared one
      (`assert_equivalent` of two containers).
    - `origins`: with `checks`, check name -> its `origin:` line, shown under that check's
      first divergence (`parity._results.CheckResult.origin_line`).

    **Returns:** the text: the verdict, the header, a table per class (arrays, passed,
    failed, bitwise equal, max abs, max ulp, worst key), the first divergence, the notes
    rules make of passing arrays (a budget that shrank) and every failing key with its
    reason. No colour codes.

    **Example:**

    ```python
    comparison = parity.assert_equivalent(new, old, class_map="fp32_reassoc")
    print(parity.format_table(comparison))  # verdict, per-class table, first divergence
    ```
    """
    failing = comparison.failures
    lines = [verdict_line(comparison)]
    if header:
        width = max(len(k) for k in header)
        lines += [f"  {k.ljust(width)}  {v}" for k, v in header.items()]
    lines.append("")
    rows = [list(CLASS_COLUMNS)] + [class_row(c) for c in summarize(comparison)]
    right = CLASS_RIGHT
    lines += text_table(rows, right) if len(rows) > 1 else ["(no arrays compared)"]
    if checks is None:
        lines += [
            "",
            f"first divergence (in {order}):",
            "  " + divergence("first not bitwise equal", comparison.first_not_bitwise),
            "  " + divergence("first breaking its class", comparison.first_failure),
        ]
    else:
        lines += ["", *check_lines(checks, failing_only=failing_checks_only, origins=origins)]
    noted = [f for f in comparison.findings if f.note]
    if noted:
        lines += ["", f"notes ({len(noted)}):"]
        lines += [f"  {f.key} [{f.class_name}, {f.verdict}]: {f.note}" for f in noted]
    if failing:
        lines.append("")
    if failing and failures:
        lines.append(f"failures ({len(failing)}):")
        lines += _failure_lines(failing)
    return "\n".join(lines) + "\n"


def _failure_lines(failing: Sequence[Finding]) -> list[str]:
    """One line per failing key; a proof's reason that several keys share (one operation
    with no rounding model keeps many keys from a proof) is said in full at its first key,
    with the count, and named by that key at the rest."""
    shared = collections.Counter(f.proof_clause for f in failing if f.proof_clause)
    first: dict[str, str] = {}
    out = []
    for f in failing:
        reason, clause = f.reason, f.proof_clause
        if clause and shared[clause] > 1:
            if clause in first:
                kept = reason[: len(reason) - len(clause)].rstrip("; ")
                reason = f"{kept}; not proved, as {first[clause]}"
            else:
                first[clause] = f.key
                reason += f" (the same for {shared[clause] - 1} more keys)"
        out.append(f"  {f.key} [{f.class_name}, {f.verdict}]: {reason}")
    return out


def print_report(
    comparison: Comparison,
    file: IO[str] | None = None,
    *,
    header: Mapping[str, str] | None = None,
) -> None:
    """Print `format_table`'s text, in colour when `file` is a terminal and rich is installed.

    **Arguments:**

    - `comparison`: the comparison to report.
    - `file`: where to write; `sys.stdout` by default.
    - `header`: as in `format_table`.
    """
    out = sys.stdout if file is None else file
    text = format_table(comparison, header=header)
    isatty = getattr(out, "isatty", None)
    if isatty is not None and isatty():
        try:
            from rich.console import Console
            from rich.text import Text
        except ImportError:
            pass
        else:
            styled = Text(text)
            styled.highlight_regex(r"\b(FAIL|fail|missing|unexpected)\b", "bold red")
            styled.highlight_regex(r"\b(PASS|pass)\b", "green")
            Console(file=out, highlight=False, soft_wrap=True).print(styled, end="")
            return
    out.write(text)
