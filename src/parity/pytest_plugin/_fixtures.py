"""The fixtures: `parity_goldens` and `parity_check`, which checks, records the result for
the session report and fails with the table."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import pytest

from parity.machinery._worker import worker_place
from parity.origin._proof import Proof, provable, settle
from parity.pytest_plugin._stash import (
    BASELINE,
    CONFIG,
    CONVERSIONS,
    CONVERTED,
    GOLDENS,
    ORIGINS,
    OVERRIDES,
    RESULTS,
    TABLE,
)

if TYPE_CHECKING:  # parity.check loads h5py: imported only when a check runs
    from parity._results import CheckResult
    from parity.check import GoldenDir
    from parity.judge._converting import Conversion, ConvertError
    from parity.machinery._producers_table import ProducersTable
    from parity.origin import Localisation
    from parity.run._origins import Settled
    from parity.store import Provenance


@pytest.fixture(scope="session")
def parity_goldens(pytestconfig: pytest.Config) -> GoldenDir:
    """The golden folder (`--parity-goldens`), files opened lazily and read-only."""
    return pytestconfig.stash[GOLDENS]


def _on_every_host(
    actual: Any, golden: Any, live: bool, statics: tuple[dict[str, Any], dict[str, Any]]
) -> tuple[Any, Any]:
    """`actual` (and a live `golden`) flattened with arrays sharded over processes brought
    to every process's host, in the same order everywhere (a collective); a live tree's
    non-array leaves go into `statics`."""
    from parity.check import BARE_KEY
    from parity.judge._trees import flatten
    from parity.machinery._worker import to_host

    bare = BARE_KEY if live else None
    actual = flatten(actual, to_array=to_host, bare=bare, non_arrays=statics[0] if live else None)
    if live:
        golden = flatten(golden, to_array=to_host, bare=BARE_KEY, non_arrays=statics[1])
    return actual, golden


def _failure_text(result: CheckResult, differing: Sequence[str]) -> str:
    """What a failed check says: the report table, the non-array leaves that differ, where
    the actual arrays went and how to find the origin."""
    from parity.report import format_table

    text = f"parity check {result.name!r} failed\n"
    text += format_table(result.comparison, header=result.header)
    if differing:
        text += f"non-array leaves that differ ({len(differing)}):\n"
        text += "\n".join(differing) + "\n"
    if result.saved:
        text += f"actual arrays written to {result.saved}; reproduce with:\n"
        text += f"  {result.command}\n"
    if result.origin_line:
        text += result.origin_line + "\n"
    return text


class FixtureOptions(TypedDict, total=False):
    """`parity_check`'s options (each described at `_Check.__call__`)."""

    name: str | None
    class_map: Any
    overrides: Sequence[tuple[str, str]]
    order: Sequence[str] | Callable[[str], Any] | None
    produce_s: float | None
    fail: bool
    provenance: Provenance | None
    stack: Sequence[str] | str | None
    rename: Sequence[str | Sequence[str]] | str | None


