"""The report as an HTML page, with a plot per class where matplotlib is installed."""

from __future__ import annotations

import io
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.judge._compare import Comparison, Finding
from parity.report._summary import (
    CLASS_COLUMNS,
    CLASS_RIGHT,
    Checks,
    arrays_failing,
    class_row,
    divergence,
    num,
    proved_words,
    summarize,
)

if TYPE_CHECKING:  # the origin is the same height as the reports: read, never imported
    from parity.origin._localisation import Localisation
    from parity.origin._origin import Origin

__all__ = ["write_html"]

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


#: check name -> what its origin search found (`CheckResult.origin`).
Origins = Mapping[str, "Localisation"]


def _plot_origin(path: Path, name: str, found: Localisation, origin: Origin) -> None:
    """One PNG: the share of the new program's values that matched the old program's, in
    equal bins along the program in dataflow order, and where the origin sits."""
    import numpy as np
    from matplotlib.figure import Figure

    profile = np.asarray(found.profile, dtype=np.float64)
    edges = np.linspace(0.0, 1.0, len(profile) + 1)
    fig = Figure(figsize=(8.0, 3.2), dpi=80)
    fig.subplots_adjust(left=0.09, right=0.98, top=0.88, bottom=0.16)
    ax = fig.add_subplot()
    ax.stairs(profile, edges, fill=True, alpha=0.35, color="tab:green", label="matched")
    ax.stairs(profile, edges, color="tab:green", linewidth=1)
    where = f"{origin.file or '<no source>'}:{origin.line}"
    ax.axvline(
        found.origin_at,
        color="tab:red",
        linewidth=1.5,
        label=f"origin: {origin.primitive} at {where}",
    )
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, 1.05)
    ax.set_xlabel(f"position in the new program (dataflow order, {found.values} values)")
    ax.set_ylabel("matched share")
    share = origin.matched_fraction
    ax.set_title(f"{name}: values matched along the program ({share:.1%} in all)", y=1.01)
    ax.legend(fontsize=7, loc="lower left")
    fig.savefig(str(path), format="png")


def _origin_section(
    out_dir: Path, origins: Origins, w: Callable[[str], Any], *, plots: bool
) -> None:
    """The page's "where it diverged" section: each origin line, and its plot where
    `plots` (matplotlib is installed): the lines need no plotting library."""
    import html

    w("<h2>where it diverged</h2>\n")
    for i, (name, found) in enumerate(origins.items()):
        w(f"<p><b>{html.escape(name)}</b>: <code>{html.escape(found.line)}</code></p>\n")
        if not plots or found.origin is None or not found.profile:
            continue
        png = f"origin_{i:02d}_{_safe_name(name)}.png"
        _plot_origin(out_dir / png, name, found, found.origin)
        alt = f"{name}: matched share of the new program's values along the program"
        w(f'<p><img src="{html.escape(png)}" alt="{html.escape(alt)}"></p>\n')


def _cells(values: Sequence[str], tag: str = "td") -> str:
    import html

    return "".join(f"<{tag}>{html.escape(v)}</{tag}>" for v in values)


def _summary_section(
    comparison: Comparison,
    header: Mapping[str, str] | None,
    title: str,
    w: Callable[[str], Any],
) -> None:
    """The page's title, verdict, header table and per-class table."""
    from html import escape as esc

    verdict = "pass" if comparison.passed else "fail"
    w(f"<h1>{esc(title)}</h1>\n")
    w(
        f'<p>verdict: <span class="{verdict}">{verdict.upper()}</span> '
        f"({arrays_failing(comparison)})"
        + (f", {esc(proved_words(comparison.proved))}" if comparison.proved else "")
        + (f", not exact: {esc(comparison.inexact)}" if comparison.inexact else "")
        + "</p>\n"
    )
    if header:
        w("<h2>header</h2>\n<table>\n")
        for k, v in header.items():
            w(f"<tr><th>{esc(str(k))}</th><td>{esc(str(v))}</td></tr>\n")
        w("</table>\n")

    w("<h2>per class</h2>\n<table>\n<tr>" + _cells(CLASS_COLUMNS, "th") + "</tr>\n")
    for c in summarize(comparison):
        cells = [
            f'<td class="num">{esc(v)}</td>' if r else f"<td>{esc(v)}</td>"
            for v, r in zip(class_row(c), CLASS_RIGHT, strict=True)
        ]
        cells[1] = f"<td><code>{esc(c.allowed)}</code></td>"
        w("<tr>" + "".join(cells) + "</tr>\n")
    w("</table>\n")


