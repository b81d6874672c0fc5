"""The current tree checked against the goldens: what `parity check` does once its flags are
read (`TreeCheck`, `check_tree`, `CheckedTree`).

In order: the golden files the check will read are opened (a damaged one is refused before
the producers' seconds or minutes), the producers run on the tree in a fresh process
(`parity.run._produced.producing`, the process kept while the groups are checked where a
failure would be recorded in it), and every group is checked in one pass through the check's
door (`parity.run._produced.check_produced`), with what re-produces the baselines
(`parity.run._baseline.BaselineBuilder`) and what settles the failures op by op
(`parity.run._origins.FailureSettler`). The report is the face's: `CheckedTree.header` gives
its lines. Nothing here imports jax.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from parity._results import CheckResult, merged_header_lines
from parity.check import GoldenDir
from parity.judge._classes import REGISTRY
from parity.judge._dataflow import DATAFLOW
from parity.machinery._config import ParityConfig
from parity.machinery._worker import Place
from parity.run._baseline import BaselineBuilder
from parity.run._origins import FailureSettler
from parity.run._produced import Produced, check_produced, producing
from parity.run._recordings import ARRAYS, Record

__all__ = [
    "CheckedTree",
    "TreeCheck",
    "check_tree",
    "order_pinned",
    "verify_goldens",
]


@dataclass(frozen=True, kw_only=True)
class TreeCheck:
    """What a check of the current tree asks for, its flags read.

    **Fields:**

    - `config`: the project's settings (producers, src roots, layout, goldens, drift).
    - `groups`: the producer groups to check (default all).
    - `overrides`, `class_name`: before the pinned class map (`parity.check`'s precedence).
    - `baseline`: `"auto"` (re-produce a group at its golden's base commit where a key
      fails its pinned class off the pin's environment), `"require"` (as auto, and a
      baseline that cannot be re-produced is a `CheckError`) or `"off"`.
    - `origin`: name where a failure diverged (record its programs op by op), not only
      prove a key of class `op_by_op`.
    - `save_actual`: a folder for the actual arrays of failing groups.
    - `timeout`: the seconds each producer run may take.
    - `place`: on a cluster, this host's place in the run; None: every process runs here.
      A cluster's check has no baseline: one host cannot re-produce a multi-host run.
    """

    config: ParityConfig
    groups: Sequence[str] = ()
    overrides: Sequence[tuple[str, str]] = ()
    class_name: str | None = None
    baseline: str = "auto"
    origin: bool = True
    save_actual: Path | None = None
    timeout: float | None = None
    place: Place | None = None


@dataclass(frozen=True)
class CheckedTree:
    """What `check_tree` found.

    **Fields:** `request` (the `TreeCheck`), `produced` (the producers' run) and `results`
    (one `CheckResult` per group, in group order; none on a host other than process 0's,
    whose part ends with its run).
    """

    request: TreeCheck
    produced: Produced
    results: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def header(self) -> dict[str, str]:
        """The lines a report of the check opens with: the run's (goldens, producers, src
        roots, layout, XLA flags, the producers' seconds), each check's own beside them
        (`merged_header_lines`), and the base commit the first baseline was made at."""
        config, produced = self.request.config, self.produced
        where = "a fresh process" if produced.layout.processes == 1 else "fresh processes"
        header = {
            "goldens": str(config.goldens),
            "producers": str(config.producers),
            "src": ", ".join(str(s) for s in config.src),
            "layout": str(produced.layout),
            "xla_flags": produced.xla_flags,
            "produce": f"{produced.seconds:.1f}s in {where}",
        }
        recorder = produced.recorder_line()
        if recorder:
            header["recorder"] = recorder
        header |= merged_header_lines(self.results, header)
        base = next((r.header.base_sha for r in self.results if r.header.base_sha), None)
        return header if base is None else header | {"base_sha": base}


def verify_goldens(goldens: GoldenDir, groups: Sequence[str]) -> None:
    """Open each golden file a check will read (`groups`, else every one in the folder):
    header, index, class map and provenance, what `parity show` reads, before the
    producers run, so a truncated or damaged file is a `CheckError` at once, not after the
    producers' seconds or minutes. A group without a file is left to the check (it names
    the repin command). The files stay open in `goldens` for the check."""
    for group in groups or goldens.groups():
        if goldens.path_of(group).is_file():
            goldens.open(group)


def order_pinned(goldens: GoldenDir, groups: Sequence[str]) -> bool:
    """Whether every golden file the check reads (`groups`, else every one in the folder)
    pins a forward order read from the programs that computed it: the check then needs no
    order of its own producer run, and the recorder's hooks stay out of jax."""
    wanted = list(groups) or goldens.groups()
    for group in wanted:
        if not goldens.path_of(group).is_file():
            return False
        if goldens.open(group).provenance.order != DATAFLOW:
            return False
    return bool(wanted)


def _rounds(goldens: GoldenDir, classes: Iterable[str], groups: Sequence[str] = ()) -> bool:
    """Whether a key a check reads may be proved up to rounding: one of the check's own
    `classes` (its `--class`, its overrides') or one pinned in a golden file of `groups`
    (default: every group) has a rule that rounds (`Rule.rounds`); its base is then recorded
    with every value's numbers, in the one run that re-produces it."""
    names = set(classes)
    for group in groups or goldens.groups():
        if goldens.path_of(group).is_file():
            gf = goldens.open(group)
            names |= {gf.info(k).class_name for k in gf}
    return any(REGISTRY[n].rule.rounds for n in names if n in REGISTRY)


def check_tree(request: TreeCheck, *, progress: Callable[[str], None]) -> CheckedTree:
    """Check the current tree as `request` asks: its goldens verified, its producers run
    (the class map's names refused as a repin refuses them), every group checked in one
    pass, the failures settled op by op.

    **Returns:** a `CheckedTree`. Raises `parity.machinery._launcher.ProducerRunError` (its
    `UnknownGroupsError`, `UnusableClassError`) where the producers cannot run, and
    `CheckError` for a golden file the check cannot use.

    **Example:**

    ```python
    config = load_config()  # parity.machinery._config: [tool.parity]
    checked = check_tree(TreeCheck(config=config, groups=["toy"]), progress=print)
    print(checked.passed, checked.header()["layout"])
    ```
    """
    config, place = request.config, request.place
    checks = place is None or place.process_id == 0  # the only host that reads the goldens
    with contextlib.ExitStack() as stack:
        goldens = stack.enter_context(GoldenDir(config.goldens))  # each file opened once
        if checks:
            verify_goldens(goldens, request.groups)
        # Where a failure would be recorded (one process), the run is kept while the
        # groups are checked: a failure is recorded in it, not in a run of its own.
        produced, kept = stack.enter_context(
            producing(
                config,
                groups=request.groups,
                progress=progress,
                timeout=request.timeout,
                place=place,
                check_classes=True,  # a typo in CLASS_MAP is refused as a repin refuses it
                read_order=not (checks and order_pinned(goldens, request.groups)),
                keep=checks and request.origin,
                goldens=goldens if checks else None,
            )
        )
        if not checks:  # another host's part ends with its run
            return CheckedTree(request, produced)
        baseline = None
        if request.baseline != "off" and place is None:
            # Where a failure would be recorded (one process), the base is recorded in the
            # run that re-produces it: a failure against it then costs no run at the base.
            record: Record = request.origin and config.processes == 1
            asked = [request.class_name or "", *(c for _, c in request.overrides)]
            if record and _rounds(goldens, asked, request.groups):
                record = ARRAYS
            baseline = BaselineBuilder(
                config, progress=progress, timeout=request.timeout, record=record
            )
        settler = FailureSettler(
            produced,
            config,
            goldens,
            origin=request.origin,
            progress=progress,
            timeout=request.timeout,
            kept=kept,
        )
        results = check_produced(
            produced,
            goldens,
            baseline=baseline,
            settle=settler,
            overrides=request.overrides,
            class_map=request.class_name,
            drift_mode=config.drift,
            save_actual=request.save_actual,
            node="parity check",
            require_baseline=request.baseline == "require",
        )
    return CheckedTree(request, produced, results)
