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

**The environment.** `check_file` decides once how the environment `actual` was produced
in differs from the pin's (`parity.environment.environment_difference`) and hands that
one `EnvironmentDifference` to the drift policy, the calibrated judgement and the second
judge.

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

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack, cast

from parity.calibrated.bounds import bind_calibrated, judge_environment
from parity.calibrated.spreads import Spreads
from parity.environment import (
    EnvironmentDifference,
    PolicyDecision,
    PolicyMode,
    environment_difference,
)
from parity.exactness import SECOND_JUDGE_OFF, inexact, judge_line, required_error, second_judge
from parity.judge.chunks import DEFAULT_BUDGET
from parity.judge.classes import REGISTRY, ToleranceClass
from parity.judge.compare import Comparison, Order, compare_trees
from parity.judge.dataflow import order_hint
from parity.judge.rules import Ulp
from parity.judge.tolerance import (
    DEFAULT_CLASS,
    ClassMap,
    ClassMapLike,
    KeyClass,
    Overrides,
    UnknownClassError,
    UnmatchedKeyError,
    class_resolver,
)
from parity.judge.trees import flatten
from parity.results import CheckError, CheckResult
from parity.store import GoldenFile, GoldenMissingError, GoldenStoreError, open_goldens

if TYPE_CHECKING:
    from parity.base_judge import BaseSource

__all__ = [
    "BARE_KEY",
    "REPIN_HINT",
    "CheckOptions",
    "GoldenDir",
    "check_file",
    "check_group",
    "check_live",
    "pinned_class_map",
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


# --------------------------------------------------------------------------- classes


def pinned_class_map(gf: GoldenFile) -> ClassMap | None:
    """The class map pinned in `gf`, or None if it pins none; `CheckError` if malformed."""
    if not gf.class_map_json:
        return None
    try:
        return ClassMap.from_json(gf.class_map_json)
    except ValueError as e:
        raise CheckError(
            f"{gf.path}: the pinned class map is malformed ({e}); pass a class map, or repin "
            "the file"
        ) from None


def _policy_registry(
    decision: PolicyDecision, registry: Mapping[str, ToleranceClass]
) -> dict[str, ToleranceClass]:
    """`registry` under the drift policy's decision: under `"relax"` with a drift that can
    move bits, `bitwise` becomes an ulp rule."""
    out = dict(registry)
    if decision.bitwise_max_ulp is not None:
        out["bitwise"] = ToleranceClass(
            "bitwise",
            Ulp(max_ulp=decision.bitwise_max_ulp),
            meaning="bitwise, relaxed to ulp by the drift policy",
        )
    return out


def _diff_command(
    saved: Path, golden: Path | None, overrides: Overrides, class_map: ClassMapLike = None
) -> str:
    """The `parity diff` command that judges `saved` against `golden` as the check did:
    its overrides, then the caller's class map (its rules as further `--override`s, its
    default as `--class`), so that the table it prints is the check's."""
    caller = ClassMap(default=class_map) if isinstance(class_map, str) else class_map
    rules = [*overrides, *(caller.rules if caller is not None else ())]
    parts = ["python -m parity diff", str(saved), str(golden) if golden else "<expected>"]
    parts += [f"--override '{p}={c}'" for p, c in rules]
    if caller is not None and caller.default is not None:
        parts.append(f"--class '{caller.default}'")
    return " ".join(parts)


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
            flat_a, flat_e, classes, registry=registry, order=order, budget=budget,
            reference=reference,
        )  # fmt: skip
    except (TypeError, UnknownClassError, UnmatchedKeyError) as e:
        raise CheckError(f"check {name!r}: {e}") from None
    return comparison, flat_a, time.perf_counter() - t0