def _divergence_section(
    comparison: Comparison,
    checks: Checks | None,
    origins: Origins | None,
    w: Callable[[str], Any],
) -> None:
    """The first divergence: of the whole comparison, or per check (with its origin line)."""
    from html import escape as esc

    if checks is None:
        w("<h2>first divergence (in forward order)</h2>\n<ul>\n")
        w(f"<li>{esc(divergence('first not bitwise equal', comparison.first_not_bitwise))}</li>\n")
        w(f"<li>{esc(divergence('first breaking its class', comparison.first_failure))}</li>\n")
        w("</ul>\n")
        return
    w("<h2>checks, in the order they ran</h2>\n<table>\n<tr>")
    w(_cells(["check", "verdict", "arrays", "first divergence (this check's order)"], "th"))
    w("</tr>\n")
    for name, comp in checks:
        verdict = "pass" if comp.passed else "fail"
        pointers = [divergence("first not bitwise equal", comp.first_not_bitwise)]
        if not comp.passed:
            pointers.append(divergence("first breaking its class", comp.first_failure))
            if origins and name in origins:
                pointers.append(origins[name].line)
        w(
            f'<tr><td>{esc(name)}</td><td class="{verdict}">{verdict}</td>'
            f'<td class="num">{len(comp.failures)} of {len(comp.findings)} fail</td>'
            f"<td>{'<br>'.join(esc(p) for p in pointers)}</td></tr>\n"
        )
    w("</table>\n")


def _can_plot() -> bool:
    """Whether matplotlib is installed (the `plots` extra)."""
    try:
        import matplotlib  # noqa: F401  (only to learn whether plots are possible)
    except ImportError:
        return False
    return True


def _plots_section(
    out_dir: Path, comparison: Comparison, w: Callable[[str], Any], *, plots: bool
) -> None:
    """One plot per class, or a note where matplotlib is missing."""
    from html import escape as esc

    w("<h2>plots</h2>\n")
    if not plots:
        w(
            '<p class="note">matplotlib is not installed, so this report has no plots; '
            "install it (<code>pip install matplotlib</code>, the <code>plots</code> extra) "
            "and rerun.</p>\n"
        )
        return
    for i, (name, findings) in enumerate(comparison.by_class().items()):
        if all(f.passed and f.bitwise_equal for f in findings):
            # A flat line on the floor says nothing a sentence cannot, at a fraction
            # of the cost (plots are most of a report's time).
            w(f"<p>{esc(name)}: {_all(len(findings))} bitwise equal; no plot.</p>\n")
            continue
        png = f"plot_{i:02d}_{_safe_name(name)}.png"
        _plot_class(out_dir / png, name, findings)
        alt = f"{name}: error per key against the allowed band"
        w(f'<p><img src="{esc(png)}" alt="{esc(alt)}"></p>\n')


def _findings_section(comparison: Comparison, w: Callable[[str], Any]) -> None:
    """Every failure with its reason, then every array in forward order."""
    from html import escape as esc

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
        shape = f.shape_expected if f.shape_expected is not None else f.shape_actual
        dtype = f.dtype_expected or f.dtype_actual or "-"
        w(
            f"<tr><td>{esc(f.key)}</td><td>{esc(f.class_name)}</td>"
            f'<td class="{esc(f.verdict)}">{esc(f.verdict)}</td>'
            f"<td>{esc(str(shape))}</td><td>{esc(dtype)}</td>"
            f'<td class="num">{esc(num(f.n_differ))}</td>'
            f'<td class="num">{esc(num(f.max_abs))}</td>'
            f'<td class="num">{esc(num(f.max_ulp))}</td>'
            f"<td>{esc(str(f.worst_index) if f.worst_index is not None else '-')}</td></tr>\n"
        )
    w("</table>\n")


def write_html(
    directory: str | os.PathLike[str],
    comparison: Comparison,
    *,
    header: Mapping[str, str] | None = None,
    title: str = "parity report",
    checks: Checks | None = None,
    origins: Origins | None = None,
) -> Path:
    """Write an HTML report, `index.html` with one PNG plot per class, into `directory`.

    The page needs nothing outside `directory`: the CSS is inline and the plots are files
    beside it. Without matplotlib the page is written without plots and says so; the
    origins' lines are there either way.

    **Arguments:**

    - `directory`: where to write; created if needed.
    - `comparison`: the comparison to report.
    - `header`: provenance and the like, shown in a table at the top.
    - `title`: the page title.
    - `checks`: as in `format_table`: the first divergence is then shown per check.
    - `origins`: check name -> what its origin search found: its `line` under its first
      divergence, and a plot of the matched share along the program where one was named.

    **Returns:** the path of `index.html`.
    """
    import html  # here: html.entities is 10 ms that text and JSON reports never need

    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    esc = html.escape
    body = io.StringIO()
    w = body.write
    _summary_section(comparison, header, title, w)
    _divergence_section(comparison, checks, origins, w)
    plots = _can_plot()
    if origins:
        _origin_section(out_dir, origins, w, plots=plots)
    _plots_section(out_dir, comparison, w, plots=plots)
    _findings_section(comparison, w)

    page = (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{esc(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"{body.getvalue()}</body>\n</html>\n"
    )
    index = out_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def _all(n: int) -> str:
    """ "all 3 arrays", "the one array"."""
    return "the one array" if n == 1 else f"all {n} arrays"
