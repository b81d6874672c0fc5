"""The harness's core: open a golden folder, resolve each key's class, apply the drift
policy, compare, and hand back a `CheckResult`.

The CLI, the pytest plugin and `parity.assert_equivalent` are thin layers over this
module; none of them resolves classes, decides the environment difference, applies the
drift policy or compares on its own. **One comparison** (`_compare`) serves three inputs:

- a golden file, `check_file`: `check_group` is `check_file` of `<goldens>/<group>.h5`,
  and `parity diff ACTUAL GOLDEN` is `check_file` of GOLDEN with ACTUAL's arrays and
  provenance;
- two live pytrees, `check_live`: `assert_equivalent` is `check_live` plus the trees'
  non-array leaves.

**One pass** (docs/design.md, "One pass"): a check of golden groups (`check_groups`; of
one, `check_group` and `check_file`) makes each group's first verdict (`first_verdict`:
the one comparison, and whether a baseline is wanted), has the baselines prepared at once
(`parity.exactness.prepare_baselines`), then concludes each (`parity.exactness.conclude`),
reusing the tree flattened once.

**The environment.** `check_file` decides once how the environment `actual` was produced
in differs from the pin's (`parity.environment.environment_difference`) and hands that
one `EnvironmentDifference` to the drift policy, the calibrated comparison and the
baseline.

**Class resolution**: one precedence everywhere, `parity.judge.tolerance.class_resolver`'s.

A key under the `calibrated` class is judged against its recorded spread, and in an
environment other than the pin's each key by the looser of its class and its calibrated
bound there: `parity.calibrated.bounds` does both, here applied by `check_file`.

**Errors.** Input the check cannot use raises a `CheckError` (a missing or unusable golden
group, a refused drift, an unknown class); a comparison that fails is not an error: it is
a `CheckResult` whose `passed` is False. Both live in `parity.results`. Nothing here knows
about pytest.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, Unpack

from parity.calibrated.bounds import golden_classes
from parity.environment import (
    environment_difference,
)
from parity.exactness import conclude, prepare_baselines
from parity.judge.chunks import DEFAULT_BUDGET
from parity.judge.classes import REGISTRY, ToleranceClass
from parity.judge.compare import Comparison, Order, compare_trees
from parity.judge.dataflow import DATAFLOW, HOST
from parity.judge.tolerance import (
    DEFAULT_CLASS,
    ClassMapLike,
    KeyClass,
    Overrides,
    UnknownClassError,
    UnmatchedKeyError,
    class_resolver,
)
from parity.judge.trees import flatten
from parity.results import CheckError, CheckResult, diff_command
from parity.store import GoldenFile, GoldenMissingError, GoldenStoreError, open_goldens
from parity.verdict import CheckRequest, FileOptions, FirstVerdict, GroupOptions, Registries

if TYPE_CHECKING:
    from parity.baseline import BaselineSource

__all__ = [
    "BARE_KEY",
    "REPIN_HINT",
    "CheckOptions",
    "GoldenDir",
    "LiveOptions",
    "Settler",
    "check_file",
    "check_group",
    "check_groups",
    "check_live",
    "first_verdict",
]

#: The key of a bare array (a one-leaf pytree) in a live check or `assert_equivalent`.
BARE_KEY = "array"
#: How to pin a golden group; named in every "missing golden" message.
REPIN_HINT = "parity repin --base <SHA>"


# --------------------------------------------------------------------------- goldens


class GoldenDir:
    """A folder of golden files, `<group>.h5`, opened lazily, read-only, once each.

    Safe under pytest-xdist: every process opens its own read-only handles.

    **Arguments:**

    - `path`: the folder.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._open: dict[str, GoldenFile] = {}

    def path_of(self, group: str) -> Path:
        """The file of `group`."""
        return self.path / f"{group}.h5"

    def groups(self) -> list[str]:
        """Every golden group in the folder, sorted."""
        return sorted(p.stem for p in self.path.glob("*.h5")) if self.path.is_dir() else []

    def open(self, group: str) -> GoldenFile:
        """The `GoldenFile` of `group`; raises `CheckError` naming the repin command if it
        is missing, or what is wrong if it cannot be used."""
        if group not in self._open:
            try:
                self._open[group] = open_goldens(self.path_of(group))
            except GoldenMissingError:
                raise CheckError(
                    f"no golden file for group {group!r} at {self.path_of(group)}: pin it with "
                    f"{REPIN_HINT}"
                ) from None
            except GoldenStoreError as e:
                raise CheckError(f"golden group {group!r} is unusable: {e}") from None
        return self._open[group]

    def close(self) -> None:
        """Close every file opened so far."""
        for f in self._open.values():
            f.close()
        self._open.clear()

    def __enter__(self) -> GoldenDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _as_dir(goldens: GoldenDir | str | os.PathLike[str]) -> GoldenDir:
    return goldens if isinstance(goldens, GoldenDir) else GoldenDir(goldens)


