"""Does a check's environment differ from the pin's, and how: decided once, here.

`environment_difference(pinned, current)` compares two provenances (`Provenance`, what
`parity.store._provenance.collect_provenance` records) and returns one frozen
`EnvironmentDifference`; every face of parity (a check of a golden group, `parity diff`,
the baseline, the baseline cache) asks it, and none compares provenances on its own.

Each field that differs is a `Drift` with a severity:

- **"bits"**: the field can change the last bits of XLA's output: `jax`, `jaxlib`,
  `isa_cap`, `xla_flags`, `machine`, `cpu`, `x64`, `device_count`, `processes`, the
  backend (`backend`: cpu, gpu, tpu; `device_kind`), `matmul_precision`, `packages` (a
  distribution the producers imported, at another version on both sides: an optax or
  flax release computes otherwise; compared only where both sides record them, and only
  the distributions both record), and `processor` when no equal ISA cap is set on both
  sides. A file that records no backend is a CPU run
  (`backend_of`). Across backends the host processor's fields (`cpu`, `processor`,
  `isa_cap`, `machine`) are "info": the accelerator computes, and never reads an ISA cap.
  `cpu` is the processor's vendor, family, model and vector instruction sets: an equal ISA
  cap is not enough for equal bits, because XLA compiles for the host's microarchitecture
  within the cap (see docs/design.md, "Reproducing bits across hosts"), and the model name
  alone ("AMD EPYC") often hides it.
- **"info"**: worth showing, cannot move XLA's bits by itself: `python`, `numpy`, `h5py`,
  `ml_dtypes`, `platform`, `processor` under an equal ISA cap, `base_sha`, and
  `producer_digest` (the producers changed since pinning; a repin may be due).

Of the "bits" drifts, those that `parity calibrate` measures are also **calibrated
dimensions** (`Dimension`): the process layout (`processes`, else `devices`), the ISA cap
(`isa`), and the processor under the same cap (`cpu`, judged by the ISA spreads). Another
backend is a dimension too (`backend`), but no calibration bounds it: across backends the
goldens' measured noise is the wrong ruler, and the baseline re-produced on this backend
judges every key (docs/design.md, "On any backend"; `EnvironmentDifference.across_backends`).
`parity calibrate` perturbs only the layout and the ISA cap (`PERTURBED_KINDS`,
`Dimension.perturbed`): what else moved (a processor, a backend, a jax or jaxlib release,
XLA flags) no calibration can record (`EnvironmentDifference.unperturbed`), and a repin
in this environment is what adopts it.
`describe_backend` says a side's backend in words for every header.

**Bitwise policy** (`EnvironmentDifference.policy`), applied only when some drift can move
bits; without one every mode keeps bitwise classes bitwise and says nothing:

- **"warn"** (default): bitwise classes stay bitwise; the report header lists the "bits"
  drifts and says they may explain bitwise failures. Honest and loud, never hides a change.
- **"relax"**: bitwise classes are checked as `ulp` with at most `relax_ulps` (default 2)
  ulp. Two ulp covers one extra rounding on each side (an FMA fused or not, one
  reassociated add), which is what a jax/jaxlib bump or another kernel typically does to a
  single op; bigger differences still fail and mean the numbers really moved, so repin under
  the current environment. NaN/inf positions still must match (a rule of every class).
- **"strict"**: a "bits" drift is itself an error: the check fails before comparing, naming
  the drifted fields. For CI that must run in the pinned environment.

The field lists below name `Provenance`'s fields (`tests/parity/test_environment.py` holds
them to that); the generic comparison walks a provenance by name (`Provenance.by_name`), so
that a key another parity version records and this one does not know is compared too. This
module imports neither numpy, h5py nor jax, nor, but to name its type, the store.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from parity._xla_env import DEVICE_FLAG, ISA_FLAG

if TYPE_CHECKING:  # a layer above this one: its type only
    from parity.store._provenance_record import Provenance

__all__ = [
    "BITS_FIELDS",
    "DEFAULT_RELAX_ULPS",
    "DRIFT_MODES",
    "INFO_FIELDS",
    "NOT_ENVIRONMENT",
    "PERTURBED_KINDS",
    "Dimension",
    "Drift",
    "EnvironmentDifference",
    "PolicyDecision",
    "PolicyMode",
    "backend_note",
    "backend_of",
    "describe_backend",
    "environment_difference",
    "flags_of",
    "layout_of",
]

Severity = Literal["info", "bits"]
PolicyMode = Literal["strict", "relax", "warn"]
#: The policy's modes in the order a command line offers them (`--drift`, `[tool.parity]
#: drift`, `--parity-drift`); here, with the policy, so that a command that only reads files
#: need not load `parity.machinery._config` to offer them.
DRIFT_MODES: tuple[PolicyMode, ...] = ("warn", "relax", "strict")

#: Fields whose drift can change the last bits of XLA's output.
BITS_FIELDS = (
    "jax",
    "jaxlib",
    "isa_cap",
    "xla_flags",
    "machine",
    "cpu",
    "x64",
    "device_count",
    "processes",
    "backend",
    "device_kind",
    "matmul_precision",
    "packages",
)
#: Fields of the host processor: "info" across backends (an accelerator computes there).
HOST_FIELDS = frozenset({"cpu", "processor", "isa_cap", "machine"})
#: Fields whose drift is shown but cannot move XLA's bits by itself.
INFO_FIELDS = ("python", "numpy", "h5py", "ml_dtypes", "platform", "base_sha", "producer_digest")
#: Provenance fields that record a measurement or how the file was made (`order`: how its
#: forward order was made, `parity.judge._dataflow`), not the environment: never a drift.
NOT_ENVIRONMENT = frozenset({"calibration", "order"})
#: The kinds of `Dimension` that `parity calibrate` perturbs
#: (`parity.calibration._perturbations`): the process layout, the device count, the ISA cap.
#: It never runs another processor, backend, jax or jaxlib: a `cpu` dimension is judged by
#: the ISA spreads measured on the pin's processor, and no calibration bounds a backend.
PERTURBED_KINDS = frozenset({"processes", "devices", "isa"})
#: ulp allowed for bitwise classes under the "relax" policy (see the module docstring).
DEFAULT_RELAX_ULPS = 2

_DEVICE_FLAG_RE = re.compile(re.escape(DEVICE_FLAG) + r"=(\d+)")
#: Fields a calibrated dimension says in words; their drifts are not repeated by `changes`.
_CALIBRATED_FIELDS = frozenset(
    {"device_count", "processes", "isa_cap", "cpu", "processor", "backend", "device_kind"}
)


@dataclass(frozen=True)
class Drift:
    """One provenance field that differs between the pin's environment and the current one.

    **Fields:** `field` (the provenance field, e.g. `"jaxlib"`), `golden` and `current` (the
    two values; None where a side does not record it), `severity` (`"bits"` if it can change
    XLA's last bits, else `"info"`).
    """

    field: str
    golden: Any
    current: Any
    severity: Severity

    def __str__(self) -> str:
        if self.field == "packages" and isinstance(self.golden, dict):
            moved = ", ".join(f"{d} {v} -> {self.current.get(d)}" for d, v in self.golden.items())
            return f"packages: {moved} ({self.severity})"
        return f"{self.field}: {self.golden!r} -> {self.current!r} ({self.severity})"


@dataclass(frozen=True)
class Dimension:
    """One calibrated dimension in which a check's environment differs from the pin's.

    **Fields:** `kind` (`processes`, `devices`, `isa`, `cpu` or `backend`), `label` (the
    perturbation label of the check's environment, e.g. `devices=4`; for `cpu`, `isa`; for
    `backend`, `backend=tpu`, which no calibration measures) and `change` (in words, for
    the report's header: `devices 1 -> 4`).
    """

    kind: str
    label: str
    change: str

    @property
    def column_kind(self) -> str:
        """The perturbation kind whose measurements bound this dimension."""
        return "isa" if self.kind == "cpu" else self.kind

    @property
    def perturbed(self) -> bool:
        """Whether `parity calibrate` perturbs this dimension (`PERTURBED_KINDS`): a
        calibration can record its noise. A processor or a backend it cannot."""
        return self.kind in PERTURBED_KINDS


@dataclass(frozen=True)
class PolicyDecision:
    """What the bitwise policy makes of an environment difference (the module docstring).

    **Fields:** `mode` (the policy applied), `bitwise_max_ulp` (None to keep bitwise
    classes bitwise; else check them as `ulp` with this many ulp), `refused` (the drift
    itself fails the check: "strict" with a "bits" drift) and `header` (lines for the
    report's header; empty without drift).
    """

    mode: PolicyMode
    bitwise_max_ulp: int | None
    refused: bool
    header: tuple[str, ...]


@dataclass(frozen=True)
class EnvironmentDifference:
    """How a check's environment differs from the pin's (`environment_difference`).

    **Fields:**

    - `dimensions`: the calibrated dimensions that differ (`Dimension`), in a fixed order:
      layout, ISA, processor.
    - `bits`: every drift that can move XLA's bits (those of the dimensions included).
    - `info`: the drifts that cannot.
    - `unknown`: why the environments could not be compared (a side records no
      provenance: a plain HDF5 file), else "". An unknown difference moves no bits.
    """

    dimensions: tuple[Dimension, ...] = ()
    bits: tuple[Drift, ...] = ()
    info: tuple[Drift, ...] = ()
    unknown: str = ""

    @property
    def drifts(self) -> tuple[Drift, ...]:
        """Every drift: "bits" first, then "info", each by field name."""
        return self.bits + self.info

    @property
    def across_backends(self) -> bool:
        """Whether the check runs on another backend than the pin's (a TPU against goldens
        pinned on a CPU, or the reverse): then the baseline re-produced here judges every
        key, and the goldens' noise is information (docs/design.md, "On any backend")."""
        return any(d.kind == "backend" for d in self.dimensions)

    @property
    def moves_bits(self) -> bool:
        """Whether the difference can move XLA's bits (`changes` is not empty): the pin's
        bits need not reproduce here."""
        return bool(self.changes)

    @property
    def changes(self) -> tuple[str, ...]:
        """What can move bits, in words: each calibrated dimension (`devices 1 -> 4`), then
        every other "bits" drift (`jaxlib: '0.4' -> '0.5' (bits)`). Empty in the pin's
        environment."""
        return tuple(d.change for d in self.dimensions) + self._other_changes()

    @property
    def unperturbed(self) -> tuple[str, ...]:
        """What moved bits that no calibration can record, in words (`changes`'s, and
        `processor` for another processor under another ISA cap): a processor, a backend,
        and every "bits" drift that is no dimension (a jax or jaxlib release, XLA flags,
        x64, the matmul precision). Empty where `parity calibrate` perturbs every change
        (`Dimension.perturbed`), so that recording its noise can cover this environment."""
        out = [d.change for d in self.dimensions if not d.perturbed]
        other_processor = any(
            d.field in ("cpu", "processor") and d.golden and d.current for d in self.bits
        )
        if other_processor and all(d.kind != "cpu" for d in self.dimensions):
            out.append("processor")  # behind the ISA cap's dimension, still another processor
        return (*out, *self._other_changes())

    def _other_changes(self) -> tuple[str, ...]:
        """The "bits" drifts no dimension says in words, each as `Drift` writes it."""
        out: list[str] = []
        for d in self.bits:
            if d.field in _CALIBRATED_FIELDS:
                continue
            if d.field == "xla_flags" and _other_flags(d.golden) == _other_flags(d.current):
                continue  # only the ISA cap or the device count, said by a dimension
            out.append(str(d))
        return tuple(out)

    def policy(
        self, mode: PolicyMode = "warn", *, relax_ulps: int = DEFAULT_RELAX_ULPS
    ) -> PolicyDecision:
        """What the bitwise policy `mode` makes of this difference (the module docstring).

        **Arguments:**

        - `mode`: `"warn"` (default), `"relax"` or `"strict"`.
        - `relax_ulps`: the ulp bound bitwise classes get under `"relax"`, at least 1.

        **Returns:** a `PolicyDecision`; raises `ValueError` for another mode, or
        `relax_ulps` below 1.
        """
        if mode not in ("strict", "relax", "warn"):
            raise ValueError(f"bitwise policy must be 'strict', 'relax' or 'warn', got {mode!r}")
        if relax_ulps < 1:
            raise ValueError(f"relax_ulps must be at least 1, got {relax_ulps}")
        header: list[str] = []
        max_ulp: int | None = None
        if self.unknown:
            header.append(f"environment drift: not compared ({self.unknown})")
        if self.bits:
            listed = "; ".join(str(d) for d in self.bits)
            what = f"environment drift that can change XLA's last bits: {listed}."
            if mode == "warn":
                header.append(
                    f"{what} Bitwise classes are still checked bitwise; this drift may explain "
                    "bitwise failures (repin under this environment, or rerun with the golden's)."
                )
            elif mode == "relax":
                max_ulp = relax_ulps
                header.append(
                    f"{what} Policy 'relax': bitwise classes are checked as ulp <= {relax_ulps}."
                )
            else:
                header.append(
                    f"{what} Policy 'strict' refuses to compare: rerun in the golden's "
                    "environment, or repin."
                )
        if self.info:
            header.append(
                "environment drift (informational): " + "; ".join(str(d) for d in self.info)
            )
        refused = mode == "strict" and bool(self.bits)
        return PolicyDecision(mode, max_ulp, refused, tuple(header))


def layout_of(provenance: Provenance) -> tuple[int, int]:
    """`(processes, devices per process)` of the run a provenance describes (files written
    before provenance recorded `processes` were single-process runs)."""
    processes = provenance.processes or 1
    total = provenance.device_count or 1
    return processes, max(1, total // processes)


def flags_of(value: Any) -> list[str]:
    """XLA flags as compared: a sorted list, the device count left out."""
    # Flag order is not meaning, and the device count has its own field (a count of 1
    # written out or left implicit is the same run); compare the other flags as a set.
    return sorted(f for f in str(value or "").split() if not _DEVICE_FLAG_RE.match(f))


def _other_flags(value: Any) -> list[str]:
    """XLA flags other than the device count and the ISA cap, as a sorted list."""
    skip = (f"{DEVICE_FLAG}=", f"{ISA_FLAG}=")
    return sorted(f for f in str(value or "").split() if not f.startswith(skip))


def backend_of(provenance: Provenance) -> str:
    """The backend a provenance records (`cpu`, `gpu`, `tpu`); `cpu` where it records
    none (files pinned before the field, or a process whose jax had not started)."""
    return provenance.backend or "cpu"


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def describe_backend(provenance: Provenance | None) -> str:
    """A side of a check in words, for every header: `cpu (AuthenticAMD family 25 model 1,
    isa AVX2, 1 device)`, `tpu (TPU v5 lite, 1 device)`; an ISA cap is named only on a CPU,
    the only backend that reads one."""
    if provenance is None:
        return "unknown (no provenance recorded)"
    backend = backend_of(provenance)
    processes, devices = layout_of(provenance)
    layout = _count(devices, "device")
    if processes > 1:
        layout = f"{_count(processes, 'process')} x {layout}".replace("processs", "processes")
    parts: list[str] = []
    if backend == "cpu":
        # Vendor, family and model (`cpu_signature`): what decides XLA's CPU code; the model
        # name where the signature is unknown.
        sig = (provenance.cpu or "").split(";")[0].strip()
        name = sig or (provenance.processor or "").strip()
        if name:
            parts.append(name)
        parts.append(f"isa {provenance.isa_cap or 'uncapped'}")
    elif provenance.device_kind:
        parts.append(provenance.device_kind)
    parts.append(layout)
    if provenance.matmul_precision:
        parts.append(f"matmul precision {provenance.matmul_precision}")
    return f"{backend} ({', '.join(parts)})"


def backend_note(provenance: Provenance) -> str:
    """What a check on an accelerator can see, for its header; "" on a CPU. At a TPU's
    default matmul precision a float32 product runs in bfloat16 passes, so a change below
    that rounding can leave the outputs bit-identical (docs/adopting.md, "On a GPU or
    TPU", has the figures measured on a TPU v5e)."""
    backend = backend_of(provenance)
    if backend == "cpu":
        return ""
    precision = provenance.matmul_precision
    ran = f"at matmul precision {precision}" if precision else "at the backend's default matmul"
    if not precision:
        ran += " precision (bfloat16 passes on a TPU)"
    return (
        f"the producers ran on {backend} {ran}: a change below that rounding can leave the "
        "outputs bit-identical here (on a TPU v5e at the default precision a 10% RMS epsilon "
        "change passed forward_llama and was caught by the eval and train groups only); "
        "check with JAX_DEFAULT_MATMUL_PRECISION=highest, on a CPU (JAX_PLATFORMS=cpu), or op "
        'by op (docs/adopting.md, "On a GPU or TPU")'
    )


def _same(field: str, a: Any, b: Any) -> bool:
    if field == "backend":  # files that record none are CPU runs
        return (a or "cpu") == (b or "cpu")
    if field == "device_kind" and (a is None or b is None):
        return True  # the backend decides; files before the field record no kind
    if field == "processes":  # files pinned before the field was recorded: one process
        return int(a or 1) == int(b or 1)
    if field == "xla_flags":
        return flags_of(a) == flags_of(b)
    return a == b


def _moved(golden: Any, current: Any) -> tuple[dict[str, str], dict[str, str]]:
    """The distributions both sides record at other versions, each side's versions."""
    if not isinstance(golden, dict) or not isinstance(current, dict):
        return {}, {}
    both = sorted(golden.keys() & current.keys())
    moved = [d for d in both if golden[d] != current[d]]
    return {d: golden[d] for d in moved}, {d: current[d] for d in moved}


def _drifts(pinned: Provenance, current: Provenance) -> list[Drift]:
    out: list[Drift] = []
    same_cap = pinned.isa_cap is not None and pinned.isa_cap == current.isa_cap
    across = backend_of(pinned) != backend_of(current)
    # Field by field, by name: every field and every key only one parity version knows.
    golden, here = pinned.by_name(), current.by_name()
    for field in sorted(golden.keys() | here.keys()):
        g, c = golden.get(field), here.get(field)
        if field in ("base_sha", "producer_digest", "packages") and (g is None or c is None):
            continue  # a check run usually has no base SHA of its own
        if field == "packages":  # the distributions both record, at other versions
            g, c = _moved(g, c)
        if field in NOT_ENVIRONMENT or _same(field, g, c):
            continue
        bits = field in BITS_FIELDS or (field == "processor" and not same_cap)
        if across and field in HOST_FIELDS:
            bits = False  # the accelerator computes; the host's processor is information
        out.append(Drift(field, g, c, "bits" if bits else "info"))
    return out


def _dimensions(pinned: Provenance, current: Provenance) -> list[Dimension]:
    out: list[Dimension] = []
    (p0, d0), (p1, d1) = layout_of(pinned), layout_of(current)
    if p1 != p0:
        out.append(Dimension("processes", f"processes={p1}x{d1}", f"layout {p0}x{d0} -> {p1}x{d1}"))
    elif d1 != d0:
        out.append(Dimension("devices", f"devices={d1}", f"devices {d0} -> {d1}"))
    b0, b1 = backend_of(pinned), backend_of(current)
    if b0 != b1:
        w0, w1 = (
            f"{b} ({p.device_kind})" if b != "cpu" and p.device_kind else b
            for p, b in ((pinned, b0), (current, b1))
        )
        out.append(Dimension("backend", f"backend={b1}", f"backend {w0} -> {w1}"))
        return out  # an ISA cap or a host processor means nothing across backends
    isa0, isa1 = pinned.isa_cap, current.isa_cap
    if isa0 != isa1:
        out.append(Dimension("isa", f"isa={isa1}", f"isa cap {isa0} -> {isa1}"))
    elif pinned.cpu and current.cpu and pinned.cpu != current.cpu:
        out.append(Dimension("cpu", "isa", "processor (same isa cap)"))
    return out


def environment_difference(
    pinned: Provenance | None, current: Provenance | None
) -> EnvironmentDifference:
    """How `current` (a check's environment) differs from `pinned` (the golden's).

    `base_sha` and `producer_digest` are compared only when both sides record one;
    `calibration` and `order` are not compared (`NOT_ENVIRONMENT`); fields neither list
    knows are "info".

    **Arguments:**

    - `pinned`: the provenance stored in the golden file.
    - `current`: the provenance of the run judged (`collect_provenance()` of this process,
      or what an ACTUAL file records).

    Either side may be None: a file that records no provenance (a plain HDF5 file). Then
    the environments cannot be compared: the difference is `unknown` and moves no bits. An
    empty provenance is compared like any other (every field it lacks drifted).

    **Returns:** the `EnvironmentDifference`.
    """
    if pinned is None or current is None:
        side = "GOLDEN" if pinned is None else "ACTUAL"
        return EnvironmentDifference(unknown=f"{side} records no provenance")
    drifts = _drifts(pinned, current)
    return EnvironmentDifference(
        dimensions=tuple(_dimensions(pinned, current)),
        bits=tuple(d for d in drifts if d.severity == "bits"),
        info=tuple(d for d in drifts if d.severity == "info"),
    )
