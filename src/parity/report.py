"""Reports of a `Comparison`: a terminal table, JSON for machines, an HTML page with plots.

The table gives, per tolerance class, how many arrays passed and the worst figures, then
where the two runs part ways (the first key that is not bitwise equal, the first that
breaks its class), then every failing key with its reason. The HTML page adds, per class,
a plot of each key's error along the forward order against the allowed band.

`rich` (colour on a terminal) and `matplotlib` (plots) are optional and imported lazily.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from parity.judge.compare import Comparison, Finding
from parity.judge.floats import json_float

__all__ = [
    "ClassSummary",
    "format_table",
    "print_report",
    "summarize",
    "text_table",
    "to_json",
    "write_html",
    "write_json",
]

#: Identifies the layout of `to_json` output; bump on incompatible changes.
JSON_SCHEMA = "parity.report/1"


@dataclass(frozen=True)
class ClassSummary:
    """Counts and worst figures of one tolerance class in a comparison.

    **Fields:**

    - `class_name`, `allowed`: the class and its rule in words.
    - `arrays`, `passed`, `failed`, `bitwise_equal`: counts of keys (missing and unexpected
        keys count as failed).
    - `max_abs`, `max_ulp`: the largest over the class's keys (`None` if no key has one).
    - `worst_key`: the failing key with the largest error, or, if none fails, the key with
        the largest error; `None` when every key is bitwise equal.
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

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-safe dict (non-finite floats as strings)."""
        return {
            "class": self.class_name,
            "allowed": self.allowed,
            "arrays": self.arrays,
            "passed": self.passed,
            "failed": self.failed,
            "bitwise_equal": self.bitwise_equal,
            "max_abs": _json_float(self.max_abs),
            "max_ulp": self.max_ulp,
            "worst_key": self.worst_key,
        }


def _json_float(x: float | None) -> float | str | None:
    return x if x is None else json_float(x)


def _severity(f: Finding) -> tuple[bool, float, float, float]:
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
        worst = max(findings, key=_severity)
        worst_key = None if worst.bitwise_equal else worst.key
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
            )
        )
    return out


def _num(x: float | int | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, int):
        return str(x)
    return f"{x:.3g}"


def _value(v: Any, dtype: str | None) -> str:
    # float64 values need repr to show every digit; narrower floats round-trip in 9 digits.
    if isinstance(v, float) and dtype != "float64":
        return f"{v:.9g}"
    return repr(v)


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


def _divergence(label: str, f: Finding | None) -> str:
    if f is None:
        return f"{label}: none"
    if f.verdict in ("missing", "unexpected") or f.worst_index is None:
        return f"{label}: {f.key} [{f.class_name}, {f.verdict}] {f.reason}".rstrip()
    where = f"index {f.worst_index}" if f.worst_index else "the scalar"
    figures = f"max |a-b| {_num(f.max_abs)}"
    if f.max_ulp is not None:
        figures += f", max ulp {f.max_ulp}"
    return (
        f"{label}: {f.key} [{f.class_name}, {f.verdict}] at {where}: "
        f"actual {_value(f.worst_actual, f.dtype_golden)} vs golden "
        f"{_value(f.worst_golden, f.dtype_golden)}; {figures}; allowed {f.allowed}"
    )


#: The per-class table, shared by the text and HTML reports; right-aligned columns marked.
_CLASS_COLUMNS = (
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
_CLASS_RIGHT = (False, False, True, True, True, True, True, True, False)


def _class_row(s: ClassSummary) -> list[str]:
    return [
        s.class_name,
        s.allowed,
        str(s.arrays),
        str(s.passed),
        str(s.failed),
        str(s.bitwise_equal),
        _num(s.max_abs),
        _num(s.max_ulp),
        s.worst_key or "-",
    ]


#: Checks of a session report: (name, comparison) in the order they ran.
Checks = Sequence[tuple[str, Comparison]]


def _check_lines(checks: Checks, *, failing_only: bool = False) -> list[str]:
    """Per check: its verdict and first divergence, in that check's own forward order."""
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
        lines.append(
            f"  {verdict} {name} ({len(comp.failures)} of {len(comp.findings)} arrays fail)"
        )
        if comp.first_not_bitwise is not None:
            lines.append("      " + _divergence("first not bitwise equal", comp.first_not_bitwise))
        if not comp.passed:
            lines.append("      " + _divergence("first breaking its class", comp.first_failure))
    return lines


