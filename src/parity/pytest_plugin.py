"""pytest plugin for parity, registered through the `pytest11` entry point.

Options:

- `--parity-devices N` (env `PARITY_DEVICES`): simulated CPU device count, set before jax
  starts (a clear error if it already started with another count).
- `--parity-isa CAP`: the XLA CPU ISA cap set before jax starts (default AVX2; `none`).
- `--parity-cache DIR` (env `PARITY_JAX_CACHE`): jax's persistent compilation cache folder;
  each xdist worker gets its own subfolder. `none` disables it. Default `.jax_cache`.
- `--parity-goldens DIR` (ini `parity_goldens`): the golden folder, default `goldens`.
- `--parity-report DIR`: write the session's comparisons as a text table, JSON and HTML.
- `--parity-drift {warn,relax,strict}`: what environment drift does to bitwise classes
  (see `parity.provenance`).
- `--parity-unchecked {ignore,warn,fail}`: list golden keys that no test checked;
  `fail` makes the session fail if there are any.

Fixtures:

- `parity_goldens`: the golden folder; files open lazily, read-only, once per process
  (safe under pytest-xdist: every worker opens its own read-only handle).
- `parity_check`: compare arrays against a golden group or a live reference under the
  tolerance classes, record the comparison for the session report, fail with the table.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from parity.devices import (
    DEFAULT_ISA_CAP,
    DeviceCountError,
    cap_isa,
    set_cpu_device_count,
)

_RECORDS = pytest.StashKey[list[dict[str, Any]]]()
_GOLDENS = pytest.StashKey["GoldenDir"]()
_REPIN_HINT = "python tools/repin_goldens.py --base <SHA>"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("parity", "differential equivalence testing")
    group.addoption(
        "--parity-devices",
        type=int,
        default=None,
        help="simulated CPU device count, set before jax starts (env PARITY_DEVICES)",
    )
    group.addoption(
        "--parity-isa",
        default=DEFAULT_ISA_CAP,
        help="XLA CPU ISA cap (--xla_cpu_max_isa) set before jax starts, so bitwise goldens "
        f"reproduce across hosts; 'none' leaves it alone (default {DEFAULT_ISA_CAP})",
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
        help="golden folder (default: ini parity_goldens, else 'goldens')",
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
        help="golden keys no test checked: ignore, list them, or fail the session",
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
    folder = base / os.environ.get("PYTEST_XDIST_WORKER", "main")
    folder.mkdir(parents=True, exist_ok=True)
    import jax

    jax.config.update("jax_compilation_cache_dir", str(folder))
    # Test programs compile in well under a second each; cache them all.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_configure(config: pytest.Config) -> None:
    n = _device_count(config)
    raw_isa = config.getoption("--parity-isa")
    isa = None if raw_isa is None or raw_isa.lower() == "none" else raw_isa
    if n is not None:
        if n < 1:
            raise pytest.UsageError(f"--parity-devices must be at least 1, got {n}")
        try:
            set_cpu_device_count(n, isa_cap=isa)
        except DeviceCountError as e:
            raise pytest.UsageError(str(e)) from None
    if isa is not None:
        cap_isa(isa)
    _enable_compile_cache(config)
    config.stash[_RECORDS] = []
    raw = config.getoption("--parity-goldens") or config.getini("parity_goldens")
    path = Path(raw)
    config.stash[_GOLDENS] = GoldenDir(path if path.is_absolute() else config.rootpath / path)


# --------------------------------------------------------------------------- goldens


class GoldenDir:
    """A folder of golden files, `<group>.h5`, opened lazily and read-only."""

    def __init__(self, path: Path):
        self.path = path
        self._open: dict[str, Any] = {}

    def path_of(self, group: str) -> Path:
        return self.path / f"{group}.h5"

    def groups(self) -> list[str]:
        """Every golden group in the folder."""
        return sorted(p.stem for p in self.path.glob("*.h5")) if self.path.is_dir() else []

    def open(self, group: str) -> Any:
        """The `parity.store.GoldenFile` of `group`; fails the test with the repin command
        if it is missing or unusable."""
        from parity.store import GoldenMissingError, GoldenStoreError, open_goldens

        if group not in self._open:
            # Fail outside the except clauses: inside them pytest prints the store's error
            # and "During handling of the above exception" before the message.
            problem = None
            try:
                self._open[group] = open_goldens(self.path_of(group))
            except GoldenMissingError:
                problem = (
                    f"no golden file for group {group!r} at {self.path_of(group)}: pin it with "
                    f"{_REPIN_HINT}"
                )
            except GoldenStoreError as e:
                problem = f"golden group {group!r} is unusable: {e}"
            if problem is not None:
                pytest.fail(problem, pytrace=False)
        return self._open[group]

    def load(self, group: str, gf: Any) -> dict[str, Any]:
        """Every array of `group`'s open file, checksums verified; a damaged file fails the
        test with the store's one-line message (a corrupt golden is an input error, not a
        crash of the check)."""
        from parity.store import GoldenStoreError

        problem = None
        try:
            return gf.load_all()
        except GoldenStoreError as e:
            problem = f"golden group {group!r} is unusable: {e}"
        pytest.fail(problem, pytrace=False)

    def close(self) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()


@pytest.fixture(scope="session")
def parity_goldens(pytestconfig: pytest.Config) -> GoldenDir:
    """The golden folder (`--parity-goldens`), files opened lazily and read-only."""
    return pytestconfig.stash[_GOLDENS]


@dataclass
class _Check:
    config: pytest.Config
    node: str
    records: list[dict[str, Any]] = field(default_factory=list)

    def __call__(
        self,
        actual: Mapping[str, Any],
        golden: str | Mapping[str, Any],
        *,
        name: str | None = None,
        class_map: Any = None,
        class_overrides: Sequence[tuple[str, str]] = (),
        order: Sequence[str] | Callable[[str], Any] | None = None,
        produce_s: float | None = None,
        fail: bool = True,
    ) -> Any:
        """Compare `actual` against a golden group (by name) or a live reference mapping.

        **Arguments:**

        - `actual`: `{key: array}` from the code under test.
        - `golden`: a golden group name (its file's pinned class map and order are used),
          or `{key: array}` from a live reference (then `class_map` is required).
        - `name`: the check's name in the report (default: the group name or test id).
        - `class_map`: a `ClassMap` or a single class name; overrides the pinned map.
        - `class_overrides`: `(pattern, class)` rules tried before the map, e.g.
          `[("traj.*", "device_count")]` on 4 devices.
        - `order`: forward order (default: the golden file's pinned order).
        - `produce_s`: seconds the caller spent producing `actual`, for the timing summary.
        - `fail`: fail the test (with the report table) when the comparison fails.

        **Returns:** the `parity.compare.Comparison`.
        """
        from parity.compare import compare_trees
        from parity.provenance import bitwise_policy, collect_provenance, drift
        from parity.report import format_table
        from parity.tolerance import REGISTRY, ClassMap, ToleranceClass

        t0 = time.perf_counter()
        header: dict[str, str] = {}
        registry: dict[str, ToleranceClass] = dict(REGISTRY)
        group = golden if isinstance(golden, str) else None
        if group is not None:
            gf = self.config.stash[_GOLDENS].open(group)
            golden_arrays = self.config.stash[_GOLDENS].load(group, gf)
            pinned = ClassMap.from_json(gf.class_map_json) if gf.class_map_json else None
            class_map = class_map if class_map is not None else pinned
            if order is None:
                order = gf.ordered_keys()
            decision = bitwise_policy(
                drift(gf.provenance, collect_provenance()),
                self.config.getoption("--parity-drift") or "warn",
            )
            header.update({f"drift {i}": line for i, line in enumerate(decision.header)})
            if decision.error:
                pytest.fail("\n".join(decision.header), pytrace=False)
            if decision.bitwise_max_ulp is not None:
                registry["bitwise"] = ToleranceClass(
                    name="bitwise",
                    rule="ulp",
                    max_ulp=decision.bitwise_max_ulp,
                    meaning="bitwise, relaxed to ulp by the drift policy",
                )
            header["golden"] = str(self.config.stash[_GOLDENS].path_of(group))
            header["base_sha"] = str(gf.provenance.get("base_sha"))
        else:
            assert not isinstance(golden, str)
            golden_arrays = {k: golden[k] for k in golden}
            if class_map is None:
                raise ValueError("a live comparison needs class_map (a ClassMap or class name)")
        if class_overrides:
            base = ClassMap(default=class_map) if isinstance(class_map, str) else class_map
            rules = tuple(class_overrides) + (base.rules if base is not None else ())
            class_map = ClassMap(rules=rules, default=base.default if base is not None else None)
        if class_map is None:
            raise ValueError(f"golden group {group!r} pins no class map; pass class_map")
        load_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        comparison = compare_trees(actual, golden_arrays, class_map, registry=registry, order=order)
        compare_s = time.perf_counter() - t1
        check_name = name or group or self.node
        self.config.stash[_RECORDS].append(
            {
                "name": check_name,
                "node": self.node,
                "group": group,
                "header": header,
                "comparison": comparison.to_dict(),
                "checked_keys": sorted(golden_arrays) if group is not None else [],
                "produce_s": produce_s,
                "load_s": load_s,
                "compare_s": compare_s,
            }
        )
        if fail and not comparison.passed:
            pytest.fail(
                f"parity check {check_name!r} failed\n" + format_table(comparison, header=header),
                pytrace=False,
            )
        return comparison


@pytest.fixture
def parity_check(request: pytest.FixtureRequest) -> _Check:
    """Compare arrays against goldens or a live reference; see `_Check.__call__`."""
    return _Check(request.config, request.node.nodeid)


# --------------------------------------------------------------------------- session end


@dataclass(frozen=True)
class _Summary:
    """What the session's checks add up to, worked out once on the controller."""

    records: list[dict[str, Any]]
    merged: Any  # parity.compare.Comparison
    header: dict[str, str]
    unchecked: dict[str, list[str]]


_SUMMARY = pytest.StashKey[_Summary]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    config.stash[_GOLDENS].close()
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the records to the controller
        workeroutput["parity_records"] = json.dumps(config.stash[_RECORDS])
        return
    records = config.stash[_RECORDS]
    if not records:
        return
    # Runs before the terminal summary (pytest's reporter prints after the other
    # sessionfinish hooks), which reads this instead of merging and scanning again.
    summary = _Summary(records, _merged(records), _header(records), _unchecked(config, records))
    config.stash[_SUMMARY] = summary
    mode = config.getoption("--parity-unchecked")
    if summary.unchecked and mode == "fail" and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    out = config.getoption("--parity-report")
    if out:
        _write_report(Path(out), summary)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: collect the records a worker made."""
    raw = getattr(node, "workeroutput", {}).get("parity_records")
    if raw:
        node.config.stash[_RECORDS].extend(json.loads(raw))


def _unchecked(config: pytest.Config, records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Golden keys (by group) that no check covered; only for groups any check opened,
    plus whole groups no check opened when the mode is `fail`."""
    if config.getoption("--parity-unchecked") == "ignore" or not records:
        return {}
    from parity.store import GoldenStoreError, open_goldens

    checked: dict[str, set[str]] = {}
    for r in records:
        if r["group"]:
            checked.setdefault(r["group"], set()).update(r["checked_keys"])
    goldens = config.stash[_GOLDENS]
    out: dict[str, list[str]] = {}
    for group in goldens.groups():
        try:
            with open_goldens(goldens.path_of(group)) as gf:
                keys = set(gf.keys())
        except GoldenStoreError:
            continue
        missing = sorted(keys - checked.get(group, set()))
        if missing:
            out[group] = missing
    return out


def _merged(records: list[dict[str, Any]]) -> Any:
    from parity.compare import Comparison, Finding

    findings = []
    for r in sorted(records, key=lambda r: r["name"]):
        for f in r["comparison"]["findings"]:
            finding = Finding.from_dict(f)
            if r["group"] is None:
                # Live checks reuse short keys ("logits"); name the check they belong to.
                finding = dataclasses.replace(finding, key=f"{r['name']}/{finding.key}")
            findings.append(finding)
    return Comparison(tuple(findings))


def _header(records: list[dict[str, Any]]) -> dict[str, str]:
    from parity.provenance import collect_provenance

    prov = collect_provenance()
    header = {
        "checks": str(len(records)),
        "devices": str(prov["device_count"]),
        "xla_flags": prov["xla_flags"],
        "jax": str(prov["jax"]),
    }
    for r in records:
        for k, v in r["header"].items():
            if k.startswith("drift") and v not in header.values():
                # Keep the line's own number: a check can have a "bits" and an "info" line.
                header[f"{k} ({r['name']})"] = v
    return header


def _timing(records: list[dict[str, Any]]) -> dict[str, float]:
    return {
        phase: round(sum(r[phase] or 0.0 for r in records), 3)
        for phase in ("produce_s", "load_s", "compare_s")
    }


def _write_report(out: Path, summary: _Summary) -> None:
    from parity.report import format_table, to_json, write_html

    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    records, merged, header = summary.records, summary.merged, summary.header
    (out / "report.txt").write_text(format_table(merged, header=header) + "\n")
    write_html(out, merged, header=header)
    timing = _timing(records)
    timing["report_s"] = round(time.perf_counter() - t0, 3)
    doc = to_json(merged, header=header)
    doc["checks"] = [
        {k: r[k] for k in ("name", "node", "group", "produce_s", "load_s", "compare_s")}
        | {
            "passed": all(f["verdict"] == "pass" for f in r["comparison"]["findings"]),
            "n_arrays": len(r["comparison"]["findings"]),
        }
        for r in records
    ]
    doc["timing"] = timing
    doc["unchecked"] = summary.unchecked
    (out / "report.json").write_text(json.dumps(doc, indent=1, sort_keys=True))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if getattr(config, "workeroutput", None) is not None:
        return
    summary = config.stash.get(_SUMMARY, None)
    if summary is None:
        return
    from parity.report import format_table

    tr = terminalreporter
    tr.section("parity")
    records, merged = summary.records, summary.merged
    table = format_table(merged, header=summary.header)
    # The per-class table and first divergence; every failing key was already printed by
    # its test, so keep the summary short.
    lines = table.splitlines()
    cut = next((i for i, line in enumerate(lines) if line.lower().startswith("fail")), len(lines))
    for line in lines[:cut]:
        tr.write_line(line)
    t = _timing(records)
    tr.write_line(
        f"{len(records)} checks, {len(merged.findings)} arrays; produce {t['produce_s']:.1f}s, "
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
