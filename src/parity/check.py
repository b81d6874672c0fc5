"""The harness's core: open a golden folder, resolve each key's class, apply the drift
policy, compare, and hand back a `CheckResult`.

The CLI, the pytest plugin and `parity.assert_equivalent` are thin layers over this
module; none of them resolves classes or applies the drift policy on its own.

**Class resolution**, one precedence everywhere (`class_resolver`):

1. explicit overrides: `(pattern, class)` rules given for this check (for example
   `[("traj.*", "device_count")]` on 4 devices);
2. the class map the caller gives (a `ClassMap`, or a class name for every key);
3. the class map pinned in the golden file (and, for a key it does not cover, the class
   recorded with the array);
4. `bitwise`.

A level that has no answer for a key (a `ClassMap` without a default whose rules do not
match) passes the key to the next level.

A key under the `calibrated` class is judged against its recorded spread, and in an
environment other than the pin's each key by the looser of its class and its calibrated
bound there: `parity.calibrated` does both, here applied by `check_group`.

**Errors.** Input the check cannot use raises a `CheckError` (a missing or unusable golden
group, a refused drift, an unknown class); a comparison that fails is not an error: it is
a `CheckResult` whose `passed` is False. Both live in `parity.results`. Nothing here knows
about pytest.
"""

from __future__ import annotations

import fnmatch
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from parity.base_judge import BaseSource, BaseUnavailable, bits_changes, judge_by_base
from parity.calibrated import bind_calibrated, judge_environment, unbound
from parity.judge.classes import REGISTRY, ToleranceClass
from parity.judge.compare import Comparison, Order, compare_trees
from parity.judge.dataflow import order_hint
from parity.judge.rules import Ulp
from parity.judge.tolerance import ClassMap, UnknownClassError
from parity.judge.trees import flatten
from parity.noise import Spreads, differences
from parity.results import CheckError, CheckResult, save_arrays
from parity.store import GoldenFile, GoldenMissingError, GoldenStoreError, open_goldens
from parity.store.provenance import PolicyMode, bitwise_policy, collect_provenance, drift

__all__ = [
    "BARE_KEY",
    "DEFAULT_CLASS",
    "REPIN_HINT",
    "GoldenDir",
    "check_group",
    "check_live",
    "class_resolver",
    "drift_registry",
    "pinned_class_map",
]

#: The class of a key that no level of the precedence covers.
DEFAULT_CLASS = "bitwise"
#: The key of a bare array (a one-leaf pytree) in a live check or `assert_equivalent`.
BARE_KEY = "array"
#: How to pin a golden group; named in every "missing golden" message.
REPIN_HINT = "parity repin --base <SHA>"

Overrides = Sequence[tuple[str, str]]
ClassMapLike = ClassMap | str | None


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


def class_resolver(
    *,
    overrides: Overrides = (),
    class_map: ClassMapLike = None,
    pinned: ClassMap | None = None,
    recorded: Mapping[str, str] | None = None,
) -> Callable[[str], str]:
    """key -> class name, by the one precedence of this module's docstring.

    **Arguments:**

    - `overrides`: `(pattern, class)` rules tried first (`fnmatch.fnmatchcase`).
    - `class_map`: the caller's map, or a class name for every key.
    - `pinned`: the golden file's pinned map.
    - `recorded`: the classes recorded with the golden's arrays, by key.

    **Returns:** a function giving each key its class name (never raising).
    """
    rules = tuple((str(p), str(c)) for p, c in overrides)
    caller = ClassMap(default=class_map) if isinstance(class_map, str) else class_map
    recorded = recorded or {}

    def resolve(key: str) -> str:
        for pattern, name in rules:
            if fnmatch.fnmatchcase(key, pattern):
                return name
        for level in (caller, pinned):
            if level is None:
                continue
            try:
                return level.class_for(key)
            except KeyError:  # no rule matches and the map has no default
                pass
        return recorded.get(key) or DEFAULT_CLASS

    return resolve


