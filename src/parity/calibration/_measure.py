"""What `parity calibrate` measures: how far each key moved under benign perturbations of
the pinned environment, next to the bound of the class it is checked with.

`measure` compares every array each perturbation produced with its golden under its class.
Per key (`KeySpread`) it keeps the largest spread over the perturbations: max `|a-b|`, max
ulp, max `|a-b|` relative to the golden's largest magnitude, and the rule's own figure set
against its bound (`ratio`). Per class (`class_spreads`, `ClassSpread`) it names the key
and perturbation where the class came closest to its bound and flags:

- `below noise`: some benign perturbation already breaks the bound (`ratio > 1`): a false
  alarm waiting for the next host or device count;
- `blunt`: the bound is more than 100x the largest measured noise (`ratio < 0.01`, or no
  noise at all under a tolerant class), so it could hide a real bug of that size;
- `ok` otherwise (a bitwise class that held under every perturbation is `ok`).

Running the perturbations is `parity.calibration._calibrate`'s. Nothing here imports jax.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from parity.calibrated._bounds import bind_spread, golden_classes
from parity.judge._classes import REGISTRY, ToleranceClass
from parity.judge._compare import Finding, compare_arrays
from parity.judge._floats import from_json_float, json_float, largest_finite_abs
from parity.judge._tolerance import Overrides, to_class
from parity.judge._ulp import is_float_dtype, to_float64
from parity.store import GoldenFile

__all__ = [
    "BLUNT_FACTOR",
    "ClassSpread",
    "KeySpread",
    "Verdict",
    "class_spreads",
    "measure",
]

#: A class whose bound is more than this many times the measured noise is blunt.
BLUNT_FACTOR = 100.0

Verdict = Literal["ok", "below noise", "blunt"]


@dataclass(frozen=True)
class KeySpread:
    """The largest spread of one key over the perturbations.

    **Fields:**

    - `group`, `key`, `class_name`, `allowed`: where, and the class it is checked under.
    - `unit`: the unit of `figure` and `bound` (`abs`, `ulp` or the rule's own, `kl`).
    - `bound`: the class's bound for this array (0 for bitwise).
    - `max_abs`, `max_ulp`, `max_rel_to_max`: the largest `|a-b|`, ulp distance and `|a-b|`
      over the golden's largest finite magnitude; `None` where not measurable (ints have
      no ulps).
    - `figure`: the rule's figure in `unit`, largest over the perturbations.
    - `ratio`: `figure / bound` (`inf` for any difference under a zero bound, 0 for none).
    - `worst`: the perturbation that gave `ratio`, or `None` if every one was bitwise equal.
    - `failing`: the perturbations under which the key broke its class.
    - `unmeasured`: `label: reason` for perturbations where the key could not be compared
      (missing, another shape or dtype).
    - `by_perturbation`: `(label, max_abs, ratio)` per perturbation that measured the key.
    """

    group: str
    key: str
    class_name: str
    allowed: str
    unit: str
    bound: float
    max_abs: float | None
    max_ulp: int | None
    max_rel_to_max: float | None
    figure: float
    ratio: float
    worst: str | None
    failing: tuple[str, ...] = ()
    unmeasured: tuple[str, ...] = ()
    by_perturbation: tuple[tuple[str, float, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (non-finite floats as strings)."""
        out = {f.name: _json(getattr(self, f.name)) for f in dataclasses.fields(self)}
        out["by_perturbation"] = [[lb, a, _json(r)] for lb, a, r in self.by_perturbation]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KeySpread:
        """Read `to_dict`'s output back (after a JSON round trip)."""
        kw = {
            f.name: from_json_float(data[f.name]) for f in dataclasses.fields(cls) if f.name in data
        }
        for name in ("failing", "unmeasured"):
            kw[name] = tuple(kw.get(name, ()))
        kw["by_perturbation"] = tuple(
            (str(lb), float(a), float(from_json_float(r)))
            for lb, a, r in data.get("by_perturbation", ())
        )
        return cls(**kw)


