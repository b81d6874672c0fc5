"""`parity calibrate`: how large the harmless noise of the environment is, next to each
class's bound.

The goldens are pinned in one environment (an ISA cap and a device count, see
`parity.run.devices`). Calibration runs the same producers on the same code under benign
perturbations of that environment, each in a fresh process through `parity.run.runner.produce`
(another XLA CPU ISA cap the host supports, another simulated device count, or the same
environment again), and compares every array with its golden under the class it is
checked with. Per key it keeps the largest spread over the perturbations: max `|a-b|`, max
ulp, max `|a-b|` relative to the golden's largest magnitude, and the rule's own figure set
against its bound (`ratio`). Per class it names the key and perturbation where the class
came closest to its bound and flags:

- `below noise`: some benign perturbation already breaks the bound (`ratio > 1`): a false
  alarm waiting for the next host or device count;
- `blunt`: the bound is more than 100x the largest measured noise (`ratio < 0.01`, or no
  noise at all under a tolerant class), so it could hide a real bug of that size;
- `ok` otherwise (a bitwise class that held under every perturbation is `ok`).

A perturbation is benign by assumption: calibration measures the environment, not the
code. `parity.run.calibration_record.record` writes the measurement into a golden file's
provenance (`calibration`), so that `parity check` shows it in the report's header.

Nothing here imports jax.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from parity.calibrated import with_spread
from parity.check import Overrides, class_resolver, pinned_class_map
from parity.judge.classes import REGISTRY, ToleranceClass
from parity.judge.compare import Finding, compare_arrays
from parity.judge.floats import from_json_float, json_float, largest_finite_abs
from parity.judge.tolerance import get_class, parse_class_name
from parity.judge.ulp import is_float_dtype, to_float64
from parity.noise import Spreads
from parity.report import text_table
from parity.run.config import ParityConfig
from parity.run.perturbations import (
    DEVICE_COUNTS,
    ISA_CAPS,
    CalibrationError,
    Perturbation,
    host_isa_caps,
    perturbations,
)
from parity.store import GoldenFile

__all__ = [
    "DEVICE_COUNTS",
    "ISA_CAPS",
    "Calibration",
    "CalibrationError",
    "ClassSpread",
    "KeySpread",
    "Perturbation",
    "calibrate",
    "class_spreads",
    "format_calibration",
    "host_isa_caps",
    "measure",
    "perturbations",
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
    resolve = class_resolver(
        overrides=overrides,
        pinned=pinned_class_map(golden),
        recorded={k: golden.info(k).class_name for k in golden},
    )
    out: list[KeySpread] = []
    ordered = golden.ordered_keys()
    recorded = Spreads.of(golden.provenance)
    for key in ordered + sorted(set(golden) - set(ordered)):
        g = np.asarray(golden[key])
        name = resolve(key)
        base, params = parse_class_name(name)
        # A `calibrated` key is measured against its recorded spread; never calibrated
        # before, against this measurement's own (its ratio is then 1/k by construction).
        pending = base == "calibrated" and "spread" not in params
        spread = recorded.envelope(key) if pending else None
        tol = get_class(with_spread(name, spread or 0.0) if pending else name, registry)
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
        if pending and spread is None and findings:
            tol = get_class(with_spread(name, max(f.max_abs or 0.0 for _, f in findings)),
                            registry)  # fmt: skip
            findings = [(label, compare_arrays(key, runs[label][key], g, tol))
                        for label, _ in findings]  # fmt: skip
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
                allowed=ks[0].allowed,
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


@dataclass(frozen=True)
class Calibration:
    """What `calibrate` measured.

    **Fields:** `baseline` (the pinned environment: `isa`, `devices`), `perturbations`,
    `seconds` (per perturbation label, the producer run's wall time), `keys` (every
    `KeySpread`, by group in order) and `host` (the host's supported ISA caps).
    """

    baseline: dict[str, Any]
    perturbations: tuple[Perturbation, ...]
    seconds: dict[str, float]
    keys: tuple[KeySpread, ...]
    host: tuple[str, ...] = ()

    @property
    def groups(self) -> list[str]:
        """The groups measured, in order."""
        return list(dict.fromkeys(k.group for k in self.keys))

    def classes(self, group: str | None = None) -> list[ClassSpread]:
        """The class spreads over every group, or over one."""
        return class_spreads([k for k in self.keys if group is None or k.group == group])

    def to_dict(self) -> dict[str, Any]:
        """The measurement as JSON-safe data: baseline, perturbations, per-class spreads
        (over all groups and per group) and every key's spread."""
        return {
            "baseline": self.baseline,
            "host_isa_caps": list(self.host),
            "perturbations": [dataclasses.asdict(p) for p in self.perturbations],
            "seconds": self.seconds,
            "classes": [c.to_dict() for c in self.classes()],
            "groups": {g: [c.to_dict() for c in self.classes(g)] for g in self.groups},
            "keys": [k.to_dict() for k in self.keys],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibration:
        """Read `to_dict`'s output back (a measurement saved with `--json`)."""
        return cls(
            baseline=dict(data["baseline"]),
            perturbations=tuple(Perturbation(**p) for p in data["perturbations"]),
            seconds=dict(data.get("seconds", {})),
            keys=tuple(KeySpread.from_dict(k) for k in data["keys"]),
            host=tuple(data.get("host_isa_caps", ())),
        )

    def spreads(self, group: str) -> dict[str, dict[str, float | None]]:
        """Per key of `group`, per perturbation label, the largest `|a-b|` against the
        golden (`None` where the key could not be compared under that perturbation)."""
        out: dict[str, dict[str, float | None]] = {}
        for k in self.keys:
            if k.group != group:
                continue
            got: dict[str, float | None] = {p.label: None for p in self.perturbations}
            for label, max_abs, _ in k.by_perturbation:
                got[label] = float(max_abs)
            out[k.key] = got
        return out

    def summary(self, group: str | None = None) -> str:
        """One line: per class, worst figure against its bound and the verdict."""
        parts = []
        for c in self.classes(group):
            parts.append(f"{c.class_name} {_num(c.figure)}/{_num(c.bound)} {c.unit} ({c.verdict})")
        labels = ",".join(p.label for p in self.perturbations)
        return f"under {labels}: " + "; ".join(parts)


def calibrate(
    config: ParityConfig,
    goldens: Mapping[str, GoldenFile],
    perturbs: Sequence[Perturbation],
    *,
    overrides: Overrides = (),
    progress: Callable[[str], None] = lambda _: None,
    registry: Mapping[str, ToleranceClass] = REGISTRY,
) -> Calibration:
    """Run the producers under every perturbation and measure the spread per key.

    **Arguments:**

    - `config`: the project's settings; its ISA cap and device count are the baseline the
      goldens were pinned in.
    - `goldens`: group -> its golden file (the groups to calibrate).
    - `perturbs`: the environments to produce in (`perturbations`).
    - `overrides`: classes to measure instead of the pinned ones (`measure`).
    - `progress`: receives progress lines.
    - `registry`: the classes by name.

    **Returns:** a `Calibration`. Raises `parity.run.runner.ProducersFailed` if the producers
    cannot run in some environment.
    """
    from parity.run.runner import produce

    runs: dict[str, dict[str, dict[str, Any]]] = {g: {} for g in goldens}
    seconds: dict[str, float] = {}
    for i, p in enumerate(perturbs, 1):
        progress(f"[calibrate {i}/{len(perturbs)}] {p.label}: producing {', '.join(goldens)}")
        env = dataclasses.replace(config, isa=p.isa, devices=p.devices, processes=p.processes)
        produced = produce(config.root, env, groups=list(goldens), progress=progress)
        seconds[p.label] = round(produced.seconds, 2)
        for group in goldens:
            runs[group][p.label] = produced.groups.get(group, {})
    keys: list[KeySpread] = []
    for group, gf in goldens.items():
        keys += measure(runs[group], gf, group, overrides=overrides, registry=registry)
    return Calibration(
        baseline={"isa": config.isa, "devices": config.devices},
        perturbations=tuple(perturbs),
        seconds=seconds,
        keys=tuple(keys),
        host=tuple(host_isa_caps()),
    )


def _num(x: float | int | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, int):
        return str(x)
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}"


def format_calibration(cal: Calibration) -> str:
    """The measurement as text: the environments, then per class its measured noise
    next to its bound, the flags, and the keys that broke their class."""
    base = cal.baseline
    lines = [
        f"parity calibrate: baseline isa {base['isa']}, {base['devices']} device(s) (as pinned); "
        f"host ISA caps {', '.join(cal.host) or 'unknown'}",
        "perturbations (each a fresh producer process): "
        + ", ".join(f"{p.label} ({cal.seconds.get(p.label, 0):.0f}s)" for p in cal.perturbations),
        "",
    ]
    cols = ["class", "allowed", "keys", "max abs", "max ulp", "abs/max|b|", "worst", "bound"]
    cols += ["worst/bound", "verdict", "worst key (perturbation)"]
    rows = [cols]
    for c in cal.classes():
        where = f"{c.worst_key} ({c.worst})" if c.worst_key else "-"
        rows.append(
            [
                c.class_name,
                c.allowed,
                str(c.keys),
                _num(c.max_abs),
                _num(c.max_ulp),
                _num(c.max_rel_to_max),
                _num(c.figure),
                _num(c.bound),
                _num(c.ratio),
                c.verdict,
                where,
            ]
        )
    right = (False, False, True, True, True, True, True, True, True, False, False)
    lines += text_table(rows, right)
    lines += ["", "per perturbation, per class: worst/bound (max abs):"]
    names = [c.class_name for c in cal.classes()]
    rows = [["perturbation", *names]]
    for p in cal.perturbations:
        row = [p.label]
        for name in names:
            got = [(r, a) for k in cal.keys if k.class_name == name
                   for lb, a, r in k.by_perturbation if lb == p.label]  # fmt: skip
            row.append(
                f"{_num(max(r for r, _ in got))} ({_num(max(a for _, a in got))})" if got else "-"
            )
        rows.append(row)
    lines += text_table(rows, (False, *([True] * len(names))))
    flagged = [c for c in cal.classes() if c.verdict != "ok"]
    if flagged:
        lines += ["", "flags:"]
        for c in flagged:
            if c.verdict == "below noise":
                lines.append(
                    f"  {c.class_name}: below the measured noise ({c.failing} key(s) break it "
                    "under a benign perturbation): false alarms waiting to happen"
                )
            elif c.ratio == 0:
                lines.append(
                    f"  {c.class_name}: blunt: no noise measured, the bound allows "
                    f"{_num(c.bound)} {c.unit}"
                )
            else:
                lines.append(
                    f"  {c.class_name}: blunt: bound {_num(1 / c.ratio)}x the largest "
                    f"measured noise (more than {BLUNT_FACTOR:g}x)"
                )
    unmeasured = [k for k in cal.keys if k.unmeasured]
    if unmeasured:
        lines += ["", f"not measurable ({len(unmeasured)} key(s)):"]
        lines += [f"  {k.group}/{k.key}: {'; '.join(k.unmeasured)}" for k in unmeasured[:20]]
    return "\n".join(lines) + "\n"