def format_table(
    comparison: Comparison,
    *,
    header: Mapping[str, str] | None = None,
    checks: Checks | None = None,
    failing_checks_only: bool = False,
) -> str:
    """The comparison as a plain-text table, for a terminal or a log.

    **Arguments:**

    - `comparison`: the comparison to report.
    - `header`: lines to show first, for example provenance and its drift.
    - `checks`: for a session of several checks, each check's own comparison in the
      order they ran; the first divergence is then named per check (a divergence across
      unrelated checks means nothing), and `comparison` serves the per-class table.
    - `failing_checks_only`: list only the checks that fail (for a terminal summary).

    **Returns:** the text: the verdict, the header, a table per class (arrays, passed,
    failed, bitwise equal, max abs, max ulp, worst key), the first divergence, the notes
    rules make of passing arrays (a budget that shrank) and every failing key with its
    reason. No colour codes.
    """
    failures = comparison.failures
    verdict = "PASS" if comparison.passed else "FAIL"
    lines = [
        f"parity: {verdict} ({len(failures)} of {len(comparison.findings)} arrays fail)",
    ]
    if header:
        width = max(len(k) for k in header)
        lines += [f"  {k.ljust(width)}  {v}" for k, v in header.items()]
    lines.append("")
    rows = [list(_CLASS_COLUMNS)] + [_class_row(c) for c in summarize(comparison)]
    right = _CLASS_RIGHT
    lines += text_table(rows, right) if len(rows) > 1 else ["(no arrays compared)"]
    if checks is None:
        lines += [
            "",
            "first divergence (in forward order):",
            "  " + _divergence("first not bitwise equal", comparison.first_not_bitwise),
            "  " + _divergence("first breaking its class", comparison.first_failure),
        ]
    else:
        lines += ["", *_check_lines(checks, failing_only=failing_checks_only)]
    noted = [f for f in comparison.findings if f.note]
    if noted:
        lines += ["", f"notes ({len(noted)}):"]
        lines += [f"  {f.key} [{f.class_name}, {f.verdict}]: {f.note}" for f in noted]
    if failures:
        lines += ["", f"failures ({len(failures)}):"]
        lines += [f"  {f.key} [{f.class_name}, {f.verdict}]: {f.reason}" for f in failures]
    return "\n".join(lines) + "\n"


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
    text = json.dumps(to_json(comparison, header=header), indent=2, allow_nan=False)
    target.write_text(text + "\n", encoding="utf-8")
    return target