@dataclass(frozen=True)
class ClassSpread:
    """One class's measured noise against its bound, over every key it covers.

    **Fields:** `class_name`, `allowed`, `keys` (arrays measured), `max_abs`, `max_ulp`,
    `max_rel_to_max` (largest over its keys), `ratio` (the largest `KeySpread.ratio`),
    `worst_key` and `worst` (where and under which perturbation), `bound` (that key's
    bound), `figure` (that key's figure, in `unit`), `failing` (keys that broke the
    class under some perturbation) and `verdict` (`ok`, `below noise`, `blunt`; see the
    module docstring).
    """

    class_name: str
    allowed: str
    unit: str
    keys: int
    max_abs: float | None
    max_ulp: int | None
    max_rel_to_max: float | None
    ratio: float
    figure: float
    bound: float
    worst_key: str | None
    worst: str | None
    failing: int
    verdict: Verdict

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (non-finite floats as strings)."""
        return {f.name: _json(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _json(x: Any) -> Any:
    if isinstance(x, float):
        return json_float(x)
    if isinstance(x, tuple):
        return list(x)  # pyright: ignore[reportUnknownArgumentType]
    return x


def _max(values: Iterable[Any]) -> Any:
    kept = [v for v in values if v is not None]
    return max(kept) if kept else None


def _figure(f: Finding) -> float:
    if f.figure is not None:
        return f.figure
    if f.unit == "ulp" and f.max_ulp is not None:
        return float(f.max_ulp)
    return float(f.max_abs or 0.0)


def _ratio(figure: float, bound: float) -> float:
    if figure == 0:
        return 0.0
    return figure / bound if bound > 0 else math.inf


def _scale(golden: np.ndarray) -> float:
    if not is_float_dtype(golden.dtype):
        return largest_finite_abs(golden.astype(np.float64))
    return largest_finite_abs(to_float64(golden))


def measure(
    runs: Mapping[str, Mapping[str, Any]],
    golden: GoldenFile,
    group: str,
    *,
    overrides: Overrides = (),
    registry: Mapping[str, ToleranceClass] = REGISTRY,
) -> list[KeySpread]:
    """Per key of `golden`, the largest spread over the runs.

    **Arguments:**

    - `runs`: perturbation label -> the arrays produced under it (`{key: array}`).
    - `golden`: the group's golden file.
    - `group`: its name, for the spreads.
    - `overrides`: `(pattern, class)` rules before the pinned class map (to measure a
      candidate class before pinning it).
    - `registry`: the classes by name.

    **Returns:** one `KeySpread` per golden key, in the golden's forward order.
    """
    classes = golden_classes(golden, overrides=overrides, registry=registry)
    out: list[KeySpread] = []
    for key in classes.keys:
        g = np.asarray(golden[key])
        name = classes.names(key)
        # A `calibrated` key is measured against its recorded spread; never calibrated
        # before, against this measurement's own (its ratio is then 1/k by construction).
        unbound = classes.unbound(key)
        if unbound:
            tol = bind_spread(name, 0.0, registry)
        else:
            tol = to_class(classes.bound(key), registry)
        scale = _scale(g)
        findings: list[tuple[str, Finding]] = []
        unmeasured: list[str] = []
        for label, arrays in runs.items():
            if key not in arrays:
                unmeasured.append(f"{label}: not produced")
                continue
            f = compare_arrays(key, arrays[key], g, tol)
            if f.max_abs is None:
                unmeasured.append(f"{label}: {f.reason}")
                continue
            findings.append((label, f))
        if unbound and findings:
            tol = bind_spread(name, max(f.max_abs or 0.0 for _, f in findings), registry)
            findings = [
                (label, compare_arrays(key, runs[label][key], g, tol)) for label, _ in findings
            ]
        bound = next((f.bound for _, f in findings if f.bound is not None), 0.0) or 0.0
        ratios = [(_ratio(_figure(f), f.bound or 0.0), label, f) for label, f in findings]
        # Ties (several perturbations break a bitwise class: inf) go to the larger |a-b|.
        worst = max(ratios, key=lambda r: (r[0], r[2].max_abs or 0.0), default=None)
        max_abs = _max(f.max_abs for _, f in findings)
        out.append(
            KeySpread(
                group=group,
                key=key,
                class_name=tol.name,
                allowed=tol.describe_allowed(),
                unit=tol.rule.unit,
                bound=float(bound),
                max_abs=max_abs,
                max_ulp=_max(f.max_ulp for _, f in findings),
                max_rel_to_max=None
                if max_abs is None
                else (max_abs / scale if scale else (0.0 if max_abs == 0 else math.inf)),
                figure=max((_figure(f) for _, f in findings), default=0.0),
                ratio=0.0 if worst is None else worst[0],
                worst=None if worst is None or worst[0] == 0 else worst[1],
                failing=tuple(label for label, f in findings if not f.passed),
                unmeasured=tuple(unmeasured),
                by_perturbation=tuple((lb, float(f.max_abs or 0.0), r) for r, lb, f in ratios),
            )
        )
    return out


def class_spreads(keys: Sequence[KeySpread]) -> list[ClassSpread]:
    """Per class (in order of first appearance), its keys' spreads gathered and judged.

    **Arguments:**

    - `keys`: the spreads of `measure`, of one group or several.

    **Returns:** one `ClassSpread` per class.
    """
    by_class: dict[str, list[KeySpread]] = {}
    for k in keys:
        by_class.setdefault(k.class_name, []).append(k)
    out: list[ClassSpread] = []
    for name, ks in by_class.items():
        worst = max(ks, key=lambda k: (k.ratio, k.max_abs or 0.0))
        tolerant = any(k.bound > 0 for k in ks)
        if worst.ratio > 1:
            verdict: Verdict = "below noise"
        elif tolerant and worst.ratio < 1 / BLUNT_FACTOR:
            verdict = "blunt"
        else:
            verdict = "ok"
        out.append(
            ClassSpread(
                class_name=name,
                # A calibrated class allows each key its own spread: say so, with the worst's.
                allowed=ks[0].allowed
                if len({k.allowed for k in ks}) == 1
                else f"per key (worst: {worst.allowed})",
                unit=ks[0].unit,
                keys=len(ks),
                max_abs=_max(k.max_abs for k in ks),
                max_ulp=_max(k.max_ulp for k in ks),
                max_rel_to_max=_max(k.max_rel_to_max for k in ks),
                ratio=worst.ratio,
                figure=worst.figure,
                bound=worst.bound,
                worst_key=f"{worst.group}/{worst.key}" if worst.worst else None,
                worst=worst.worst,
                failing=sum(bool(k.failing) for k in ks),
                verdict=verdict,
            )
        )
    return out
