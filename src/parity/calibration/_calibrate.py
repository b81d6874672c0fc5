"""`parity calibrate`: how large the harmless noise of the environment is, next to each
class's bound.

The goldens are pinned in one environment (an ISA cap and a device count, see
`parity.machinery._devices`). Calibration runs the same producers on the same code under benign
perturbations of that environment (`parity.calibration._perturbations`), each in a fresh process
through `parity.run._produced.produce` (another XLA CPU ISA cap the host supports, another
simulated device count, or the same environment again), and measures every array against
its golden under the class it is checked with (`parity.calibration._measure`: per key the largest
spread, per class the verdict `ok`, `below noise` or `blunt`). `Calibration` holds the
measurement, `format_calibration` prints it.

On another backend than the goldens' (a TPU, goldens pinned on a CPU) the goldens are no
reference for noise: `calibrate(..., reference_here=True)` first produces the pinned
environment here once, and measures every perturbation against that run (`repeat`: the
backend's run-to-run determinism); such a measurement is printed, never written into the
goldens (`parity.commands._calibrate`). The perturbations this backend cannot run were
skipped before (`parity.calibration._perturbations.available`); `Calibration.skipped`
says which and why.

A perturbation is benign by assumption: calibration measures the environment, not the
code. `parity.calibration._write.write_calibration` writes the measurement into a golden file's
provenance (`calibration`), so that `parity check` shows it in the report's header.

Nothing here imports jax.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity._environment import describe_backend
from parity.calibration._measure import BLUNT_FACTOR, ClassSpread, KeySpread, class_spreads, measure
from parity.calibration._perturbations import Perturbation, host_isa_caps
from parity.judge._classes import REGISTRY, ToleranceClass
from parity.judge._floats import count, sig
from parity.judge._tolerance import Overrides
from parity.machinery._config import ParityConfig
from parity.report import text_table
from parity.store import GoldenFile, open_goldens

__all__ = ["Calibration", "calibrate", "format_calibration"]


@dataclass(frozen=True)
class Calibration:
    """What `calibrate` measured.

    **Fields:** `pinned` (the environment the goldens were pinned in: `isa`, `devices`),
    `perturbations`, `seconds` (per perturbation label, the producer run's wall time), `keys`
    (every `KeySpread`, by group in order), `host` (the host's supported ISA caps),
    `skipped` (one line per perturbation this backend cannot run) and `reference` (what
    the runs were measured against, in words).
    """

    pinned: dict[str, Any]
    perturbations: tuple[Perturbation, ...]
    seconds: dict[str, float]
    keys: tuple[KeySpread, ...]
    host: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    reference: str = "the goldens"

    @property
    def groups(self) -> list[str]:
        """The groups measured, in order."""
        return list(dict.fromkeys(k.group for k in self.keys))

    def classes(self, group: str | None = None) -> list[ClassSpread]:
        """The class spreads over every group, or over one."""
        return class_spreads([k for k in self.keys if group is None or k.group == group])

    def to_dict(self) -> dict[str, Any]:
        """The measurement as JSON-safe data: the pinned environment, perturbations,
        per-class spreads (over all groups and per group) and every key's spread."""
        return {
            "pinned": self.pinned,
            "host_isa_caps": list(self.host),
            "perturbations": [dataclasses.asdict(p) for p in self.perturbations],
            "seconds": self.seconds,
            "skipped": list(self.skipped),
            "reference": self.reference,
            "classes": [c.to_dict() for c in self.classes()],
            "groups": {g: [c.to_dict() for c in self.classes(g)] for g in self.groups},
            "keys": [k.to_dict() for k in self.keys],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibration:
        """Read `to_dict`'s output back (a measurement saved with `--json`)."""
        return cls(
            pinned=dict(data["pinned"]),
            perturbations=tuple(Perturbation(**p) for p in data["perturbations"]),
            seconds=dict(data.get("seconds", {})),
            keys=tuple(KeySpread.from_dict(k) for k in data["keys"]),
            host=tuple(data.get("host_isa_caps", ())),
            skipped=tuple(data.get("skipped", ())),
            reference=str(data.get("reference", "the goldens")),
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
            parts.append(f"{c.class_name} {sig(c.figure)}/{sig(c.bound)} {c.unit} ({c.verdict})")
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
    skipped: Sequence[str] = (),
    reference_here: bool = False,
) -> Calibration:
    """Run the producers under every perturbation and measure the spread per key.

    **Arguments:**

    - `config`: the project's settings; its ISA cap and device count are the environment the
      goldens were pinned in.
    - `goldens`: group -> its golden file (the groups to calibrate).
    - `perturbs`: the environments to produce in (`perturbations`).
    - `overrides`: classes to measure instead of the pinned ones (`measure`).
    - `progress`: receives progress lines.
    - `registry`: the classes by name.
    - `skipped`: the lines of the perturbations this backend cannot run, to carry along.
    - `reference_here`: measure against a run of the pinned environment here, produced
      first, instead of the goldens (the goldens were pinned on another backend).

    **Returns:** a `Calibration`. Raises `parity.machinery._launcher.ProducerRunError` if the
    producers cannot run in some environment.
    """
    from parity.run._produced import produce

    seconds: dict[str, float] = {}
    reference = "the goldens"
    with contextlib.ExitStack() as stack:
        if reference_here:
            names = ", ".join(goldens)
            progress(f"[calibrate 0/{len(perturbs)}] reference: producing {names} here")
            ref = produce(config, groups=list(goldens), progress=progress, command="calibrate")
            seconds["reference"] = round(ref.seconds, 2)
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="parity-cal-")))
            goldens = {
                g: stack.enter_context(open_goldens(_as_reference(folder, g, gf, ref)))
                for g, gf in goldens.items()
            }
            prov = next(iter(ref.provenance.values()), None)
            reference = (
                f"a run of the pinned environment here, on {describe_backend(prov)} (the "
                "goldens were pinned on another backend: their bits are no reference here)"
            )
        keys = _measure_perturbed(
            config,
            goldens,
            perturbs,
            seconds,
            overrides=overrides,
            progress=progress,
            registry=registry,
        )
        return Calibration(
            pinned={"isa": config.isa, "devices": config.devices},
            perturbations=tuple(perturbs),
            seconds=seconds,
            keys=tuple(keys),
            host=tuple(host_isa_caps()),
            skipped=tuple(skipped),
            reference=reference,
        )


