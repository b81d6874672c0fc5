"""pytest plugin for parity, registered through the `pytest11` entry point.

Options:

Defaults come from `[tool.parity]` in the nearest `pyproject.toml` (`parity.run.config`:
`goldens`, `isa`, `devices`), so in an adopting project `parity_check(actual, "group")`
works with no options; the options below override it. Where that table exists, its `src`
roots go to the front of `sys.path` before conftests and test modules are imported (as
`parity check` runs the producers), so tests import the project's package uninstalled.

- `--parity-devices N` (env `PARITY_DEVICES`): simulated CPU device count, set before jax
  starts (a clear error if it already started with another count); per process with
  `--parity-processes`.
- `--parity-processes N`: run the session as N processes of one JAX distributed run
  (`parity.run.processes`): this pytest starts N copies of itself (without xdist), each joins
  the run before jax starts, the tests run SPMD over the global mesh, each check gathers
  its arrays to every process, compares and takes process 0's verdict; process 0's output
  is shown and it alone writes the report. A worker that crashes, is killed or outlives
  `--parity-timeout S` (default 3600) ends the session with exit 2 naming it.
- `--parity-isa CAP`: the XLA CPU ISA cap set before jax starts (default `[tool.parity]`
  isa, else AVX2; `none`).
- `--parity-cache DIR` (env `PARITY_JAX_CACHE`): jax's persistent compilation cache folder;
  each xdist worker gets its own subfolder. `none` disables it. Default `.jax_cache` in
  the rootdir, which ignores itself for git (its own `.gitignore`, as `.pytest_cache`).
- `--parity-goldens DIR`: the golden folder (default `[tool.parity]` goldens, else ini
  `parity_goldens`, else `goldens`).
- `--parity-report DIR`: write the session's comparisons as a text table, JSON and HTML.
- `--parity-drift {warn,relax,strict}`: what environment drift does to bitwise classes
  (see `parity.store.provenance`).
- `--parity-unchecked {ignore,warn,fail}`: list golden keys that no test checked;
  `fail` makes the session fail if there are any. Judged against what was selected: keys
  of every group some check opened, and whole groups no check opened only when the run
  was not narrowed (no `-k`, `-m`, `--deselect`, `--lf`, or node ids).
- `--parity-save-actual DIR`: when a check fails, write what was produced to
  `DIR/<check>.h5` in golden format; the failure message gives the `parity diff` command
  that reproduces its table.

Fixtures:

- `parity_goldens`: the golden folder (`parity.check.GoldenDir`); files open lazily,
  read-only, once per process (safe under pytest-xdist: every worker opens its own).
- `parity_check`: compare arrays against a golden group or a live reference
  (`parity.check.check_group` / `check_live`), record the result for the session report,
  fail with the table.

The hooks stay thin: class resolution, the drift policy and comparison live in
`parity.check`; the report in `parity.report`. Results cross from xdist workers to the
controller as `parity.check.CheckResult` dicts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from parity.run.config import ConfigError, ParityConfig, load_config
from parity.run.devices import (
    DEFAULT_ISA_CAP,
    DeviceCountError,
    cap_isa,
    set_cpu_device_count,
)
from parity.run.processes import worker_place

#: The default of `--parity-timeout`: a whole session, not one producer run.
SESSION_TIMEOUT_S = 3600.0

if TYPE_CHECKING:  # parity.check loads h5py: imported only when a check runs
    from parity.check import CheckResult, GoldenDir
    from parity.report import ReportSession

_RESULTS = pytest.StashKey[list["CheckResult"]]()
_GOLDENS = pytest.StashKey["GoldenDir"]()
_NARROWED = pytest.StashKey[bool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("parity", "differential equivalence testing")
    group.addoption(
        "--parity-devices",
        type=int,
        default=None,
        help="simulated CPU device count, set before jax starts (env PARITY_DEVICES)",
    )
    group.addoption(
        "--parity-processes",
        type=int,
        default=None,
        help="run the session as N processes of one JAX distributed run, --parity-devices "
        "each; checks gather to process 0, which reports",
    )
    group.addoption(
        "--parity-timeout",
        type=float,
        default=SESSION_TIMEOUT_S,
        help="with --parity-processes: seconds the session may take before every worker is "
        f"stopped (default {SESSION_TIMEOUT_S:g})",
    )
    group.addoption(
        "--parity-isa",
        default=None,
        help="XLA CPU ISA cap (--xla_cpu_max_isa) set before jax starts, so bitwise goldens "
        "reproduce across hosts; 'none' leaves it alone (default: [tool.parity] isa, else "
        f"{DEFAULT_ISA_CAP})",
    )
    group.addoption(
        "--parity-cache",
        default=None,
        help="jax persistent compilation cache folder, per xdist worker; 'none' "
        "disables (env PARITY_JAX_CACHE; default .jax_cache under the rootdir)",
    )
    group.addoption(
        "--parity-goldens",
        default=None,
        help="golden folder (default: [tool.parity] goldens, else ini parity_goldens, else "
        "'goldens')",
    )
    group.addoption(
        "--parity-report",
        default=None,
        metavar="DIR",
        help="write the session's comparisons to DIR (report.txt, report.json, HTML)",
    )
    group.addoption(
        "--parity-drift",
        default="warn",
        choices=("warn", "relax", "strict"),
        help="what environment drift does to bitwise classes (default warn)",
    )
    group.addoption(
        "--parity-unchecked",
        default="warn",
        choices=("ignore", "warn", "fail"),
        help="golden keys no test checked: ignore, list them, or fail the session "
        "(judged against the selected tests)",
    )
    group.addoption(
        "--parity-save-actual",
        default=None,
        metavar="DIR",
        help="when a check fails, write what was produced to DIR/<check>.h5 (golden format)",
    )
    parser.addini("parity_goldens", "golden folder, relative to the rootdir", default="goldens")


def _device_count(config: pytest.Config) -> int | None:
    value = config.getoption("--parity-devices")
    if value is None and os.environ.get("PARITY_DEVICES"):
        raw = os.environ["PARITY_DEVICES"]
        try:
            value = int(raw)
        except ValueError:
            raise pytest.UsageError(f"PARITY_DEVICES must be an integer, got {raw!r}") from None
    return value


def _enable_compile_cache(config: pytest.Config) -> None:
    raw = config.getoption("--parity-cache") or os.environ.get("PARITY_JAX_CACHE")
    if raw is not None and raw.lower() == "none":
        return
    base = Path(raw) if raw else Path(config.rootpath) / ".jax_cache"
    place = worker_place()
    name = f"process{place[0]}" if place else os.environ.get("PYTEST_XDIST_WORKER", "main")
    folder = base / name
    folder.mkdir(parents=True, exist_ok=True)
    if not raw:
        _ignore_for_git(base)
    import jax

    jax.config.update("jax_compilation_cache_dir", str(folder))
    # Test programs compile in well under a second each; cache them all.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def _ignore_for_git(folder: Path) -> None:
    """Make `folder` ignore itself, as `.pytest_cache/` does, so the default cache in the
    user's project root shows in no `git status` and needs no `.gitignore` line."""
    try:
        with open(folder / ".gitignore", "x") as f:
            f.write("# the parity pytest plugin's jax compilation cache: never committed\n*\n")
    except FileExistsError:  # written before, or by another xdist worker just now
        pass


