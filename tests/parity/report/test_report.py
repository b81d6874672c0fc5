"""Reports: the plain table, the JSON object and the HTML page with plots."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from parity.judge._compare import Comparison, compare_trees
from parity.judge._tolerance import ClassMap
from parity.report import format_table, print_report, summarize, to_json, write_html, write_json


def _comparison() -> tuple[Comparison, dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    order = [f"layers.{i}.{tap}" for i in range(6) for tap in ("h1", "post")]
    golden = {k: rng.standard_normal((3, 4)).astype(np.float32) for k in order}
    golden["logits"] = rng.standard_normal(5).astype(np.float32)
    golden["gone"] = np.zeros(2, np.float32)
    actual = {k: v.copy() for k, v in golden.items() if k != "gone"}
    actual["layers.1.post"][0, 1] += np.float32(1e-6)
    actual["layers.4.h1"][2, 3] += np.float32(1e-3)
    actual["logits"][4] = np.float32(np.nan)
    cmap = ClassMap((("layers.*", "fp32_reassoc"),), default="bitwise")
    comparison = compare_trees(actual, golden, cmap, order=order)
    return comparison, actual, golden


def test_table_names_classes_counts_and_first_divergence() -> None:
    comparison, _, _ = _comparison()
    text = format_table(comparison, header={"base sha": "abc123", "jax": "0.4.35"})
    assert "\x1b[" not in text
    assert "abc123" in text
    for summary in summarize(comparison):
        row = next(line for line in text.splitlines() if line.startswith(summary.class_name))
        counts = [summary.arrays, summary.passed, summary.failed]
        assert re.search(r"\s+".join(str(c) for c in counts), row), row
    assert comparison.first_not_bitwise is not None and comparison.first_failure is not None
    first_nb = next(line for line in text.splitlines() if "first not bitwise equal" in line)
    assert comparison.first_not_bitwise.key == "layers.1.post" and "layers.1.post" in first_nb
    first_fail = next(line for line in text.splitlines() if "first breaking its class" in line)
    assert comparison.first_failure.key in first_fail
    for failure in comparison.failures:
        assert failure.reason in text


def test_summary_counts_match_the_findings() -> None:
    comparison, _, _ = _comparison()
    summaries = {s.class_name: s for s in summarize(comparison)}
    for name, findings in comparison.by_class().items():
        assert summaries[name].arrays == len(findings)
        assert summaries[name].failed == sum(not f.passed for f in findings)
    worst = summaries["fp32_reassoc"]
    assert worst.worst_key == "layers.4.h1"
    assert worst.max_abs == max(f.max_abs or 0.0 for f in comparison.by_class()["fp32_reassoc"])


def test_print_report_writes_plain_text_off_a_terminal() -> None:
    comparison, _, _ = _comparison()
    out = io.StringIO()
    print_report(comparison, out)
    assert out.getvalue() == format_table(comparison)


def test_print_report_colours_a_terminal_when_rich_is_installed() -> None:
    pytest.importorskip("rich")

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    comparison, _, _ = _comparison()
    out = Tty()
    print_report(comparison, out)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())
    assert "fp32_reassoc" in plain and "first breaking its class" in plain


def test_json_has_the_documented_keys_and_is_strict_json(tmp_path: Path) -> None:
    comparison, _, _ = _comparison()
    data = to_json(comparison, header={"base sha": "abc123"})
    assert {"verdict", "header", "summary", "first_not_bitwise", "first_failure", "findings"} <= (
        set(data)
    )
    assert data["verdict"] == "fail" and data["header"] == {"base sha": "abc123"}
    assert set(data["summary"]) == {"fp32_reassoc", "bitwise"}
    for entry in data["findings"]:
        assert {"key", "class", "verdict", "max_abs", "max_ulp"} <= set(entry)
    assert [f["key"] for f in data["findings"]] == [f.key for f in comparison.findings]
    path = write_json(tmp_path / "report.json", comparison)
    loaded = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c}"))
    assert loaded["first_failure"]["key"] == comparison.first_failure.key  # type: ignore[union-attr]


def test_html_report_has_plots_that_exist_and_escapes_text(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    comparison, _, _ = _comparison()
    index = write_html(tmp_path / "html", comparison, header={"note": "<script>x</script>"})
    page = index.read_text()
    assert index.name == "index.html"
    assert "<script>x</script>" not in page and "&lt;script&gt;" in page
    images = re.findall(r'<img src="([^"]+)"', page)
    assert len(images) == len(comparison.by_class())
    for name in images:
        png = index.parent / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "http://" not in page and "https://" not in page  # no external assets


def test_html_report_without_matplotlib_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    comparison, _, _ = _comparison()
    index = write_html(tmp_path, comparison)
    page = index.read_text()
    assert "matplotlib is not installed" in page and "<img" not in page
    assert not list(tmp_path.glob("*.png"))


def test_html_report_without_matplotlib_still_says_where_each_check_diverged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from html import escape

    from parity.origin._localisation import Localisation

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    comparison, _, _ = _comparison()
    origins = {
        "forward": Localisation("matched", key="logits"),
        "train": Localisation("not_named", key="loss", reason="the base did not run"),
    }
    page = write_html(tmp_path, comparison, origins=origins).read_text()
    section = page.split("<h2>where it diverged</h2>")[1].split("<h2>")[0]
    for name, found in origins.items():
        assert f"<b>{name}</b>: <code>{escape(found.line)}</code>" in section
    assert "matplotlib is not installed" in page and "<img" not in page


def test_passing_comparison_reports_pass() -> None:
    golden = {"a": np.ones(3, np.float32)}
    comparison = compare_trees(golden, golden, "bitwise")
    assert to_json(comparison)["verdict"] == "pass"
    text = format_table(comparison)
    assert "PASS" in text and "first not bitwise equal: none" in text


def test_html_report_skips_the_plot_of_a_class_whose_arrays_are_all_bitwise_equal(
    tmp_path: Path,
) -> None:
    pytest.importorskip("matplotlib")
    same = {"a.0": np.arange(3, dtype=np.float32), "a.1": np.ones(2, np.float32)}
    comparison = compare_trees(same, dict(same), "fp32_reassoc")
    index = write_html(tmp_path, comparison)
    assert "fp32_reassoc: all 2 arrays bitwise equal; no plot." in index.read_text()
    assert not list(tmp_path.glob("*.png"))


def test_a_session_of_one_comparison_writes_what_the_writers_write_of_it(tmp_path: Path) -> None:
    from parity.report import ReportSession

    comparison, _, _ = _comparison()
    header = {"actual": "a.h5", "golden": "g.h5"}
    session = ReportSession.whole(comparison, header)
    assert session.table() == format_table(comparison, header=header)
    session.write_json(tmp_path / "s.json", session.to_json())
    write_json(tmp_path / "w.json", comparison, header=header)
    assert (tmp_path / "s.json").read_bytes() == (tmp_path / "w.json").read_bytes()
    session.write_folder(tmp_path / "s", title="t")
    write_html(tmp_path / "w", comparison, header=header, title="t")
    folder = tmp_path / "s"
    assert (folder / "report.json").read_bytes() == (tmp_path / "w.json").read_bytes()
    assert (folder / "index.html").read_bytes() == (tmp_path / "w" / "index.html").read_bytes()
    assert (tmp_path / "s" / "report.txt").read_text() == format_table(
        comparison, header=header
    ) + "\n"


def test_a_missing_key_is_counted_as_missing_never_the_worst_of_a_figure_it_lacks() -> None:
    # Issue 60: the table named a missing key as `worst key` beside another key's max abs.
    from parity.report._summary import class_row, summarize

    expected = {
        "blocks.0.w": np.zeros(3, np.float32),
        "blocks.1.w": np.zeros(3, np.float32),
        "head": np.zeros(2, np.float32),
    }
    actual = {
        "blocks.0.w": np.zeros(3, np.float32),
        "head": np.array([0.0, 3e-8], np.float32),
        "blocks.w": np.zeros((2, 3), np.float32),
    }
    comparison = compare_trees(actual, expected, "fp32_reassoc")
    (row,) = summarize(comparison)
    assert (row.missing, row.unexpected, row.failed) == (1, 1, 2)
    assert row.worst_key == "head" and row.max_abs == np.float32(3e-8)
    cells = dict(zip(("failed", "worst"), (class_row(row)[4], class_row(row)[-1]), strict=True))
    assert cells == {"failed": "2 (1 missing, 1 new)", "worst": "head"}
    assert json.loads(json.dumps(row.to_dict()))["missing"] == 1


def test_a_proofs_reason_shared_by_many_keys_is_said_once_with_the_count() -> None:
    """Issue 75: one operation with no rounding model keeps 22 keys from a proof; the table
    says its reason in full at the first key, with how many more share it, and names that
    key at the others, each still with its own figures."""
    from parity.judge._classes import REGISTRY
    from parity.judge._compare import compare_arrays
    from parity.origin._proof import Proof, settle

    a = np.arange(6, dtype=np.float32)
    findings = tuple(
        compare_arrays(f"k{i}", a + i + 1, a, REGISTRY["up_to_rounding"]) for i in range(4)
    )
    why = "mul at model.py:35 in layer_norm, computed on the base's values, equals no value"
    proofs = {f"k{i}": Proof(f"k{i}", False, why, rounding=True) for i in range(3)}
    proofs["k3"] = Proof("k3", False, "another reason", rounding=True)
    settled = settle(Comparison(findings), proofs)
    text = format_table(settled)
    lines = [ln for ln in text.splitlines() if ln.startswith("  k")]
    assert sum(why in ln for ln in lines) == 1, lines
    first = next(ln for ln in lines if why in ln)
    assert first.startswith("  k0 ") and first.endswith("(the same for 2 more keys)"), first
    for i in (1, 2):
        line = next(ln for ln in lines if ln.startswith(f"  k{i} "))
        assert line.endswith("; not proved, as k0") and "max |a-b|" in line, line
    assert any(ln.startswith("  k3 ") and "another reason" in ln for ln in lines)