# --- HTML ---------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.pass { color: #11772b; font-weight: bold; }
.fail, .missing, .unexpected { color: #b3141b; font-weight: bold; }
code { font-size: 0.95em; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
.note { background: #fff6d5; padding: 0.5em; border: 1px solid #e6d68a; }
"""


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:60]


def _plot_class(path: Path, name: str, findings: Sequence[Finding]) -> None:
    """One PNG: each key's error along the forward order against the class's allowed band."""
    import numpy as np
    from matplotlib.figure import Figure

    in_ulp = findings[0].unit == "ulp"
    # Absent, mismatched and NaN/inf-misplaced keys have no meaningful figure: they are
    # drawn as markers along the top instead.
    figure = [
        None
        if f.max_abs is None or f.n_nan_inf_mismatch
        else (f.figure if f.figure is not None else f.max_ulp if in_ulp else f.max_abs)
        for f in findings
    ]
    y = np.array([math.nan if v is None else float(v) for v in figure], dtype=np.float64)
    bound = np.array([math.nan if f.bound is None else f.bound for f in findings], dtype=np.float64)
    positive = np.concatenate([y[y > 0], bound[bound > 0]])
    # Zero errors and zero bands have no place on a log axis: they sit on a floor below the
    # smallest positive figure, drawn hollow and labelled as such.
    floor = float(positive.min()) / 10 if positive.size else 1e-12
    top = float(positive.max()) * 10 if positive.size else 1.0
    x = np.arange(len(findings))
    failed = np.array([not f.passed for f in findings])
    absent = np.isnan(y)
    zero = (y == 0) & ~failed

    fig = Figure(figsize=(min(16.0, 6.0 + 0.05 * len(findings)), 4.5), dpi=80)
    # Fixed margins (room for the rotated key labels below): `tight_layout` draws the
    # whole figure once more only to measure it.
    fig.subplots_adjust(left=0.08, right=0.98, top=0.92, bottom=0.3)
    ax = fig.add_subplot()
    if np.any(bound > 0):
        # Keys without a bound (absent, mismatched) leave a gap rather than a dip.
        band = np.where(np.isnan(bound), np.nan, np.where(bound > 0, bound, floor))
        ax.fill_between(
            x,
            floor,
            band,
            step="mid",
            alpha=0.2,
            color="tab:green",
            label=f"allowed ({findings[0].allowed})",
        )
        ax.step(x, band, where="mid", color="tab:green", linewidth=1)
    else:
        ax.axhline(floor, color="tab:green", linewidth=1, label=f"allowed: {findings[0].allowed}")
    ok = ~failed & ~absent & ~zero
    ax.plot(
        x,
        np.where(absent, np.nan, np.maximum(y, floor)),
        color="tab:blue",
        linewidth=0.8,
        alpha=0.6,
    )
    if ok.any():
        ax.plot(x[ok], y[ok], "o", color="tab:blue", markersize=4, label="within class")
    if zero.any():
        ax.plot(
            x[zero],
            np.full(int(zero.sum()), floor),
            "o",
            markerfacecolor="none",
            color="tab:blue",
            markersize=4,
            label="0 (plotted on the floor)",
        )
    bad = failed & ~absent
    if bad.any():
        ax.plot(
            x[bad],
            np.maximum(y[bad], floor),
            "X",
            color="tab:red",
            markersize=7,
            label="breaks class",
        )
    if (failed & absent).any():
        ax.plot(
            x[failed & absent],
            np.full(int((failed & absent).sum()), top),
            "v",
            color="tab:red",
            markersize=7,
            label="missing, unexpected, mismatched or NaN/inf misplaced",
        )
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, top * 2)
    ax.set_ylabel("max ulp" if in_ulp else "max |a-b|")
    # A fixed title position: placing it automatically measures every tick label again.
    ax.set_title(f"{name}: error per key, in forward order", y=1.01)
    step = max(1, -(-len(findings) // 25))
    ax.set_xticks(x[::step])
    ax.set_xticklabels([f.key for f in findings][::step], rotation=90, fontsize=6)
    ax.legend(fontsize=7, loc="upper right")
    fig.savefig(str(path), format="png")


def _cells(values: Sequence[str], tag: str = "td") -> str:
    import html

    return "".join(f"<{tag}>{html.escape(v)}</{tag}>" for v in values)


def write_html(
    directory: str | os.PathLike[str],
    comparison: Comparison,
    *,
    header: Mapping[str, str] | None = None,
    title: str = "parity report",
    checks: Checks | None = None,
) -> Path:
    """Write an HTML report, `index.html` with one PNG plot per class, into `directory`.

    The page needs nothing outside `directory`: the CSS is inline and the plots are files
    beside it. Without matplotlib the page is written without plots and says so.

    **Arguments:**

    - `directory`: where to write; created if needed.
    - `comparison`: the comparison to report.
    - `header`: provenance and the like, shown in a table at the top.
    - `title`: the page title.
    - `checks`: as in `format_table`: the first divergence is then shown per check.

    **Returns:** the path of `index.html`.
    """
    import html  # here: html.entities is 10 ms that text and JSON reports never need

    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    esc = html.escape
    verdict = "pass" if comparison.passed else "fail"
    body = io.StringIO()
    w = body.write
    w(f"<h1>{esc(title)}</h1>\n")
    w(
        f'<p>verdict: <span class="{verdict}">{verdict.upper()}</span> '
        f"({len(comparison.failures)} of {len(comparison.findings)} arrays fail)</p>\n"
    )
    if header:
        w("<h2>header</h2>\n<table>\n")
        for k, v in header.items():
            w(f"<tr><th>{esc(str(k))}</th><td>{esc(str(v))}</td></tr>\n")
        w("</table>\n")

    w("<h2>per class</h2>\n<table>\n<tr>" + _cells(_CLASS_COLUMNS, "th") + "</tr>\n")
    for c in summarize(comparison):
        cells = [
            f'<td class="num">{esc(v)}</td>' if r else f"<td>{esc(v)}</td>"
            for v, r in zip(_class_row(c), _CLASS_RIGHT, strict=True)
        ]
        cells[1] = f"<td><code>{esc(c.allowed)}</code></td>"
        w("<tr>" + "".join(cells) + "</tr>\n")
    w("</table>\n")

    if checks is None:
        w("<h2>first divergence (in forward order)</h2>\n<ul>\n")
        w(f"<li>{esc(_divergence('first not bitwise equal', comparison.first_not_bitwise))}</li>\n")
        w(f"<li>{esc(_divergence('first breaking its class', comparison.first_failure))}</li>\n")
        w("</ul>\n")
    else:
        w("<h2>checks, in the order they ran</h2>\n<table>\n<tr>")
        w(_cells(["check", "verdict", "arrays", "first divergence (this check's order)"], "th"))
        w("</tr>\n")
        for name, comp in checks:
            verdict = "pass" if comp.passed else "fail"
            pointers = [_divergence("first not bitwise equal", comp.first_not_bitwise)]
            if not comp.passed:
                pointers.append(_divergence("first breaking its class", comp.first_failure))
            w(
                f'<tr><td>{esc(name)}</td><td class="{verdict}">{verdict}</td>'
                f'<td class="num">{len(comp.failures)} of {len(comp.findings)} fail</td>'
                f"<td>{'<br>'.join(esc(p) for p in pointers)}</td></tr>\n"
            )
        w("</table>\n")

    w("<h2>plots</h2>\n")
    try:
        import matplotlib  # noqa: F401  (only to learn whether plots are possible)
    except ImportError:
        w(
            '<p class="note">matplotlib is not installed, so this report has no plots; '
            "install it (<code>pip install matplotlib</code>, the <code>plots</code> extra) "
            "and rerun.</p>\n"
        )
    else:
        for i, (name, findings) in enumerate(comparison.by_class().items()):
            if all(f.passed and f.bitwise_equal for f in findings):
                # A flat line on the floor says nothing a sentence cannot, at a fraction
                # of the cost (plots are most of a report's time).
                w(f"<p>{esc(name)}: all {len(findings)} arrays bitwise equal; no plot.</p>\n")
                continue
            png = f"plot_{i:02d}_{_safe_name(name)}.png"
            _plot_class(out_dir / png, name, findings)
            alt = f"{name}: error per key against the allowed band"
            w(f'<p><img src="{esc(png)}" alt="{esc(alt)}"></p>\n')

    failures = comparison.failures
    w(f"<h2>failures ({len(failures)})</h2>\n")
    if failures:
        w("<table>\n<tr>" + _cells(["key", "class", "verdict", "reason"], "th") + "</tr>\n")
        for f in failures:
            w(
                f"<tr><td>{esc(f.key)}</td><td>{esc(f.class_name)}</td>"
                f'<td class="{esc(f.verdict)}">{esc(f.verdict)}</td><td>{esc(f.reason)}</td></tr>\n'
            )
        w("</table>\n")

    w("<h2>all arrays, in forward order</h2>\n<table>\n<tr>")
    w(
        _cells(
            [
                "key",
                "class",
                "verdict",
                "shape",
                "dtype",
                "differ",
                "max abs",
                "max ulp",
                "worst index",
            ],
            "th",
        )
    )
    w("</tr>\n")
    for f in comparison.findings:
        shape = f.shape_golden if f.shape_golden is not None else f.shape_actual
        dtype = f.dtype_golden or f.dtype_actual or "-"
        w(
            f"<tr><td>{esc(f.key)}</td><td>{esc(f.class_name)}</td>"
            f'<td class="{esc(f.verdict)}">{esc(f.verdict)}</td>'
            f"<td>{esc(str(shape))}</td><td>{esc(dtype)}</td>"
            f'<td class="num">{esc(_num(f.n_differ))}</td>'
            f'<td class="num">{esc(_num(f.max_abs))}</td>'
            f'<td class="num">{esc(_num(f.max_ulp))}</td>'
            f"<td>{esc(str(f.worst_index) if f.worst_index is not None else '-')}</td></tr>\n"
        )
    w("</table>\n")

    page = (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{esc(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"{body.getvalue()}</body>\n</html>\n"
    )
    index = out_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index