def _project_config(config: pytest.Config) -> ParityConfig:
    """`[tool.parity]` of the nearest pyproject.toml above the invocation folder."""
    try:
        return load_config(config.invocation_params.dir)
    except ConfigError as e:
        raise pytest.UsageError(str(e)) from None


_SRC_ROOTS = pytest.StashKey[list[str]]()


def _put_src_on_path(config: pytest.Config) -> None:
    """Put `[tool.parity]`'s src roots at the front of `sys.path`, as the producer runner
    does for `parity check`, so the tests import the user's package with no PYTHONPATH
    and no install. Only where a `[tool.parity]` table exists: elsewhere the plugin does
    not know the project's layout. Once per session; `pytest_unconfigure` takes them off.
    """
    import sys

    if _SRC_ROOTS in config.stash:
        return
    try:
        project = load_config(config.invocation_params.dir)
    except ConfigError:
        return  # pytest_configure reports it
    added = [str(p) for p in project.src] if project.table else []
    sys.path[:0] = added
    config.stash[_SRC_ROOTS] = added


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Before the conftests (and later the test modules) are imported: they may import the
    project's package."""
    _put_src_on_path(early_config)


def pytest_unconfigure(config: pytest.Config) -> None:
    import sys

    for root in config.stash.get(_SRC_ROOTS, []):
        if root in sys.path:
            sys.path.remove(root)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """With `--parity-processes N` (N > 1), this pytest runs no tests: it starts N copies of
    itself as the workers of one distributed run and ends with their verdict."""
    n = config.getoption("--parity-processes")
    if n is None or n <= 1 or worker_place() is not None:
        return None
    import sys

    from parity.run.processes import WorkerFailed, run_workers

    timeout = config.getoption("--parity-timeout")
    if timeout is None or timeout <= 0:
        raise pytest.UsageError(f"--parity-timeout must be positive, got {timeout}")
    argv = [sys.executable, "-m", "pytest", *config.invocation_params.args]
    if config.pluginmanager.hasplugin("xdist"):
        argv += ["-n", "0"]  # one jax process per worker; xdist would start more
    passed = (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED)
    try:
        codes = run_workers(
            argv,
            n,
            env=dict(os.environ),
            timeout=timeout,
            ok=lambda code: code in passed,
            echo=sys.stdout,
            cwd=config.invocation_params.dir,
        )
    except WorkerFailed as e:
        import tempfile

        with tempfile.NamedTemporaryFile(
            "w", prefix="parity-session-", suffix=".log", delete=False
        ) as log:
            log.write(e.output)
        print(f"parity: {e}\nparity: every process's output: {log.name}", file=sys.stderr)
        return pytest.ExitCode.INTERRUPTED
    if len(set(codes)) > 1:
        print(
            f"parity: the processes ended with different statuses {codes} (by process id): a "
            "test outside parity_check failed on some processes only; process 0's output is "
            "above, run with --parity-processes 1 to see the others'",
            file=sys.stderr,
            flush=True,
        )
    return max(codes)