def _as_reference(folder: Path, group: str, gf: GoldenFile, ref: Any) -> Path:
    """The reference run of `group` (`ref`: a `Produced`) written in golden format, with the
    golden's classes and forward order."""
    from parity.calibrated._bounds import golden_classes
    from parity.store._writer import save_arrays

    names = golden_classes(gf).names
    return save_arrays(
        folder,
        group,
        ref.groups.get(group, {}),
        classes=names,
        order=gf.ordered_keys(),
        provenance=run.provenance if (run := ref.runs.get(group)) is not None else None,
    )


def _measure_perturbed(
    config: ParityConfig,
    goldens: Mapping[str, GoldenFile],
    perturbs: Sequence[Perturbation],
    seconds: dict[str, float],
    *,
    overrides: Overrides,
    progress: Callable[[str], None],
    registry: Mapping[str, ToleranceClass],
) -> list[KeySpread]:
    """Produce `goldens`' groups under each of `perturbs` (each run's wall time into
    `seconds`, by label) and measure every key against its golden (`measure`)."""
    from parity.run._produced import produce

    runs: dict[str, dict[str, dict[str, Any]]] = {g: {} for g in goldens}
    for i, p in enumerate(perturbs, 1):
        progress(f"[calibrate {i}/{len(perturbs)}] {p.label}: producing {', '.join(goldens)}")
        env = dataclasses.replace(config, isa=p.isa, devices=p.devices, processes=p.processes)
        produced = produce(env, groups=list(goldens), progress=progress, command="calibrate")
        seconds[p.label] = round(produced.seconds, 2)
        for group in goldens:
            runs[group][p.label] = produced.groups.get(group, {})
    keys: list[KeySpread] = []
    for group, gf in goldens.items():
        keys += measure(runs[group], gf, group, overrides=overrides, registry=registry)
    return keys


def format_calibration(cal: Calibration) -> str:
    """The measurement as text: the environments, then per class its measured noise
    next to its bound, the flags, and the keys that broke their class."""
    pinned = cal.pinned
    lines = [
        f"parity calibrate: pinned at isa {pinned['isa']}, "
        f"{count(int(pinned['devices']), 'device')}; "
        f"host ISA caps {', '.join(cal.host) or 'unknown'}",
        "perturbations (each a fresh producer process): "
        + ", ".join(f"{p.label} ({cal.seconds.get(p.label, 0):.0f}s)" for p in cal.perturbations),
        *cal.skipped,
        *([] if cal.reference == "the goldens" else [f"measured against {cal.reference}"]),
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
                sig(c.max_abs),
                sig(c.max_ulp),
                sig(c.max_rel_to_max),
                sig(c.figure),
                sig(c.bound),
                sig(c.ratio),
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
            got = [
                (r, a)
                for k in cal.keys
                if k.class_name == name
                for lb, a, r in k.by_perturbation
                if lb == p.label
            ]
            row.append(
                f"{sig(max(r for r, _ in got))} ({sig(max(a for _, a in got))})" if got else "-"
            )
        rows.append(row)
    lines += text_table(rows, (False, *([True] * len(names))))
    flagged = [c for c in cal.classes() if c.verdict != "ok"]
    if flagged:
        lines += ["", "flags:"]
        for c in flagged:
            if c.verdict == "below noise":
                lines.append(
                    f"  {c.class_name}: below the measured noise ({count(c.failing, 'key')} "
                    f"{'breaks' if c.failing == 1 else 'break'} it "
                    "under a benign perturbation): false alarms waiting to happen"
                )
            elif c.ratio == 0:
                lines.append(
                    f"  {c.class_name}: blunt: no noise measured, the bound allows "
                    f"{sig(c.bound)} {c.unit}"
                )
            else:
                lines.append(
                    f"  {c.class_name}: blunt: bound {sig(1 / c.ratio)}x the largest "
                    f"measured noise (more than {BLUNT_FACTOR:g}x)"
                )
    unmeasured = [k for k in cal.keys if k.unmeasured]
    if unmeasured:
        lines += ["", f"not measurable ({count(len(unmeasured), 'key')}):"]
        lines += [f"  {k.group}/{k.key}: {'; '.join(k.unmeasured)}" for k in unmeasured[:20]]
    return "\n".join(lines) + "\n"