def drift_registry(
    golden_provenance: Mapping[str, Any],
    mode: PolicyMode = "warn",
    *,
    registry: Mapping[str, ToleranceClass] = REGISTRY,
    current: Mapping[str, Any] | None = None,
) -> tuple[dict[str, ToleranceClass], dict[str, str]]:
    """Apply the bitwise drift policy (`parity.store.provenance.bitwise_policy`).

    **Arguments:**

    - `golden_provenance`: the provenance pinned in the golden file.
    - `mode`: `"warn"`, `"relax"` or `"strict"`.
    - `registry`: the classes to start from.
    - `current`: this process's provenance (collected if not given).

    **Returns:** the registry to compare with (under `"relax"` with a drift that can move
    bits, `bitwise` becomes an ulp rule) and the header lines the drift adds. Raises
    `CheckError` under `"strict"` with such a drift.
    """
    decision = bitwise_policy(
        drift(golden_provenance, current if current is not None else collect_provenance()),
        mode,
    )
    header = {f"drift {i}": line for i, line in enumerate(decision.header)}
    if decision.error:
        raise CheckError(" ".join(decision.header))
    out = dict(registry)
    if decision.bitwise_max_ulp is not None:
        out["bitwise"] = ToleranceClass(
            "bitwise",
            Ulp(max_ulp=decision.bitwise_max_ulp),
            meaning="bitwise, relaxed to ulp by the drift policy",
        )
    return out, header


def _second_judge(
    base: BaseSource,
    group: str,
    gf: GoldenFile,
    current: Mapping[str, Any],
    flat_a: Mapping[str, Any],
    resolve: Callable[[str], str],
    exact_registry: Mapping[str, ToleranceClass],
    held_registry: Mapping[str, ToleranceClass],
    order: Order | None,
    keys: Sequence[str],
) -> tuple[Comparison | None, str, str]:
    """The comparison against the base re-produced here, the header line naming that
    judge and the base's file; `(None, line, "")` where the base cannot be re-produced
    (the line says why, and the calibrated judgement of the goldens stands)."""
    try:
        reproduced = base.reproduce(group, gf.provenance, current)
    except BaseUnavailable as e:
        return (
            None,
            (
                f"the goldens, by calibration: the base cannot be re-produced here ({e.reason}); "
                f"{e.hint}"
            ),
            "",
        )
    comparison, line = judge_by_base(
        flat_a, gf, reproduced, resolve, registry=exact_registry, held_registry=held_registry,
        current=current, order=order, keys=keys, group=group,
    )  # fmt: skip
    return comparison, line, str(reproduced.path)


def _bits_drift_line(key: str, line: str) -> bool:
    return key.startswith("drift") and line.startswith("environment drift that can change")


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