def pytest_configure(config: pytest.Config) -> None:
    project = _project_config(config)
    # Loaded through a conftest's pytest_plugins, the plugin missed the early hook.
    _put_src_on_path(config)
    n = _device_count(config)
    if n is None and "devices" in project.explicit:
        n = project.devices
    raw_isa = config.getoption("--parity-isa")
    isa = project.isa if raw_isa is None else (None if raw_isa.lower() == "none" else raw_isa)
    if n is not None:
        if n < 1:
            raise pytest.UsageError(f"--parity-devices must be at least 1, got {n}")
        try:
            set_cpu_device_count(n, isa_cap=isa)
        except DeviceCountError as e:
            raise pytest.UsageError(str(e)) from None
    if isa is not None:
        cap_isa(isa)
    # Before the runtime: joining a multi-process run starts jax's backends.
    _enable_compile_cache(config)
    place = worker_place()
    if place is not None:
        from parity.run.processes import initialize

        initialize(place[2], place[1], place[0])
    config.stash[_RESULTS] = []
    config.stash[_NARROWED] = any("::" in str(a) for a in config.args)
    from parity.check import GoldenDir

    raw = config.getoption("--parity-goldens")
    if raw is None and "goldens" in project.explicit:
        path = project.goldens
    else:
        path = Path(raw or config.getini("parity_goldens"))
    config.stash[_GOLDENS] = GoldenDir(path if path.is_absolute() else config.rootpath / path)


def pytest_deselected(items: Sequence[pytest.Item]) -> None:
    """`-k`, `-m`, `--deselect`, `--lf` narrowed the run: unopened groups are not judged."""
    if items:
        items[0].config.stash[_NARROWED] = True


@pytest.fixture(scope="session")
def parity_goldens(pytestconfig: pytest.Config) -> GoldenDir:
    """The golden folder (`--parity-goldens`), files opened lazily and read-only."""
    return pytestconfig.stash[_GOLDENS]