def check_file(
    actual: Any,
    gf: GoldenFile,
    *,
    current: Mapping[str, Any],
    difference: EnvironmentDifference | None = None,
    class_map: ClassMapLike = None,
    overrides: Overrides = (),
    order: Order | None = None,
    drift_mode: PolicyMode = "warn",
    registry: Mapping[str, ToleranceClass] = REGISTRY,
    name: str | None = None,
    node: str | None = None,
    produce_s: float | None = None,
    save_actual: str | os.PathLike[str] | None = None,
    keys: Sequence[str] | None = None,
    base: BaseSource | None = None,
    require_base: bool = False,
    budget: int = DEFAULT_BUDGET,
    golden_source: Callable[[str], Any] | None = None,
) -> CheckResult:
    """Compare `actual` against the golden file `gf`: the core of `check_group` and of
    `parity diff` (a check of one file against another).

    **Arguments:**

    - `actual`: a pytree of arrays, or a flat `{key: array or Source}` (an ACTUAL file's
      arrays, read in chunks).
    - `gf`: the golden file: its arrays are the expected side; its pinned class map and
      recorded classes, forward order, calibration and provenance are used.
    - `current`: the provenance of the environment `actual` was produced in.
    - `difference`: how that environment differs from the pin's; default
      `environment_difference(gf.provenance, current)`. Decided once, and handed to every
      judge below.
    - `class_map`, `overrides`: see the module docstring's precedence.
    - `order`: the forward order; default the golden's pinned order.
    - `drift_mode`: the bitwise drift policy (`parity.environment`).
    - `registry`: the classes by name.
    - `name`, `node`: for reports (`name` defaults to the group, `gf`'s file name).
    - `produce_s`: seconds the caller spent producing `actual`, for the timing summary.
    - `save_actual`: a folder; when the check fails, the obtained arrays are written there
      as `<name>.h5` in golden format (see `CheckResult.command`).
    - `keys`: check only these keys of the golden (a producer of part of it); default all.
    - `base`: the second judge (`parity.base_judge`): where the environment differs from
      the pin's in a way that can move bits and some key fails its pinned class, the group
      re-produced at its base commit here judges the tree, exactly. None: the goldens
      judge, by calibration where the environment differs.
    - `require_base`: where the base would judge (above) but cannot (`base` is None, or it
      cannot be re-produced here), raise a `CheckError` with the reason and what to do
      instead of passing keys by calibration alone (`parity.exactness`).
    - `budget`: bytes one array comparison may hold at once (`parity.judge.chunks`).
    - `golden_source`: key -> the golden's array or `Source` (`parity diff` names the file
      in read errors); default `gf.source`.

    **Returns:** a `CheckResult`; its header says where the goldens are, the drift, the
    order, the calibration and (`judge`) the judge used. Raises `CheckError` for unusable
    input, and where the base re-produced here is outside the goldens' recorded noise.
    """
    started = time.time()
    t0 = time.perf_counter()
    group = gf.path.stem
    try:
        # Sources, not arrays: each is read in chunks when compared, checksum verified.
        chosen = None if keys is None else set(keys)
        wanted = [k for k in gf if chosen is None or k in chosen]
        golden_arrays = {k: (golden_source or gf.source)(k) for k in wanted}
        recorded = {k: gf.info(k).class_name for k in wanted}
        placed = gf.ordered_keys()
    except GoldenStoreError as e:
        raise CheckError(f"golden group {group!r} is unusable: {e}") from None
    if difference is None:
        difference = environment_difference(gf.provenance, current)
    decision = difference.policy(drift_mode)
    if decision.refused:
        raise CheckError(" ".join(decision.header))
    exact_registry = registry
    registry = _policy_registry(decision, registry)
    spreads = Spreads.of(gf.provenance)
    names = class_resolver(
        overrides=overrides, class_map=class_map, pinned=pinned_class_map(gf), recorded=recorded
    )
    classes = bind_calibrated(names, spreads, group, gf.path, exact_registry)
    for key in golden_arrays:
        classes(key)  # a calibrated key without a recorded spread is an error before any work
    load_s = time.perf_counter() - t0
    forward = [k for k in placed if k in golden_arrays] if order is None else order
    try:
        comparison, flat_a, compare_s = _compare(
            actual, golden_arrays, classes, registry=registry, order=forward,
            name=name or group, budget=budget,
        )  # fmt: skip
        judged_by_base, base_path, env_header, why = None, "", {}, None
        judge = judge_line(difference, comparison.passed)
        needed = difference.moves_bits and not comparison.passed
        if needed and base is None:
            why = SECOND_JUDGE_OFF
            if require_base:
                raise required_error(group, why)
        elif needed and base is not None:
            judged_by_base, judge, base_path, why = second_judge(
                base, gf, current, difference, flat_a, classes, (exact_registry, registry),
                forward, list(golden_arrays), required=require_base,
            )  # fmt: skip
        if judged_by_base is not None:
            comparison = judged_by_base
            # The drift cannot explain a failure here: the base shares this environment, so
            # the header keeps only what cannot move bits.
            decision = dataclasses.replace(difference, bits=(), dimensions=()).policy(drift_mode)
        else:
            comparison, env_header = judge_environment(
                comparison, flat_a, gf, spreads, difference, registry, budget=budget
            )
        against = "the goldens" if judged_by_base is None else "the base re-produced here"
        comparison = dataclasses.replace(comparison, inexact=inexact(comparison, why, against))
    except GoldenStoreError as e:
        raise CheckError(f"golden group {group!r} is unusable: {e}") from None
    header = {"golden": str(gf.path)}
    if gf.provenance.get("base_sha"):
        header["base_sha"] = str(gf.provenance["base_sha"])
    header |= {f"drift {i}": line for i, line in enumerate(decision.header)}
    if hint := order_hint(gf.provenance.get("order"), placed):
        header["order"] = hint
    calibration = gf.provenance.get("calibration")
    if isinstance(calibration, dict) and calibration.get("summary"):
        header["calibration"] = str(cast(dict[str, Any], calibration)["summary"])
    header |= {"judge": judge, **env_header}
    saved = command = None
    if save_actual is not None and not comparison.passed:
        from parity.store.writer import save_arrays

        path = save_arrays(save_actual, name or group, flat_a, classes=names,
                           order=placed, provenance=current)  # fmt: skip
        reference = gf.path if judged_by_base is None else Path(base_path)
        saved, command = str(path), _diff_command(path, reference, overrides, class_map)
    return CheckResult(
        name=name or group,
        comparison=comparison,
        group=group,
        node=node,
        header=header,
        checked_keys=tuple(sorted(golden_arrays)),
        started=started,
        produce_s=produce_s,
        load_s=load_s,
        compare_s=compare_s,
        saved=saved,
        command=command,
    )