@dataclass
class _Check:
    config: pytest.Config
    node: str

    def __call__(self, actual: Any, golden: Any, **options: Unpack[FixtureOptions]) -> Any:
        """Compare `actual` against a golden group (by name) or a live reference.

        **Arguments:**

        - `actual`: a pytree of arrays from the code under test (`{key: array}`, nested
          containers, equinox modules).
        - `golden`: a golden group name, or a pytree from a live reference (then
          `class_map` defaults to `bitwise`, and the non-array leaves of both trees, an
          equinox module's activation function, are compared with `==`, as
          `parity.assert_equivalent` compares them).
        - `name`: the check's name in the report (default: the group name or test id).
        - `class_map`: a `ClassMap` or a single class name, before the pinned map in the
          precedence of `parity.check`.
        - `overrides`: `(pattern, class)` rules tried first (after the session's
          `--parity-override` and `--parity-class`), e.g. `[("traj.*", "device_count")]`
          on 4 devices; the keyword of `parity.check` and `assert_equivalent`.
        - `order`: forward order (default: the golden file's pinned order).
        - `produce_s`: seconds the caller spent producing `actual`, for the timing summary.
        - `fail`: fail the test (default True; with the report table and, for a golden
          group, the origin) when the comparison fails, or a live reference's non-array
          leaf differs.
        - `provenance`: the environment `actual` was produced in, when that was another
          process (the group's in `Produced.provenance`; default this one's): a golden
          check judges drift and calibrated layouts by it.
        - `stack`, `rename`: stack rules (`"blocks.{i}"`, `parity.judge._stacking`) and
          rename rules (`"encoder=backbone"`, `parity.judge._renames`), as
          `parity.assert_equivalent` takes them. A golden check takes the producers'
          `STACK` and `RENAME` (`producers_table`, as `parity check` does) where these
          are not given; given, they replace the producers' (as in `parity check`).

        **Returns:** the `parity.judge._compare.Comparison`.
        """
        from parity._results import CheckError
        from parity.check import check_live
        from parity.check._request import refuse_unknown_options
        from parity.judge._trees import non_array_differences

        refuse_unknown_options(options, FixtureOptions, "parity_check")
        config = self.config
        class_map, fail = options.get("class_map"), options.get("fail", True)
        said = {k: v for k in ("stack", "rename") if (v := options.get(k)) is not None}
        rules = [*config.stash[OVERRIDES], *options.get("overrides", ())]
        save = config.getoption("--parity-save-actual")
        save = None if save is None else Path(config.invocation_params.dir, save).resolve()
        place, live = worker_place(), not isinstance(golden, str)
        # A live reference's non-array leaves (equinox's activations), compared with `==`.
        statics: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
        if place is not None:
            actual, golden = _on_every_host(actual, golden, live, statics)
            save = save if place.process_id == 0 else None  # process 0 alone saves what failed
        problem = None
        try:
            if isinstance(golden, str):
                result = self._against_goldens(actual, golden, options, rules, save)
            else:
                result = check_live(
                    actual,
                    golden,
                    class_map="bitwise" if class_map is None else class_map,
                    overrides=rules,
                    order=options.get("order"),
                    name=options.get("name") or self.node,
                    node=self.node,
                    produce_s=options.get("produce_s"),
                    save_actual=save,
                    non_arrays=statics,
                    **said,
                )
        except CheckError as e:
            # Failed outside the except clause: inside it pytest also prints "During
            # handling of the above exception".
            result, problem = None, str(e)
        if place is not None:
            result = self._agree(result, problem, place.process_id)
        if problem is not None or result is None:
            pytest.fail(problem or "parity check produced no result", pytrace=False)
        if place is None or place.process_id == 0:  # one report: process 0's
            config.stash[RESULTS].append(result)
        differing = non_array_differences(*statics)
        if fail and (not result.passed or differing):
            pytest.fail(_failure_text(result, differing), pytrace=False)
        return result.comparison

    def _against_goldens(
        self,
        actual: Any,
        group: str,
        options: FixtureOptions,
        rules: Sequence[tuple[str, str]],
        save: Path | None,
    ) -> CheckResult:
        """`actual` checked against the golden group `group` (`parity.check.check_group`),
        its failures settled op by op (`_GroupSettler`), by the producers' `STACK` and
        `RENAME` as `parity check` applies them (a check's own `stack=` and `rename=` in
        their place): the settler records by the same rules, so rows are proved as there."""
        from parity.check import check_group
        from parity.run._produced import usable_conversion

        config, provenance = self.config, options.get("provenance")
        said = {k: v for k in ("stack", "rename") if (v := options.get(k)) is not None}
        table = producers_table(config).given(**said)
        convert = usable_conversion(conversions(config), group)
        return check_group(
            actual,
            group,
            goldens=config.stash[GOLDENS],
            class_map=options.get("class_map"),
            overrides=rules,
            order=options.get("order"),
            drift_mode=config.stash[CONFIG].drift,
            name=options.get("name"),
            node=self.node,
            produce_s=options.get("produce_s"),
            save_actual=save,
            current_provenance=provenance,
            baseline=config.stash.get(BASELINE, None),
            require_baseline=config.stash[CONFIG].baseline == "require",
            settle=_GroupSettler(config, provenance, options.get("fail", True), table),
            stack=table.stack,
            rename=table.rename,
            convert=convert,
        )

    @staticmethod
    def _agree(result: CheckResult | None, problem: str | None, process: int) -> CheckResult | None:
        """Every process takes process 0's verdict; a process whose own arrays judge
        otherwise fails, saying so (its values differ from process 0's)."""
        from parity.machinery._worker import agree

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


@dataclass(frozen=True)
class _GroupSettler:
    """The settler of a golden check (`parity.check.Settler`): a failing result settled op
    by op (`_settled`), its keys of class `op_by_op` proved or told why not, and, for a
    check that fails its test, its origin named unless `--parity-origin off`."""

    config: pytest.Config
    provenance: Provenance | None
    fail: bool
    #: The rules the check compared by (the producers' table, a check's own `stack` and
    #: `rename` given over it): the recordings are matched by the same.
    table: ProducersTable

    def settle(self, results: Sequence[CheckResult]) -> list[CheckResult]:
        return [self._one(r) for r in results]

    def _one(self, result: CheckResult) -> CheckResult:
        if result.passed:
            return result
        origin = self.fail and self.config.getoption("--parity-origin") != "off"
        if not origin and not any(provable(f) for f in result.comparison.findings):
            return result
        proofs, found = _settled(self.config, result, self.provenance, origin, self.table)
        comparison = settle(result.comparison, proofs)
        named = found if origin and not comparison.passed else None
        return dataclasses.replace(result, comparison=comparison, origin=named)