@dataclass
class _Check:
    config: pytest.Config
    node: str

    def __call__(
        self,
        actual: Any,
        golden: Any,
        *,
        name: str | None = None,
        class_map: Any = None,
        class_overrides: Sequence[tuple[str, str]] = (),
        order: Sequence[str] | Callable[[str], Any] | None = None,
        produce_s: float | None = None,
        fail: bool = True,
        provenance: Mapping[str, Any] | None = None,
    ) -> Any:
        """Compare `actual` against a golden group (by name) or a live reference.

        **Arguments:**

        - `actual`: a pytree of arrays from the code under test (`{key: array}`, nested
          containers, equinox modules).
        - `golden`: a golden group name, or a pytree from a live reference (then
          `class_map` defaults to `bitwise`).
        - `name`: the check's name in the report (default: the group name or test id).
        - `class_map`: a `ClassMap` or a single class name, before the pinned map in the
          precedence of `parity.check`.
        - `class_overrides`: `(pattern, class)` rules tried first, e.g.
          `[("traj.*", "device_count")]` on 4 devices.
        - `order`: forward order (default: the golden file's pinned order).
        - `produce_s`: seconds the caller spent producing `actual`, for the timing summary.
        - `fail`: fail the test (with the report table) when the comparison fails.
        - `provenance`: the environment `actual` was produced in, when that was another
          process (`parity.run.runner.produce`'s `Produced.provenance[group]`); default this
          one's. A golden check judges environment drift and calibrated layouts by it.

        **Returns:** the `parity.judge.compare.Comparison`.
        """
        from parity.check import CheckError, check_group, check_live
        from parity.report import format_table

        config = self.config
        save = config.getoption("--parity-save-actual")
        save = None if save is None else Path(config.invocation_params.dir, save).resolve()
        place = worker_place()
        if place is not None:
            # Arrays sharded over processes come to every process's host (in the same
            # order everywhere: a collective); process 0 alone saves what failed.
            from parity.check import BARE_KEY
            from parity.judge.trees import flatten
            from parity.run.processes import to_host

            live = not isinstance(golden, str)
            actual = flatten(actual, to_array=to_host, bare=BARE_KEY if live else None)
            if live:
                golden = flatten(golden, to_array=to_host, bare=BARE_KEY)
            save = save if place[0] == 0 else None
        problem = None
        result: CheckResult | None = None
        try:
            if isinstance(golden, str):
                result = check_group(
                    actual,
                    golden,
                    goldens=config.stash[_GOLDENS],
                    class_map=class_map,
                    overrides=class_overrides,
                    order=order,
                    drift_mode=config.getoption("--parity-drift") or "warn",
                    name=name,
                    node=self.node,
                    produce_s=produce_s,
                    save_actual=save,
                    current_provenance=provenance,
                )
            else:
                result = check_live(
                    actual,
                    golden,
                    class_map="bitwise" if class_map is None else class_map,
                    overrides=class_overrides,
                    order=order,
                    name=name or self.node,
                    node=self.node,
                    produce_s=produce_s,
                    save_actual=save,
                )
        except CheckError as e:
            # Failed outside the except clause: inside it pytest also prints "During
            # handling of the above exception".
            problem = str(e)
        if place is not None:
            result = self._agree(result, problem, place[0])
        if problem is not None or result is None:
            pytest.fail(problem or "parity check produced no result", pytrace=False)
        if place is None or place[0] == 0:  # one report: process 0's
            config.stash[_RESULTS].append(result)
        if fail and not result.passed:
            text = f"parity check {result.name!r} failed\n"
            text += format_table(result.comparison, header=result.header)
            if result.saved:
                text += f"obtained arrays written to {result.saved}; reproduce with:\n"
                text += f"  {result.command}\n"
            pytest.fail(text, pytrace=False)
        return result.comparison

    @staticmethod
    def _agree(result: CheckResult | None, problem: str | None, process: int) -> CheckResult | None:
        """Every process takes process 0's verdict; a process whose own arrays judge
        otherwise fails, saying so (its values differ from process 0's)."""
        from parity.run.processes import agree

        mine = result is not None and problem is None and result.passed
        verdict = agree(mine)
        if result is None or mine == verdict:
            return result
        pytest.fail(
            f"parity check {result.name!r}: process {process} judges it "
            f"{'passing' if mine else 'failing'}, process 0 "
            f"{'passing' if verdict else 'failing'}: the processes hold different arrays "
            "for it (a value made per process); compare with --parity-processes 1",
            pytrace=False,
        )