class CheckOptions(TypedDict, total=False):
    """The options of a check of a golden group, as `check_file` takes them."""

    class_map: ClassMapLike
    overrides: Overrides
    order: Order | None
    drift_mode: PolicyMode
    registry: Mapping[str, ToleranceClass]
    name: str | None
    node: str | None
    produce_s: float | None
    save_actual: str | os.PathLike[str] | None
    keys: Sequence[str] | None
    base: BaseSource | None
    require_base: bool


def check_group(
    actual: Any,
    group: str,
    *,
    goldens: GoldenDir | str | os.PathLike[str],
    current_provenance: Mapping[str, Any] | None = None,
    **options: Unpack[CheckOptions],
) -> CheckResult:
    """Compare `actual` against the golden group `group` (`check_file` of
    `<goldens>/<group>.h5`).

    **Arguments:**

    - `actual`: a pytree of arrays (`{key: array}`, nested containers, equinox modules).
    - `group`: the golden group's name (`<goldens>/<group>.h5`).
    - `goldens`: the golden folder (a `GoldenDir` keeps files open across checks).
    - `current_provenance`: the environment `actual` was produced in, when that was another
      process (`parity check`); default this process's.
    - `options`: as `check_file` takes them (`class_map`, `overrides`, `order`,
      `drift_mode`, `registry`, `name`, `node`, `produce_s`, `save_actual`, `keys`, `base`,
      `require_base`).

    **Returns:** a `CheckResult`; its header's `judge` line names the judge used. Raises
    `CheckError` for unusable input, and where the base re-produced here is outside the
    goldens' recorded noise.
    """
    from parity.store.provenance import collect_provenance

    gf = _as_dir(goldens).open(group)
    current = current_provenance if current_provenance is not None else collect_provenance()
    return check_file(actual, gf, current=current, **options)


def check_live(
    actual: Any,
    expected: Any,
    *,
    class_map: ClassMapLike = DEFAULT_CLASS,
    overrides: Overrides = (),
    order: Order | None = None,
    registry: Mapping[str, ToleranceClass] = REGISTRY,
    name: str = "live",
    node: str | None = None,
    produce_s: float | None = None,
    save_actual: str | os.PathLike[str] | None = None,
    non_arrays: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> CheckResult:
    """Compare `actual` against a live reference `expected` (the old implementation run
    on the same inputs), both pytrees of arrays (a bare array is a tree of one leaf, named
    `BARE_KEY`).

    **Arguments:** as `check_group`, with `expected` in place of the golden group and
    `class_map` defaulting to `bitwise`. With `save_actual`, a failing check writes
    `<name>.h5` (actual) and `<name>.expected.h5` (reference). With `non_arrays`, two
    dicts that receive the leaves of `actual` and `expected` that are not arrays, by key
    (`assert_equivalent` compares them with `==`); without, such leaves are an error.

    **Returns:** a `CheckResult` (its `group` is None).
    """
    started = time.time()
    resolve = class_resolver(overrides=overrides, class_map=class_map)
    comparison, flat_a, compare_s = _compare(
        actual, expected, resolve, registry=registry, order=order, name=name, bare=BARE_KEY,
        reference="expected", non_arrays=non_arrays,
    )  # fmt: skip
    saved = command = None
    if save_actual is not None and not comparison.passed:
        from parity.store.writer import save_arrays

        keys = [f.key for f in comparison.findings]
        path = save_arrays(save_actual, name, flat_a, classes=resolve, order=keys)
        ref = save_arrays(save_actual, f"{name}.expected", flatten(expected, bare=BARE_KEY),
                          classes=resolve, order=keys)  # fmt: skip
        saved, command = str(path), _diff_command(path, ref, overrides, class_map)
    return CheckResult(
        name=name,
        comparison=comparison,
        node=node,
        started=started,
        produce_s=produce_s,
        compare_s=compare_s,
        saved=saved,
        command=command,
    )