# --------------------------------------------------------------------------- checks


def _compare(
    actual: Any,
    expected: Any,
    classes: Callable[[str], KeyClass],
    *,
    registry: Mapping[str, ToleranceClass],
    order: Order | None,
    name: str,
    bare: str | None = None,
    reference: str = "golden",
    budget: int = DEFAULT_BUDGET,
    non_arrays: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> tuple[Comparison, dict[str, Any], float]:
    """The one comparison every check makes (of a golden file, of two files, of two live
    trees): flatten both sides, compare every key under its class in the forward order.

    **Returns:** the comparison, `actual` flat and the seconds it took. Raises `CheckError`
    for input it cannot compare (an unknown class, a key without one, an object array)."""
    t0 = time.perf_counter()
    statics_a, statics_e = non_arrays if non_arrays is not None else (None, None)
    try:
        flat_a = flatten(actual, non_arrays=statics_a, bare=bare)
        flat_e = flatten(expected, non_arrays=statics_e, bare=bare)
    except (TypeError, ValueError) as e:
        raise CheckError(f"check {name!r}: {e}") from None
    try:
        comparison = compare_trees(
            flat_a,
            flat_e,
            classes,
            registry=registry,
            order=order,
            budget=budget,
            reference=reference,
        )
    except (TypeError, UnknownClassError, UnmatchedKeyError) as e:
        raise CheckError(f"check {name!r}: {e}") from None
    return comparison, flat_a, time.perf_counter() - t0


class Settler(Protocol):
    """What settles a check's failures after its verdict, op by op: each key of a class
    that proves (`op_by_op`) proved or told why not, and the origin of what still fails
    named (`CheckResult.origin`). The check calls it once, with every result, where some
    fails; the face that runs the check provides it, since only the face knows how the
    programs behind the trees can be recorded: `parity.run.origins.FailureSettler` (the
    producers, here and at the base commit) for `parity check` and the pytest plugin,
    `parity.assertions`' for two functions in hand."""

    def settle(self, results: Sequence[CheckResult]) -> list[CheckResult]:
        """`results` in order, each failing one settled (a passing one as it is)."""
        ...


def _settled(results: list[CheckResult], settler: Settler | None) -> list[CheckResult]:
    """The last stage: the failures settled, where a settler was given and some failed."""
    if settler is None or all(r.passed for r in results):
        return results
    return settler.settle(results)


class CheckOptions(GroupOptions, total=False):
    """The options of a check of a golden group, as `check_group` takes them."""

    baseline: BaselineSource | None
    settle: Settler | None


class LiveOptions(TypedDict, total=False):
    """The options of a live check (`check_live`); each as `check_group` takes it, but
    `class_map`, which defaults to `bitwise` there, and `non_arrays` (see `check_live`)."""

    class_map: ClassMapLike
    overrides: Overrides
    order: Order | None
    registry: Mapping[str, ToleranceClass]
    name: str
    node: str | None
    produce_s: float | None
    save_actual: str | os.PathLike[str] | None
    non_arrays: tuple[dict[str, Any], dict[str, Any]] | None
    settle: Settler | None


def first_verdict(actual: Any, gf: GoldenFile, request: CheckRequest) -> FirstVerdict:
    """`actual` compared with the golden file `gf`, before any baseline: the classes
    resolved, the environment difference decided, the drift policy applied, the one
    comparison made, as `request` asks (`check_file`'s options; `request.dataflow_order`,
    where `actual`'s order was read from the programs that computed it, is its forward
    order, before the golden's pinned one). Whether a baseline is wanted is
    `FirstVerdict.wants_baseline`. Raises `CheckError` for unusable input."""
    started = time.time()
    t0 = time.perf_counter()
    group, order = gf.path.stem, request.order
    try:
        chosen = None if request.keys is None else set(request.keys)
        wanted = [k for k in gf if chosen is None or k in chosen]
        # Sources, not arrays: each is read in chunks when compared, checksum verified.
        golden_arrays = {k: (request.golden_source or gf.source)(k) for k in wanted}
        classes = golden_classes(
            gf,
            overrides=request.overrides,
            class_map=request.class_map,
            keys=wanted,
            registry=request.registry,
        )
        placed = gf.ordered_keys()
    except GoldenStoreError as e:
        raise CheckError(f"golden group {group!r} is unusable: {e}") from None
    difference = request.difference
    if difference is None:
        difference = environment_difference(gf.provenance, request.current)
    decision = difference.policy(request.drift_mode)
    if decision.refused:
        raise CheckError(" ".join(decision.header))
    registries = Registries.under(decision, request.registry)
    for key in golden_arrays:
        classes.bound(key)  # a calibrated key without a recorded spread is an error first
    load_s = time.perf_counter() - t0
    forward: Order = [k for k in placed if k in golden_arrays] if order is None else order
    if order is None and request.dataflow_order is not None:
        # Produced in an order read from the programs that computed it: that order, finer
        # than a declared one pinned in the golden.
        mine = [k for k in request.dataflow_order if k in golden_arrays]
        forward = mine + [k for k in placed if k in golden_arrays and k not in set(mine)]
    try:
        comparison, flat_a, compare_s = _compare(
            actual,
            golden_arrays,
            classes.bound,
            registry=registries.policy,
            order=forward,
            name=request.name or group,
            budget=request.budget,
        )
    except GoldenStoreError as e:
        raise CheckError(f"golden group {group!r} is unusable: {e}") from None
    source = DATAFLOW if request.dataflow_order is not None else None
    return FirstVerdict(
        gf=gf,
        current=request.current,
        difference=difference,
        classes=classes,
        keys=tuple(golden_arrays),
        flat_a=flat_a,
        forward=forward,
        comparison=comparison,
        registries=registries,
        request=request,
        started=started,
        load_s=load_s,
        compare_s=compare_s,
        order_source=source or (HOST if request.host_computed else None),
    )


def _concluded(
    firsts: Sequence[FirstVerdict], baseline: BaselineSource | None
) -> list[CheckResult]:
    """The end of the one pass: the baselines the first verdicts want, prepared at once,
    then each verdict concluded, in order."""
    wanted = [f.baseline_request() for f in firsts if f.wants_baseline]
    baselines = prepare_baselines(baseline, wanted)
    return [conclude(f, baselines[f.group] if f.wants_baseline else None) for f in firsts]


def check_file(
    actual: Any,
    gf: GoldenFile,
    *,
    current: Mapping[str, Any],
    baseline: BaselineSource | None = None,
    **options: Unpack[FileOptions],
) -> CheckResult:
    """Compare `actual` against the golden file `gf`: the core of `check_group` and of
    `parity diff` (a check of one file against another). Its first verdict
    (`first_verdict`), the baseline it wants (`parity.exactness.prepare_baselines`), the
    result (`conclude`).

    **Arguments:**

    - `actual`: a pytree of arrays, or a flat `{key: array or Source}` (an ACTUAL file's
      arrays, read in chunks).
    - `gf`: the golden file: its arrays are the expected side; its pinned class map and
      recorded classes, forward order, calibration and provenance are used.
    - `current`: the provenance of the environment `actual` was produced in.
    - `difference`: how that environment differs from the pin's; default
      `environment_difference(gf.provenance, current)`. Decided once, and handed to every
      comparison below.
    - `class_map`, `overrides`: see the module docstring's precedence.
    - `order`: the forward order; default the golden's pinned order.
    - `drift_mode`: the bitwise drift policy (`parity.environment`).
    - `registry`: the classes by name.
    - `name`, `node`: for reports (`name` defaults to the group, `gf`'s file name).
    - `produce_s`: seconds the caller spent producing `actual`, for the timing summary.
    - `save_actual`: a folder; when the check fails, the obtained arrays are written there
      as `<name>.h5` in golden format (see `CheckResult.command`).
    - `keys`: check only these keys of the golden (a producer of part of it); default all.
    - `baseline`: what re-produces the baseline (`parity.baseline.BaselineSource`): where
      the environment differs from the pin's in a way that can move bits and some key fails
      its pinned class, the group re-produced at its base commit here is the tree's
      reference, exactly. None: the goldens are, by calibration where the environment
      differs.
    - `require_baseline`: where the baseline would be the reference (above) but cannot
      (`baseline` is None, or it cannot be re-produced here), raise a `CheckError` with the
      reason and what to do instead of passing keys by calibration alone
      (`parity.exactness`).
    - `budget`: bytes one array comparison may hold at once (`parity.judge.chunks`).
    - `golden_source`: key -> the golden's array or `Source` (`parity diff` names the file
      in read errors); default `gf.source`.

    **Returns:** a `CheckResult`; its header says where the goldens are, the drift, the
    order, the calibration and (`reference`) the reference used. Raises `CheckError` for
    unusable input, and where the baseline is outside the goldens' recorded noise.
    """
    request = CheckRequest(current=current, **options)
    return _concluded([first_verdict(actual, gf, request)], baseline)[0]


def check_group(
    actual: Any,
    group: str,
    *,
    goldens: GoldenDir | str | os.PathLike[str],
    current_provenance: Mapping[str, Any] | None = None,
    **options: Unpack[CheckOptions],
) -> CheckResult:
    """Compare `actual` against the golden group `group` (`check_groups` of that one
    group: `check_file` of `<goldens>/<group>.h5`).

    **Arguments:**

    - `actual`: a pytree of arrays (`{key: array}`, nested containers, equinox modules).
    - `group`: the golden group's name (`<goldens>/<group>.h5`).
    - `goldens`: the golden folder (a `GoldenDir` keeps files open across checks).
    - `current_provenance`: the environment `actual` was produced in, when that was another
      process (`parity check`); default this process's.
    - `options`: as `check_file` takes them (`class_map`, `overrides`, `order`,
      `drift_mode`, `registry`, `name`, `node`, `produce_s`, `save_actual`, `keys`,
      `baseline`, `require_baseline`).

    **Returns:** a `CheckResult`; its header's `reference` line names the reference used.
    Raises `CheckError` for unusable input, and where the baseline is outside the goldens'
    recorded noise.

    **Example:**

    ```python
    result = parity.check_group({"logits": logits}, "forward", goldens="goldens")
    assert result.passed, parity.format_table(result.comparison)
    ```
    """
    provenance = {group: current_provenance}
    return check_groups({group: actual}, goldens=goldens, provenance=provenance, **options)[0]


def check_groups(
    produced: Mapping[str, Any],
    *,
    goldens: GoldenDir | str | os.PathLike[str],
    provenance: Mapping[str, Mapping[str, Any] | None] | None = None,
    baseline: BaselineSource | None = None,
    dataflow_orders: Mapping[str, Sequence[str]] | None = None,
    host_computed: Collection[str] = (),
    settle: Settler | None = None,
    **options: Unpack[GroupOptions],
) -> list[CheckResult]:
    """Compare each group of `produced` against its golden group, in one pass: every
    group's first verdict (`first_verdict`), then the baselines of those that want one,
    prepared at once (`parity.exactness.prepare_baselines`: one producer run per base
    commit and environment where `baseline` can batch), then each verdict concluded
    (`conclude`).

    **Arguments:**

    - `produced`: group -> a pytree of arrays.
    - `goldens`: the golden folder.
    - `provenance`: group -> the environment its arrays were produced in (`parity check`:
      the producer process's); for a group without one, this process's.
    - `baseline`: what re-produces the baselines, as `check_file` takes it.
    - `dataflow_orders`: group -> its keys in the order its producer's programs computed
      them (`parity check`: read from the programs the producer ran), the forward order of
      that group's check in place of the golden's pinned one; `host_computed`: groups
      whose values no jax program computed (their header says so, not "declared").
    - `settle`: what settles the failures op by op (`Settler`), once, after every verdict;
      None: the verdicts stand as the comparisons made them.
    - `options`: as `check_file` takes them (but `baseline`).

    **Returns:** one `CheckResult` per group, in `produced`'s order. Raises `CheckError`
    as `check_file` does: a first verdict's before any baseline is prepared.
    """
    from parity.store.provenance import collect_provenance

    folder = _as_dir(goldens)
    firsts: list[FirstVerdict] = []
    for group, actual in produced.items():
        gf = folder.open(group)
        current = (provenance or {}).get(group)
        current = current if current is not None else collect_provenance()
        request = CheckRequest(
            current=current,
            dataflow_order=(dataflow_orders or {}).get(group),
            host_computed=group in host_computed,
            **options,
        )
        firsts.append(first_verdict(actual, gf, request))
    return _settled(_concluded(firsts, baseline), settle)


def check_live(actual: Any, expected: Any, **options: Unpack[LiveOptions]) -> CheckResult:
    """Compare `actual` against a live reference `expected` (the old implementation run
    on the same inputs), both pytrees of arrays (a bare array is a tree of one leaf, named
    `BARE_KEY`).

    **Arguments:** as `check_group` (`LiveOptions`), with `expected` in place of the golden
    group, `class_map` defaulting to `bitwise` and `name` to `live`. With `save_actual`, a
    failing check writes `<name>.h5` (actual) and `<name>.expected.h5` (reference). With
    `non_arrays`, two dicts that receive the leaves of `actual` and `expected` that are not
    arrays, by key (`assert_equivalent` compares them with `==`); without, such leaves are
    an error. With `settle`, a failing check is settled op by op (`Settler`).

    **Returns:** a `CheckResult` (its `group` is None).

    **Example:**

    ```python
    result = parity.check_live(new_tree, old_tree, class_map="fp32_reassoc")
    print(result.comparison.first_failure)  # None where every key holds its class
    ```
    """
    started = time.time()
    name, overrides = options.get("name", "live"), options.get("overrides", ())
    class_map = options.get("class_map", DEFAULT_CLASS)
    resolve = class_resolver(overrides=overrides, class_map=class_map)
    comparison, flat_a, compare_s = _compare(
        actual,
        expected,
        resolve,
        registry=options.get("registry", REGISTRY),
        order=options.get("order"),
        name=name,
        bare=BARE_KEY,
        reference="expected",
        non_arrays=options.get("non_arrays"),
    )
    saved = command = None
    save_actual = options.get("save_actual")
    if save_actual is not None and not comparison.passed:
        from parity.store.writer import save_arrays

        keys = [f.key for f in comparison.findings]
        path = save_arrays(save_actual, name, flat_a, classes=resolve, order=keys)
        ref = save_arrays(
            save_actual,
            f"{name}.expected",
            flatten(expected, bare=BARE_KEY),
            classes=resolve,
            order=keys,
        )
        saved, command = str(path), diff_command(path, ref, overrides, class_map)
    result = CheckResult(
        name=name,
        comparison=comparison,
        node=options.get("node"),
        started=started,
        produce_s=options.get("produce_s"),
        compare_s=compare_s,
        saved=saved,
        command=command,
    )
    return _settled([result], options.get("settle"))[0]