def _settled(
    config: pytest.Config,
    result: CheckResult,
    provenance: Provenance | None,
    origin: bool,
    table: ProducersTable,
) -> tuple[Mapping[str, Proof], Localisation | None]:
    """The proofs of a failed golden check's keys and its origin: the group's programs
    recorded op by op with the session's producers, here and at its golden's base commit in
    this environment (`parity.run._origins.settle_failures`, as `parity check` does), once
    per group per session (again only for a key no earlier check of it proved). A test
    hands over arrays, not the programs that made them, so the producers run again to
    record them."""
    group = result.group or ""
    found = config.stash[ORIGINS]
    keys = {f.key for f in result.comparison.findings if provable(f)}
    if group in found and keys <= set(found[group][0]) and (found[group][1] or not origin):
        return found[group]
    project = config.stash[CONFIG]
    place = worker_place()
    why = None
    if place is not None:
        why = (
            f"the session runs as {place.processes} processes and a recording is made in one: "
            f"`parity check --groups {group}` names it"
        )
    elif project.producers is None:
        why = (
            "no producers file is configured ([tool.parity] producers), so the programs that "
            "made the group cannot be recorded"
        )
    settled = _recorded(config, result, provenance, origin, table, why)
    found[group] = (settled.proofs, settled.result.origin)
    return found[group]


def _recorded(
    config: pytest.Config,
    result: CheckResult,
    provenance: Provenance | None,
    origin: bool,
    table: ProducersTable,
    refused: str | None,
) -> Settled:
    """`result` settled through the one door, as `parity check` settles it
    (`parity.run._origins.settle_failures`), or, where the session cannot record it
    (`refused`), told so by the same door."""
    from parity.judge._dataflow import UNREAD
    from parity.machinery._processes import Layout
    from parity.machinery._runner_output import RunnerOutput
    from parity.run._origins import settle_failures
    from parity.run._produced import Produced
    from parity.store._provenance import collect_provenance

    project, group = config.stash[CONFIG], result.group or ""
    current = provenance if provenance is not None else collect_provenance()
    # Nothing of the producers' run is known here but the environment and the table the
    # check compared by: the recording runs find out whether jax computes the outputs.
    run = RunnerOutput(arrays={}, provenance=current, order=UNREAD, table=table)
    layout = Layout(1, project.devices)
    converted = {g: c for g, c in conversions(config).items() if g == group}
    produced = Produced(
        {group: run}, seconds=0.0, xla_flags="", layout=layout, conversions=converted
    )
    goldens = config.stash[GOLDENS]
    return settle_failures([result], produced, project, goldens, origin=origin, refused=refused)[0]


def producers_table(config: pytest.Config) -> ProducersTable:
    """The session's producers' table (`CLASS_MAP`, `STACK`, `RENAME`): the one read at
    session start (`configure._read_the_table`), else read now, once per process
    (`parity.run._produced.producers_table`, as `parity check` reads it); no rules where
    no producers file is configured or it cannot be imported."""
    if TABLE not in config.stash:
        read_table(config)
    return config.stash[TABLE]


def read_table(config: pytest.Config, *, check_classes: bool = False) -> None:
    """The producers' table read into the stash (`parity.run._produced.producers_table`, in
    a fresh process), no rules where no producers file is configured or it cannot be
    imported; their `CONVERT` probed in the same run on the goldens' layout, what it does
    kept in a folder of the session's (`CONVERTED`, removed at its end). Raises
    `UnusableClassError` with `check_classes`."""
    from parity.machinery._producers_table import ProducersTable
    from parity.run._produced import producers_table as read

    project = config.stash[CONFIG]
    folder = Path(tempfile.mkdtemp(prefix="parity-convert-"))
    config.stash[CONVERTED] = folder
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    table = None
    if project.producers is not None:
        table = read(
            project,
            check_classes=check_classes,
            goldens=config.stash[GOLDENS],
            conversions_into=folder,
        )
    config.stash[TABLE] = table or ProducersTable()


def conversions(config: pytest.Config) -> dict[str, Conversion | ConvertError]:
    """What the producers' `CONVERT` does to each group's goldens (group -> its
    `Conversion`, or why its converter cannot be used), probed with the table
    (`producers_table`) and read once per process from the folder that keeps it."""
    if CONVERSIONS not in config.stash:
        from parity.machinery._converters import read_conversions

        producers_table(config)
        folder = config.stash.get(CONVERTED, None)
        config.stash[CONVERSIONS] = {} if folder is None else read_conversions(folder)
    return config.stash[CONVERSIONS]


@pytest.fixture
def parity_check(request: pytest.FixtureRequest) -> _Check:
    """Compare arrays against goldens or a live reference; see `_Check.__call__`."""
    return _Check(request.config, request.node.nodeid)
