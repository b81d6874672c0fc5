"""The `calibrated` class in a check (docs/design.md, "Tolerance from measured noise").

A key under `calibrated` is judged against its own recorded spread: `bind_calibrated` gives
each such key the class resolved with the spread its golden file records
(`parity.calibrated._spreads.Spreads`) bound as the rule's parameter `spread`, as data: the
exact float, never text in the class's name, which stays as the class map writes it
(`calibrated`, `calibrated[k=8]`). Where the check's environment differs from the pin's in
a calibrated dimension (device count, processes, ISA cap, processor:
`parity._environment.EnvironmentDifference.dimensions`), `calibrated_comparison` judges
each key that fails its pinned class again under its calibrated bound there: the looser of
the two decides. `parity.check.check_file` applies both, for a check of a golden group and for
`parity diff` alike.

**What covers another environment** where the recorded noise does not is said in one place,
`environment_remedy`, by what moved: recording its noise with `parity calibrate` on main
only where calibration perturbs every change (a device or process layout, an ISA cap), and
adopting it with `parity repin` at the goldens' base commit here (a processor, a backend, a
jax or jaxlib release: no calibration measures those).

**The classes of a golden's keys** are composed once, in `golden_classes`: the class map
pinned in the file, the one precedence (`parity.judge._tolerance.class_resolver`: overrides,
the caller's map, the pinned map, the class recorded with each array, `bitwise`) and each
calibrated key's recorded spread bound on its rule. A check (`parity.check`), `parity show`
(`parity.commands._files`) and `parity calibrate`'s measure (`parity.calibration._measure`)
all call it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity._environment import backend_of, layout_of
from parity._results import CheckError
from parity.calibrated._spreads import Spreads
from parity.judge._chunks import DEFAULT_BUDGET
from parity.judge._classes import REGISTRY, ToleranceClass
from parity.judge._compare import Comparison, Finding, compare_arrays
from parity.judge._floats import count
from parity.judge._tolerance import (
    ClassMap,
    ClassMapLike,
    KeyClass,
    Overrides,
    class_resolver,
    get_class,
    parse_class_name,
)

if TYPE_CHECKING:
    from parity._environment import EnvironmentDifference
    from parity.store import GoldenFile
    from parity.store._provenance_record import Provenance

__all__ = [
    "BY_CALIBRATION",
    "CALIBRATED",
    "KeyClasses",
    "bind_calibrated",
    "bind_spread",
    "calibrate_command",
    "calibrated_comparison",
    "calibration_columns",
    "environment_remedy",
    "golden_classes",
    "pinned_class_map",
]

#: The class of the calibrated bounds: its `k` and floor, from the registry's `calibrated`.
CALIBRATED = "calibrated"
#: How the note of a finding that passed by its calibrated bound alone starts.
BY_CALIBRATION = "judged by calibration"


def calibrate_command(group: str) -> str:
    """The command that records the per-key spreads of `group`."""
    return f"parity calibrate --groups {group} --perturb isa,devices,processes,repeat --write"


def environment_remedy(
    group: str, base: str, difference: EnvironmentDifference, current: Provenance
) -> str:
    """What makes a group's goldens cover an environment their recorded noise does not, in
    words, as what moved allows:

    - recording its noise on main (`calibrate_command`), only where `parity calibrate`
      perturbs every change (`EnvironmentDifference.unperturbed` is empty: a device or
      process layout, an ISA cap);
    - adopting it: the group repinned at its base commit in this environment (`parity repin
      --base SHA --groups G`, with `--devices` and `--isa` where the layout or the ISA cap
      moved), wherever a repin can run it (one process: a repin runs one).

    Where neither can (several processes, and a change no calibration perturbs), running
    where the goldens were pinned.

    **Arguments:**

    - `group`: the golden group.
    - `base`: the goldens' base commit (`""` where they record none).
    - `difference`: how this environment differs from the pin's.
    - `current`: this environment's provenance (its layout and ISA cap).

    **Returns:** one phrase, for a header line.
    """
    unperturbed = difference.unperturbed
    repin = _repin_command(group, base, difference, current)
    if not unperturbed:
        record = f"record this environment's noise on main with `{calibrate_command(group)}`"
        return f"{record}, or adopt it with `{repin}`" if repin else record
    why = (
        f"no calibration measures {', '.join(unperturbed)}: it perturbs ISA caps and device "
        "and process layouts only"
    )
    if repin:
        return f"adopt this environment with `{repin}` ({why})"
    return f"run where the goldens were pinned ({why}, and a repin runs one process)"


def _repin_command(
    group: str, base: str, difference: EnvironmentDifference, current: Provenance
) -> str | None:
    """The repin that pins `group` at `base` in the environment `current` describes, or
    None where a repin cannot run it (several processes)."""
    processes, devices = layout_of(current)
    if processes > 1:
        return None
    words = ["parity repin", f"--base {base[:12] or '<SHA>'}", f"--groups {group}"]
    kinds = {d.kind for d in difference.dimensions}
    if backend_of(current) == "cpu":  # a repin simulates CPU devices and caps a CPU's ISA
        if kinds & {"devices", "processes"}:
            words.append(f"--devices {devices}")
        if "isa" in kinds:
            words.append(f"--isa {current.isa_cap or 'none'}")
    return " ".join(words)


def bind_calibrated(
    resolve: Callable[[str], str],
    spreads: Spreads,
    group: str,
    path: Path,
    registry: Mapping[str, ToleranceClass] = REGISTRY,
) -> Callable[[str], KeyClass]:
    """`resolve`, with each key under the `calibrated` class (and no spread written in the
    class map) resolved to its `ToleranceClass` with its recorded spread (its envelope over
    every perturbation, `parity.calibrated._spreads.Spreads.envelope`) bound as the rule's `spread`;
    every other key keeps its class name. `CheckError` naming the calibrate command where
    no spread is recorded; `UnknownClassError` for a calibrated class `registry` cannot
    build."""

    def bound(key: str) -> KeyClass:
        name = resolve(key)
        base, params = parse_class_name(name)
        if base != CALIBRATED or "spread" in params:
            return name
        spread = spreads.envelope(key)
        if spread is None:
            raise CheckError(
                f"key {key!r} of group {group!r} is under the class {name!r}, but {path} "
                f"records no calibration of it; measure and record it with "
                f"`{calibrate_command(group)}`"
            )
        return bind_spread(name, spread, registry)

    return bound


def bind_spread(
    name: str, spread: float, registry: Mapping[str, ToleranceClass] = REGISTRY
) -> ToleranceClass:
    """The class `name` (a `calibrated` one) with `spread` bound on its rule as data, the
    exact float (`parity.judge._tolerance.get_class`'s `params`): the one way a spread is
    bound, for a check's keys, its comparison by calibration and `parity calibrate`'s
    measure."""
    return get_class(name, registry, params={"spread": spread})


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


@dataclass(frozen=True)
class KeyClasses:
    """The classes of a golden's keys (`golden_classes`).

    **Fields:**

    - `names`: key -> class name, by the one precedence (`class_resolver`'s).
    - `bound`: key -> its class for a comparison: the name, or for a key under `calibrated`
      its `ToleranceClass` with the recorded spread bound (`bind_calibrated`; a
      `CheckError` naming the calibrate command where none is recorded).
    - `keys`: the golden's keys (those asked for), in forward order: the pinned order, then
      the keys pinned without a place, by name (the order a comparison reports them in).
    - `spreads`: the spreads the file records.
    """

    names: Callable[[str], str]
    bound: Callable[[str], KeyClass]
    keys: tuple[str, ...]
    spreads: Spreads

    def unbound(self, key: str) -> bool:
        """Whether `key` is under `calibrated` with no spread written in its class name
        nor recorded in the file (`bound` refuses it; `parity calibrate` measures it)."""
        base, params = parse_class_name(self.names(key))
        return base == CALIBRATED and "spread" not in params and self.spreads.envelope(key) is None


def golden_classes(
    gf: GoldenFile,
    *,
    overrides: Overrides = (),
    class_map: ClassMapLike = None,
    keys: Sequence[str] | None = None,
    registry: Mapping[str, ToleranceClass] = REGISTRY,
) -> KeyClasses:
    """The classes of `gf`'s keys: the one place the pinned map, the precedence and the
    recorded spreads are composed.

    **Arguments:**

    - `gf`: the golden file (its pinned class map, the class recorded with each array, its
      forward order and its recorded spreads).
    - `overrides`, `class_map`: the check's rules and the caller's map, before the pinned
      map (`parity.judge._tolerance.class_resolver`).
    - `keys`: the keys whose recorded classes count (a check of part of a group); default
      every key of `gf`.
    - `registry`: the classes a calibrated key's class is built from.

    **Returns:** a `KeyClasses`. Raises `CheckError` where the pinned map is malformed.
    """
    chosen = set(gf) if keys is None else set(keys)
    wanted = [k for k in gf if k in chosen]
    names = class_resolver(
        overrides=overrides,
        class_map=class_map,
        pinned=pinned_class_map(gf),
        recorded={k: gf.info(k).class_name for k in wanted},
    )
    spreads = Spreads.of(gf.provenance)
    placed = [k for k in gf.ordered_keys() if k in chosen]
    ordered = (*placed, *sorted(set(wanted) - set(placed)))
    bound = bind_calibrated(names, spreads, gf.path.stem, gf.path, registry)
    return KeyClasses(names, bound, ordered, spreads)


def calibration_columns(spreads: Spreads, difference: EnvironmentDifference) -> list[str] | None:
    """The recorded columns whose spreads bound `difference`'s calibrated dimensions
    (`Spreads.columns_for`), or None where there is none to bound (the pin's environment,
    or a change that is no dimension) or some dimension has no column of its kind (another
    backend never has one): there the pinned classes stand."""
    if not difference.dimensions or not spreads:
        return None
    return spreads.columns_for(difference.dimensions)


def calibrated_comparison(
    comparison: Comparison,
    flat_a: Mapping[str, Any],
    gf: GoldenFile,
    spreads: Spreads,
    difference: EnvironmentDifference,
    registry: Mapping[str, ToleranceClass],
    *,
    current: Provenance,
    budget: int = DEFAULT_BUDGET,
) -> tuple[Comparison, str]:
    """`comparison` by calibration: where the check's environment differs from the pin's
    in calibrated dimensions, each key that fails its pinned class judged again under its
    calibrated bound for those dimensions (`max(floor, k * spread)`, the spread measured
    there: `calibration_columns`): the looser of the two decides. In the pin's environment
    nothing changes, and where no calibration of it is recorded and every key holds its
    pinned class, nothing is said (nothing needs one); where some key fails and none is
    recorded, the line says what would cover this environment (`environment_remedy`, from
    `current`, its provenance).
    `budget`: bytes one array comparison may hold at once (`parity.judge._chunks`).

    **Returns:** the comparison, with the findings that passed by calibration replaced
    (their note says so), and the header's `environment` line saying what differed and how
    many keys were judged by calibration ("" where nothing is said)."""
    dims = difference.dimensions
    if not dims:
        return comparison, ""
    change = ", ".join(d.change for d in dims)
    columns = calibration_columns(spreads, difference)
    if columns is None and comparison.passed:
        return comparison, ""  # every key holds its pinned class: nothing to calibrate
    if columns is None:
        base = gf.provenance.base_sha or ""
        remedy = environment_remedy(gf.path.stem, base, difference, current)
        return comparison, (
            f"differs from the pin's ({change}); no calibration of it is recorded, so the "
            f"pinned classes stand ({remedy})"
        )
    base = registry.get(CALIBRATED) or REGISTRY[CALIBRATED]
    judged = 0
    findings: list[Finding] = []
    for f in comparison.findings:
        spread = spreads.for_columns(f.key, columns)
        if f.verdict != "fail" or spread is None or f.key not in flat_a:
            findings.append(f)
            continue
        tol = bind_spread(CALIBRATED, spread, registry)
        again = compare_arrays(
            f.key, flat_a[f.key], gf.source(f.key), tol, order=f.order, budget=budget
        )
        if again.passed:
            judged += 1
            note = f"{BY_CALIBRATION} ({', '.join(columns)}): {f.class_name} alone fails"
            findings.append(dataclasses.replace(again, note=note, basis="calibration"))
        else:
            findings.append(f)
    line = (
        f"differs from the pin's ({change}); each key is judged by the looser of its pinned "
        f"class and its calibrated bound there ({base.describe_allowed()}, spread over "
        f"{', '.join(columns)}): {count(judged, 'key')} passed by calibration alone"
    )
    return Comparison(tuple(findings)), line
