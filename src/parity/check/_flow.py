"""The door of every check (the one flow: docs/design.md, "One pass"): the CLI (through
`parity.run._produced.check_produced`), `parity bisect`, the pytest plugin and
`parity.assert_equivalent` enter here, and a check runs its stages in order, each taking
the typed value the one before made:

1. what it is asked (`parity.check._request.CheckRequest`), built here from the door's
   keywords;
2. its first verdict (`parity.check._first.first_verdict`): the classes resolved, the
   environment difference decided once, the drift policy applied, the one comparison made;
3. the baselines the first verdicts want, prepared at once, and each verdict judged against
   its reference (`parity.check._against_baseline`): its baseline, else the goldens, by
   calibration where the environment differs;
4. its conclusion (`parity.check._conclusion.conclude`): the `CheckResult` with its header,
   saying how exact it is;
5. its failures settled op by op by the face's `Settler` (`op_by_op` keys proved or told
   why not, the origin named), where the face gave one.

**One comparison** (`parity.check._first.compare_flat`) serves three inputs: a golden file
(`check_file`; `check_group` is `check_file` of `<goldens>/<group>.h5`, and `parity diff
ACTUAL GOLDEN` is `check_file` of GOLDEN with ACTUAL's arrays and provenance); golden
groups produced together (`check_groups`, in one pass); two live trees (`check_live`).

**Class resolution**: one precedence everywhere, `parity.judge._tolerance.class_resolver`'s.
A key under the `calibrated` class is judged against its recorded spread, and in an
environment other than the pin's each key by the looser of its class and its calibrated
bound there (`parity.calibrated._bounds`).

**Errors.** Input the check cannot use raises a `CheckError` (a missing or unusable golden
group, a refused drift, an unknown class); a comparison that fails is not an error: it is
a `CheckResult` whose `passed` is False. Both live in `parity._results`. Nothing here knows
about pytest.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Unpack

import numpy as np

from parity._results import CheckError, CheckResult, diff_command
from parity.check._against_baseline import against_baselines
from parity.check._conclusion import conclude
from parity.check._first import FirstVerdict, compare_flat, first_verdict, flatten_sides
from parity.check._goldens import GoldenDir, as_dir
from parity.check._request import (
    BaselineSource,
    CheckOptions,
    CheckRequest,
    FileOptions,
    GroupOptions,
    LiveOptions,
    Settler,
    refuse_unknown_options,
)
from parity.judge._classes import REGISTRY
from parity.judge._converting import Conversion, ConvertError, annotated, probe
from parity.judge._renames import parse_renames, renamed
from parity.judge._stacking import parse_stack, unstack
from parity.judge._tolerance import DEFAULT_CLASS, class_resolver
from parity.store import GoldenFile, Provenance

__all__ = ["BARE_KEY", "check_file", "check_group", "check_groups", "check_live"]

#: The key of a bare array (a one-leaf pytree) in a live check or `assert_equivalent`.
BARE_KEY = "array"


def _settled(results: list[CheckResult], settler: Settler | None) -> list[CheckResult]:
    """The last stage: the failures settled, where a settler was given and some failed."""
    if settler is None or all(r.passed for r in results):
        return results
    return settler.settle(results)


def check_file(
    actual: Any,
    gf: GoldenFile,
    *,
    current: Provenance,
    baseline: BaselineSource | None = None,
    **options: Unpack[FileOptions],
) -> CheckResult:
    """Compare `actual` against the golden file `gf`: the core of `check_group` and of
    `parity diff` (a check of one file against another). Its first verdict
    (`first_verdict`), judged against the baseline it wants, else the goldens
    (`against_baselines`), and its result (`conclude`).

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
    - `drift_mode`: the bitwise drift policy (`parity._environment`).
    - `registry`: the classes by name.
    - `name`, `node`: for reports (`name` defaults to the group, `gf`'s file name).
    - `produce_s`: seconds the caller spent producing `actual`, for the timing summary.
    - `save_actual`: a folder; when the check fails, the actual arrays are written there
      as `<name>.h5` in golden format (see `CheckResult.command`).
    - `keys`: check only these keys of the golden (a producer of part of it); default all.
    - `baseline`: what re-produces the baseline (`BaselineSource`): where
      the environment differs from the pin's in a way that can move bits and some key fails
      its pinned class, the group re-produced at its base commit here is the tree's
      reference, exactly. None: the goldens are, by calibration where the environment
      differs.
    - `require_baseline`: where the baseline would be the reference (above) but cannot
      (`baseline` is None, or it cannot be re-produced here), raise a `CheckError` with the
      reason and what to do instead of passing keys by calibration alone
      (`parity.check._conclusion`).
    - `budget`: bytes one array comparison may hold at once (`parity.judge._chunks`).
    - `golden_source`: key -> the golden's array or `Source` (`parity diff` names the file
      in read errors); default `gf.source`.

    **Returns:** a `CheckResult`; its header says where the goldens are, the drift, the
    order, the calibration and (`reference`) the reference used (and, where the baseline
    is outside the goldens' recorded noise, how far they lie from it). Raises `CheckError`
    for unusable input, and where the baseline is required but cannot be re-produced.
    """
    first = first_verdict(actual, gf, CheckRequest(current=current, **options))
    return conclude(first, against_baselines([first], baseline)[0])


def check_group(
    actual: Any,
    group: str,
    *,
    goldens: GoldenDir | str | os.PathLike[str],
    current_provenance: Provenance | None = None,
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
      `baseline`, `require_baseline`); `convert`, what the producers' converter does to
      the group's goldens (`parity.judge._converting.Conversion`).

    **Returns:** a `CheckResult`; its header's `reference` line names the reference used.
    Raises `CheckError` for unusable input, and where the baseline is required but cannot
    be re-produced.

    **Example:**

    ```python
    result = parity.check_group({"logits": logits}, "forward", goldens="goldens")
    assert result.passed, parity.format_table(result.comparison)
    ```
    """
    provenance = {group: current_provenance}
    convert = options.pop("convert", None)
    conversions = None if convert is None else {group: convert}
    return check_groups(
        {group: actual},
        goldens=goldens,
        provenance=provenance,
        conversions=conversions,
        **options,
    )[0]


def check_groups(
    produced: Mapping[str, Any],
    *,
    goldens: GoldenDir | str | os.PathLike[str],
    provenance: Mapping[str, Provenance | None] | None = None,
    baseline: BaselineSource | None = None,
    dataflow_orders: Mapping[str, Sequence[str]] | None = None,
    host_computed: Collection[str] = (),
    settle: Settler | None = None,
    conversions: Mapping[str, Conversion] | None = None,
    **options: Unpack[GroupOptions],
) -> list[CheckResult]:
    """Compare each group of `produced` against its golden group, in one pass: every
    group's first verdict (`first_verdict`), then the baselines of those that want one,
    prepared at once, and each verdict judged against its reference (`against_baselines`:
    one producer run per base commit and environment where `baseline` can batch), then each
    verdict concluded (`conclude`), then the failures settled (`settle`).

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
    - `conversions`: group -> what the producers' converter does to its goldens
      (`parity.judge._converting.Conversion`): that group's tree is read in the goldens'
      layout through it.
    - `options`: as `check_file` takes them (but `baseline`).

    **Returns:** one `CheckResult` per group, in `produced`'s order. Raises `CheckError`
    as `check_file` does: a first verdict's before any baseline is prepared.
    """
    from parity.store._provenance import collect_provenance

    folder = as_dir(goldens)
    firsts: list[FirstVerdict] = []
    for group, actual in produced.items():
        gf = folder.open(group)
        current = (provenance or {}).get(group)
        current = current if current is not None else collect_provenance()
        request = CheckRequest(
            current=current,
            dataflow_order=(dataflow_orders or {}).get(group),
            host_computed=group in host_computed,
            convert=(conversions or {}).get(group),
            **options,
        )
        firsts.append(first_verdict(actual, gf, request))
    judged = against_baselines(firsts, baseline)
    results = [conclude(f, j) for f, j in zip(firsts, judged, strict=True)]
    return _settled(results, settle)


def probed(
    convert: Callable[[dict[str, Any]], Any] | Conversion | None,
    expected: Mapping[str, Any],
    name: str,
) -> Conversion | None:
    """What `convert` does to the layout of `expected` (flat: only its keys and shapes are
    read; `parity.judge._converting.probe`), or None without one, or `convert` itself where
    it was probed already; `CheckError` for a converter that computes, copies or raises."""
    if convert is None or isinstance(convert, Conversion):
        return convert
    try:
        return probe(convert, {k: tuple(np.shape(v)) for k, v in expected.items()})
    except ConvertError as e:
        raise CheckError(f"check {name!r}: the converter cannot be used: {e}") from None


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
    refuse_unknown_options(options, LiveOptions, "check_live")
    started = time.time()
    name, overrides = options.get("name", "live"), options.get("overrides", ())
    class_map = options.get("class_map", DEFAULT_CLASS)
    resolve = class_resolver(overrides=overrides, class_map=class_map)
    t0 = time.perf_counter()
    flat_a, flat_e = flatten_sides(
        actual, expected, name, bare=BARE_KEY, non_arrays=options.get("non_arrays")
    )
    try:
        rules, renames = parse_stack(options.get("stack")), parse_renames(options.get("rename"))
    except ValueError as e:
        raise CheckError(f"check {name!r}: {e}") from None
    # Through the user's converter, the tree is read in the reference's layout; a moved key
    # of the tree faces the key it replaces; a stacked key of either tree is compared row
    # by row with the other's per-layer keys.
    conversion = probed(options.get("convert"), flat_e, name)
    if conversion is not None:
        flat_a = conversion.to_expected_layout(flat_a)
    flat_a, flat_e = unstack(renamed(flat_a, flat_e, renames), flat_e, rules)
    comparison = compare_flat(
        flat_a,
        flat_e,
        resolve,
        registry=options.get("registry", REGISTRY),
        order=options.get("order"),
        name=name,
        reference="expected",
    )
    if conversion is not None:
        comparison = annotated(comparison, conversion)
    compare_s = time.perf_counter() - t0
    saved = command = None
    save_actual = options.get("save_actual")
    if save_actual is not None and not comparison.passed:
        from parity.store._writer import save_arrays

        keys = [f.key for f in comparison.findings]
        path = save_arrays(save_actual, name, flat_a, classes=resolve, order=keys)
        ref = save_arrays(save_actual, f"{name}.expected", flat_e, classes=resolve, order=keys)
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