def check_group(
    actual: Any,
    group: str,
    *,
    goldens: GoldenDir | str | os.PathLike[str],
    class_map: ClassMapLike = None,
    overrides: Overrides = (),
    order: Order | None = None,
    drift_mode: PolicyMode = "warn",
    registry: Mapping[str, ToleranceClass] = REGISTRY,
    name: str | None = None,
    node: str | None = None,
    produce_s: float | None = None,
    save_actual: str | os.PathLike[str] | None = None,
    current_provenance: Mapping[str, Any] | None = None,
    keys: Sequence[str] | None = None,
    base: BaseSource | None = None,
) -> CheckResult:
    """Compare `actual` against the golden group `group`.

    **Arguments:**

    - `actual`: a pytree of arrays (`{key: array}`, nested containers, equinox modules).
    - `group`: the golden group's name (`<goldens>/<group>.h5`).
    - `goldens`: the golden folder (a `GoldenDir` keeps files open across checks).
    - `class_map`, `overrides`: see the module docstring's precedence.
    - `order`: the forward order; default the golden's pinned order.
    - `drift_mode`: the bitwise drift policy (`parity.store.provenance`).
    - `registry`: the classes by name.
    - `name`, `node`: for reports (`name` defaults to the group).
    - `produce_s`: seconds the caller spent producing `actual`, for the timing summary.
    - `save_actual`: a folder; when the check fails, the obtained arrays are written there
      as `<name>.h5` in golden format (see `CheckResult.command`).
    - `current_provenance`: the environment `actual` was produced in, when that was another
      process (`parity check`); default this process's.
    - `keys`: check only these keys of the group (a producer of part of it); default all.
    - `base`: the second judge (`parity.base_judge`): where the environment differs from
      the pin's in a way that can move bits and some key fails its pinned class, the group
      re-produced at its base commit here judges the tree, exactly. None: the goldens
      judge, by calibration where the environment differs.

    **Returns:** a `CheckResult`; its header's `judge` line names the judge used. Raises
    `CheckError` for unusable input, and where the base re-produced here is outside the
    goldens' recorded noise.
    """
    started = time.time()
    t0 = time.perf_counter()
    folder = _as_dir(goldens)
    gf = folder.open(group)
    try:
        # Sources, not arrays: each is read in chunks when compared, checksum verified.
        chosen = None if keys is None else set(keys)
        wanted = [k for k in gf if chosen is None or k in chosen]
        golden_arrays = {k: gf.source(k) for k in wanted}
        recorded = {k: gf.info(k).class_name for k in wanted}
    except GoldenStoreError as e:
        raise CheckError(f"golden group {group!r} is unusable: {e}") from None
    pinned = pinned_class_map(gf)
    current = current_provenance if current_provenance is not None else collect_provenance()
    exact_registry = registry
    registry, drift_header = drift_registry(
        gf.provenance, drift_mode, registry=registry, current=current
    )
    header = {"golden": str(folder.path_of(group)), "base_sha": str(gf.provenance.get("base_sha"))}
    header |= drift_header
    if hint := order_hint(gf.provenance.get("order"), gf.ordered_keys()):
        header["order"] = hint
    calibration = gf.provenance.get("calibration")
    if isinstance(calibration, dict) and calibration.get("summary"):
        header["calibration"] = str(cast(dict[str, Any], calibration)["summary"])
    spreads = Spreads.of(gf.provenance)
    resolve = bind_calibrated(
        class_resolver(overrides=overrides, class_map=class_map, pinned=pinned, recorded=recorded),
        spreads,
        group,
        folder.path_of(group),
    )
    for key in golden_arrays:
        resolve(key)  # a calibrated key without a recorded spread is an error before any work
    load_s = time.perf_counter() - t0
    forward = [k for k in gf.ordered_keys() if k in golden_arrays] if order is None else order
    changes = bits_changes(gf.provenance, current)
    try:
        comparison, flat_a, compare_s = _compare(
            actual, golden_arrays, resolve, registry=registry, order=forward, name=name or group
        )
        judged_by_base, base_path = None, ""
        if not changes:
            header["judge"] = "the goldens (this is the environment they were pinned in)"
        elif comparison.passed:
            header["judge"] = "the goldens: every key holds its pinned class here"
        elif base is None:
            header["judge"] = "the goldens, by calibration (the second judge is off)"
        else:
            judged_by_base, header["judge"], base_path = _second_judge(
                base, group, gf, current, flat_a, resolve, exact_registry, registry, forward,
                list(golden_arrays),
            )  # fmt: skip
        if judged_by_base is not None:
            comparison = judged_by_base
            # The drift cannot explain a failure here: the base shares this environment.
            header = {k: v for k, v in header.items() if not _bits_drift_line(k, v)}
        else:
            comparison, env_header = judge_environment(
                comparison, flat_a, gf, spreads, differences(gf.provenance, current), registry
            )
            header |= env_header
        comparison = Comparison(tuple(unbound(f) for f in comparison.findings))
    except GoldenStoreError as e:
        raise CheckError(f"golden group {group!r} is unusable: {e}") from None
    saved = command = None
    if save_actual is not None and not comparison.passed:
        path = save_arrays(save_actual, name or group, flat_a, classes=resolve,
                           order=gf.ordered_keys(), provenance=current)  # fmt: skip
        reference = folder.path_of(group) if judged_by_base is None else Path(base_path)
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


def _compare(
    actual: Any,
    expected: Any,
    resolve: Callable[[str], str],
    *,
    registry: Mapping[str, ToleranceClass],
    order: Order | None,
    name: str,
    bare: str | None = None,
    reference: str = "golden",
) -> tuple[Comparison, dict[str, Any], float]:
    t0 = time.perf_counter()
    try:
        flat_a = flatten(actual, bare=bare)
        flat_e = flatten(expected, bare=bare)
    except (TypeError, ValueError) as e:
        raise CheckError(f"check {name!r}: {e}") from None
    try:
        comparison = compare_trees(
            flat_a, flat_e, resolve, registry=registry, order=order, reference=reference
        )
    except (TypeError, UnknownClassError) as e:
        raise CheckError(f"check {name!r}: {e}") from None
    return comparison, flat_a, time.perf_counter() - t0


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
) -> CheckResult:
    """Compare `actual` against a live reference `expected` (the old implementation run
    on the same inputs), both pytrees of arrays (a bare array is a tree of one leaf, named
    `BARE_KEY`).

    **Arguments:** as `check_group`, with `expected` in place of the golden group and
    `class_map` defaulting to `bitwise`. With `save_actual`, a failing check writes
    `<name>.h5` (actual) and `<name>.expected.h5` (reference).

    **Returns:** a `CheckResult` (its `group` is None).
    """
    started = time.time()
    resolve = class_resolver(overrides=overrides, class_map=class_map)
    comparison, flat_a, compare_s = _compare(
        actual, expected, resolve, registry=registry, order=order, name=name, bare=BARE_KEY,
        reference="expected",
    )  # fmt: skip
    saved = command = None
    if save_actual is not None and not comparison.passed:
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
