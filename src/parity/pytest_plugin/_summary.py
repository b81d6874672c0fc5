"""The end of a session: results gathered from xdist workers, the one report
(`parity.report.ReportSession`), golden keys no test checked, the terminal summary."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from parity.judge._floats import count
from parity.machinery import _compile_count as compile_count
from parity.machinery._worker import worker_place
from parity.pytest_plugin._stash import GOLDENS, NARROWED, RESULTS

if TYPE_CHECKING:  # parity.check loads h5py: imported only when a check runs
    from parity._results import CheckResult
    from parity.report import ReportSession


@dataclass(frozen=True)
class _Summary:
    """What the session's checks add up to, worked out once on the controller."""

    session: ReportSession  # the checks in the order they ran, merged once
    unchecked: dict[str, list[str]]


_SUMMARY = pytest.StashKey[_Summary]()
#: The compile figures the xdist workers handed back, summed.
_WORKER_COMPILES = pytest.StashKey[compile_count.Counts]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    config.stash[GOLDENS].close()
    compile_count.flush()
    workeroutput = getattr(config, "workeroutput", None)
    from parity._results import results_to_json

    if workeroutput is not None:  # an xdist worker: hand the results to the controller
        workeroutput["parity_compiles"] = dataclasses.asdict(compile_count.counts())
        workeroutput["parity_results"] = results_to_json(config.stash[RESULTS])
        workeroutput["parity_narrowed"] = config.stash[NARROWED]
        return
    place = worker_place()
    if place is not None and place.process_id != 0:
        return  # process 0 reports for the run
    results = sorted(config.stash[RESULTS], key=lambda r: r.started)
    if not results:
        return
    # Runs before the terminal summary (pytest's reporter prints after the other
    # sessionfinish hooks), which reads this instead of merging and scanning again.
    from parity.report import ReportSession

    summary = _Summary(ReportSession.of(results, _header(results)), _unchecked(config, results))
    config.stash[_SUMMARY] = summary
    mode = config.getoption("--parity-unchecked")
    if summary.unchecked and mode == "fail" and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    out = config.getoption("--parity-report")
    if out:
        _write_report(Path(out), summary)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: collect the results a worker made."""
    from parity._results import results_from_json

    output = getattr(node, "workeroutput", {})
    if "parity_compiles" in output:
        workers = node.config.stash.get(_WORKER_COMPILES, compile_count.Counts(0, 0, 0))
        node.config.stash[_WORKER_COMPILES] = workers + compile_count.Counts(
            **output["parity_compiles"]
        )
    raw = output.get("parity_results")
    if raw:
        node.config.stash[RESULTS].extend(results_from_json(raw))
    if output.get("parity_narrowed"):
        node.config.stash[NARROWED] = True


def _unchecked(config: pytest.Config, results: list[CheckResult]) -> dict[str, list[str]]:
    """Golden keys (by group) that no check covered, judged against what was selected:
    every group some check opened, and, when the run was not narrowed, every other group
    of the folder too (as a whole)."""
    if config.getoption("--parity-unchecked") == "ignore":
        return {}
    from parity.store import GoldenStoreError, open_goldens

    checked: dict[str, set[str]] = {}
    for r in results:
        if r.group:
            checked.setdefault(r.group, set()).update(r.checked_keys)
    goldens = config.stash[GOLDENS]
    judged = goldens.groups() if not config.stash[NARROWED] else sorted(checked)
    out: dict[str, list[str]] = {}
    for group in judged:
        try:
            with open_goldens(goldens.path_of(group)) as gf:
                keys = set(gf.keys())
        except GoldenStoreError:
            continue
        missing = sorted(keys - checked.get(group, set()))
        if missing:
            out[group] = missing
    return out


def _header(results: list[CheckResult]) -> dict[str, str]:
    from parity.store._provenance import collect_provenance

    prov = collect_provenance()
    header = {
        "checks": str(len(results)),
        "devices": str(prov.device_count),
        "layout": _layout(),
        "xla_flags": prov.xla_flags or "",
        "jax": str(prov.jax),
    }
    from parity._results import merged_header_lines

    return header | merged_header_lines(results, header)


def _layout() -> str:
    """Processes x devices per process, as jax sees them (jax runs by the time a session
    that made checks ends)."""
    import jax

    from parity.machinery._processes import Layout

    return str(Layout(jax.process_count(), jax.local_device_count()))


def _timing(results: Sequence[CheckResult]) -> dict[str, float]:
    return {
        phase: round(sum(getattr(r, phase) or 0.0 for r in results), 3)
        for phase in ("produce_s", "load_s", "compare_s")
    }


def _write_report(out: Path, summary: _Summary) -> None:
    from parity.report._session import CHECK_FIELDS

    t0 = time.perf_counter()

    def complete(doc: dict[str, Any]) -> None:
        timing = _timing(summary.session.results)
        timing["report_s"] = round(time.perf_counter() - t0, 3)
        doc["timing"] = timing
        doc["unchecked"] = summary.unchecked

    summary.session.write_folder(out, fields=("node", *CHECK_FIELDS), complete=complete)


def _compiles(config: pytest.Config) -> compile_count.Counts:
    """This session's compiles: the xdist workers', else this process's own."""
    return config.stash.get(_WORKER_COMPILES, None) or compile_count.counts()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if getattr(config, "workeroutput", None) is not None:
        return
    summary = config.stash.get(_SUMMARY, None)
    tr = terminalreporter
    if summary is None:  # no check ran: the compile count alone, on one line
        tr.write_line(f"parity: {_compiles(config).line()}")
        return
    tr.section("parity")
    tr.write_line(_compiles(config).line())
    results, merged = summary.session.results, summary.session.merged
    # The per-class table and each failing check's first divergence; every failing key was
    # already printed by its test, so keep the summary short.
    for line in summary.session.table(failing_checks_only=True, failures=False).splitlines():
        tr.write_line(line)
    t = _timing(results)
    tr.write_line(
        f"{count(len(results), 'check')}, {count(len(merged.findings), 'array')}; "
        f"produce {t['produce_s']:.1f}s, "
        f"load {t['load_s']:.1f}s, compare {t['compare_s']:.1f}s"
    )
    unchecked = summary.unchecked
    mode = config.getoption("--parity-unchecked")
    if unchecked and mode != "ignore":
        n = sum(len(v) for v in unchecked.values())
        tr.write_line(f"{count(n, 'golden key')} no test checked ({mode}):")
        for group, keys in unchecked.items():
            shown = ", ".join(keys[:5]) + (" ..." if len(keys) > 5 else "")
            tr.write_line(f"  {group}: {len(keys)}: {shown}")
    out = config.getoption("--parity-report")
    if out:
        tr.write_line(f"report written to {out} (report.txt, report.json, index.html)")