@pytest.fixture
def parity_check(request: pytest.FixtureRequest) -> _Check:
    """Compare arrays against goldens or a live reference; see `_Check.__call__`."""
    return _Check(request.config, request.node.nodeid)


# --------------------------------------------------------------------------- session end


@dataclass(frozen=True)
class _Summary:
    """What the session's checks add up to, worked out once on the controller."""

    session: ReportSession  # the checks in the order they ran, merged once
    unchecked: dict[str, list[str]]


_SUMMARY = pytest.StashKey[_Summary]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    config.stash[_GOLDENS].close()
    workeroutput = getattr(config, "workeroutput", None)
    from parity.check import results_to_json

    if workeroutput is not None:  # an xdist worker: hand the results to the controller
        workeroutput["parity_results"] = results_to_json(config.stash[_RESULTS])
        workeroutput["parity_narrowed"] = config.stash[_NARROWED]
        return
    place = worker_place()
    if place is not None and place[0] != 0:
        return  # process 0 reports for the run
    results = sorted(config.stash[_RESULTS], key=lambda r: r.started)
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
    from parity.check import results_from_json

    output = getattr(node, "workeroutput", {})
    raw = output.get("parity_results")
    if raw:
        node.config.stash[_RESULTS].extend(results_from_json(raw))
    if output.get("parity_narrowed"):
        node.config.stash[_NARROWED] = True


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
    goldens = config.stash[_GOLDENS]
    judged = goldens.groups() if not config.stash[_NARROWED] else sorted(checked)
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
    from parity.store.provenance import collect_provenance

    prov = collect_provenance()
    header = {
        "checks": str(len(results)),
        "devices": str(prov["device_count"]),
        "layout": _layout(),
        "xla_flags": prov["xla_flags"],
        "jax": str(prov["jax"]),
    }
    from parity.check import merged_header_lines

    return header | merged_header_lines(results, header)


def _layout() -> str:
    """Processes x devices per process, as jax sees them (jax runs by the time a session
    that made checks ends)."""
    import jax

    from parity.run.processes import Layout

    return str(Layout(jax.process_count(), jax.local_device_count()))


def _timing(results: Sequence[CheckResult]) -> dict[str, float]:
    return {
        phase: round(sum(getattr(r, phase) or 0.0 for r in results), 3)
        for phase in ("produce_s", "load_s", "compare_s")
    }


def _write_report(out: Path, summary: _Summary) -> None:
    from parity.report.session import CHECK_FIELDS

    t0 = time.perf_counter()

    def complete(doc: dict[str, Any]) -> None:
        timing = _timing(summary.session.results)
        timing["report_s"] = round(time.perf_counter() - t0, 3)
        doc["timing"] = timing
        doc["unchecked"] = summary.unchecked

    summary.session.write_folder(out, fields=("node", *CHECK_FIELDS), complete=complete)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if getattr(config, "workeroutput", None) is not None:
        return
    summary = config.stash.get(_SUMMARY, None)
    if summary is None:
        return
    tr = terminalreporter
    tr.section("parity")
    results, merged = summary.session.results, summary.session.merged
    # The per-class table and each failing check's first divergence; every failing key was
    # already printed by its test, so keep the summary short.
    for line in summary.session.table(failing_checks_only=True, failures=False).splitlines():
        tr.write_line(line)
    t = _timing(results)
    tr.write_line(
        f"{len(results)} checks, {len(merged.findings)} arrays; produce {t['produce_s']:.1f}s, "
        f"load {t['load_s']:.1f}s, compare {t['compare_s']:.1f}s"
    )
    unchecked = summary.unchecked
    mode = config.getoption("--parity-unchecked")
    if unchecked and mode != "ignore":
        n = sum(len(v) for v in unchecked.values())
        tr.write_line(f"{n} golden key(s) no test checked ({mode}):")
        for group, keys in unchecked.items():
            shown = ", ".join(keys[:5]) + (" ..." if len(keys) > 5 else "")
            tr.write_line(f"  {group}: {len(keys)}: {shown}")
    out = config.getoption("--parity-report")
    if out:
        tr.write_line(f"report written to {out} (report.txt, report.json, index.html)")
