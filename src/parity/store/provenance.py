"""Where goldens came from, how today's environment differs, and what that does to bitwise.

`collect_provenance` records the environment of a run (versions, platform, device count,
XLA flags, ISA cap, x64 mode) plus the git base SHA and a digest of the producer code. It
reads versions with `importlib.metadata` and never starts jax's backends: it imports
nothing heavy, and asks jax only if jax is already imported.

`drift` compares a golden's provenance with the current one, field by field. Each
difference has a severity:

- **"bits"**: the field can change the last bits of XLA's output: `jax`, `jaxlib`,
  `isa_cap`, `xla_flags`, `machine`, `cpu`, `x64`, `device_count`, and `processor` when no
  equal ISA cap is set on both sides. `cpu` is the processor's vendor, family, model and
  vector instruction sets: an equal ISA cap is not enough for equal bits, because XLA
  compiles for the host's microarchitecture within the cap (see docs/design.md,
  "Reproducing bits across hosts"), and the model name alone ("AMD EPYC") often hides it.
- **"info"**: worth showing, cannot move XLA's bits by itself: `python`, `numpy`, `h5py`,
  `ml_dtypes`, `platform`, `processor` under an equal ISA cap, `base_sha`, and
  `producer_digest` (the producers changed since pinning; a repin may be due).

**Bitwise policy** (`bitwise_policy`), applied only when there is at least one "bits" drift;
without one every mode keeps bitwise classes bitwise and says nothing:

- **"warn"** (default): bitwise classes stay bitwise; the report header lists the "bits"
  drifts and says they may explain bitwise failures. Honest and loud, never hides a change.
- **"relax"**: bitwise classes are checked as `ulp` with at most `relax_ulps` (default 2)
  ulp. Two ulp covers one extra rounding on each side (an FMA fused or not, one
  reassociated add), which is what a jax/jaxlib bump or another kernel typically does to a
  single op; bigger differences still fail and mean the numbers really moved, so repin under
  the current environment. NaN/inf positions still must match (a rule of every class).
- **"strict"**: a "bits" drift is itself an error: the check fails before comparing, naming
  the drifted fields. For CI that must run in the pinned environment.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from parity.xla_env import DEVICE_FLAG, ISA_FLAG, jax_backend_started

__all__ = [
    "BITS_FIELDS",
    "DEFAULT_RELAX_ULPS",
    "INFO_FIELDS",
    "Drift",
    "PolicyDecision",
    "bitwise_policy",
    "collect_provenance",
    "digest_sources",
    "drift",
    "environment_fingerprint",
]

Severity = Literal["info", "bits"]
PolicyMode = Literal["strict", "relax", "warn"]

#: Fields whose drift can change the last bits of XLA's output.
BITS_FIELDS = (
    "jax", "jaxlib", "isa_cap", "xla_flags", "machine", "cpu", "x64", "device_count", "processes",
)  # fmt: skip
#: Fields whose drift is shown but cannot move XLA's bits by itself.
INFO_FIELDS = ("python", "numpy", "h5py", "ml_dtypes", "platform", "base_sha", "producer_digest")
#: ulp allowed for bitwise classes under the "relax" policy (see the module docstring).
DEFAULT_RELAX_ULPS = 2

_DEVICE_FLAG_RE = re.compile(re.escape(DEVICE_FLAG) + r"=(\d+)")
_ISA_FLAG_RE = re.compile(re.escape(ISA_FLAG) + r"=(\S+)")
_SKIPPED_PARTS = frozenset({"__pycache__", ".git", ".pytest_cache", ".ruff_cache"})


# --------------------------------------------------------------------------- collecting


def _version(dist: str) -> str | None:
    import importlib.metadata  # here: 60 ms of imports that `parity diff` never needs

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _processor() -> str:
    # platform.processor() is often "" or just the machine on Linux; the CPU model is what
    # decides XLA's kernels, so prefer /proc/cpuinfo's model name where there is one.
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


_VECTOR_FLAG_RE = re.compile(
    r"^(sse\S*|ssse3|avx\S*|fma\S*|f16c|amx\S*|sha_ni|vaes|vpclmulqdq|gfni)$"
)


def _cpu() -> str | None:
    """Vendor, family, model and vector instruction sets of the first processor, from
    /proc/cpuinfo: what decides XLA's CPU code beyond the ISA cap. None elsewhere."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    break  # the first processor is enough
                name, _, value = line.partition(":")
                fields[name.strip().lower()] = value.strip()
    except OSError:
        return None
    if not fields:
        return None
    isa = sorted(f for f in fields.get("flags", "").split() if _VECTOR_FLAG_RE.match(f))
    return (
        f"{fields.get('vendor_id', '?')} family {fields.get('cpu family', '?')} model "
        f"{fields.get('model', '?')}; {' '.join(isa)}"
    )


def _device_count(xla_flags: str) -> int:
    if "jax" in sys.modules:
        import jax

        if jax_backend_started():
            return int(jax.device_count())
        # Set by parity.run.devices.set_cpu_device_count when jax was imported but not started.
        configured = getattr(jax.config, "jax_num_cpu_devices", -1)
        if isinstance(configured, int) and configured > 0:
            return configured
    found = _DEVICE_FLAG_RE.findall(xla_flags)
    return int(found[-1]) if found else 1  # the last flag wins, as in XLA


def _x64() -> bool:
    if "jax" in sys.modules:
        import jax

        return bool(jax.config.jax_enable_x64)  # pyright: ignore[reportAttributeAccessIssue]
    return os.environ.get("JAX_ENABLE_X64", "").strip().lower() in {"1", "true", "yes", "on"}


def collect_provenance(
    *,
    base_sha: str | None = None,
    producer_digest: str | None = None,
    device_count: int | None = None,
) -> dict[str, Any]:
    """Record the environment of this run, for a golden file's root or a report's header.

    Never starts jax's backends: versions come from `importlib.metadata`, and jax is asked
    for its device count and x64 mode only if it is already imported.

    **Arguments:**

    - `base_sha`: the git commit the goldens were produced from.
    - `producer_digest`: `digest_sources` of the producer code.
    - `device_count`: the device count, if the caller knows it. Otherwise jax's (if its
      backends are started), else `--xla_force_host_platform_device_count` in `XLA_FLAGS`,
      else 1.

    **Returns:** a JSON-serialisable dict with keys `python`, `jax`, `jaxlib`, `numpy`,
    `h5py`, `ml_dtypes` (versions, None if not installed), `platform`, `machine`,
    `processor`, `cpu` (vendor, family, model and vector ISA flags), `device_count` (jax's
    global count: every process's devices), `processes` (of a multi-process run, from
    `parity.run.processes`' worker environment; 1 otherwise),
    `xla_flags`, `isa_cap` (None if no cap), `x64`,
    `base_sha`, `producer_digest`.
    """
    xla_flags = os.environ.get("XLA_FLAGS", "")
    isa = _ISA_FLAG_RE.findall(xla_flags)
    return {
        "python": platform.python_version(),
        "jax": _version("jax"),
        "jaxlib": _version("jaxlib"),
        "numpy": _version("numpy"),
        "h5py": _version("h5py"),
        "ml_dtypes": _version("ml_dtypes"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _processor(),
        "cpu": _cpu(),
        "device_count": int(device_count) if device_count is not None else _device_count(xla_flags),
        "processes": int(os.environ.get("PARITY_PROCESSES") or 1),
        "xla_flags": xla_flags,
        "isa_cap": isa[-1] if isa else None,
        "x64": _x64(),
        "base_sha": base_sha,
        "producer_digest": producer_digest,
    }


def _expand(paths: Iterable[Path]) -> tuple[list[Path], list[Path]]:
    """(files, roots): every file under the given paths, and the paths themselves."""
    files: set[Path] = set()
    roots: list[Path] = []
    for p in paths:
        p = Path(p).resolve()
        if p.is_dir():
            roots.append(p)
            for sub in p.rglob("*"):
                rel_parts = sub.relative_to(p).parts
                skipped = _SKIPPED_PARTS.intersection(rel_parts) or sub.suffix in {".pyc", ".pyo"}
                if sub.is_file() and not skipped:
                    files.add(sub)
        elif p.is_file():
            roots.append(p.parent)
            files.add(p)
        else:
            raise FileNotFoundError(f"cannot digest {p}: no such file or directory")
    return sorted(files), roots


def digest_sources(paths: Iterable[Path | str], *, root: Path | str | None = None) -> str:
    """sha256 of source files, stable across checkouts (the producer digest).

    Directories are expanded to every file under them (skipping `__pycache__`, `.git` and
    compiled `.pyc`). Each file contributes its path relative to `root` (POSIX form) and its
    bytes, both length-prefixed so no two file sets collide, in sorted path order.

    **Arguments:**

    - `paths`: files and directories.
    - `root`: what paths are relative to; default: the common directory of the given paths
      (a file counts as its directory), so moving the checkout does not change the digest.

    **Returns:** the hex digest.
    """
    files, roots = _expand(Path(p) for p in paths)
    if root is not None:
        base = Path(root).resolve()
    elif roots:
        base = Path(os.path.commonpath([str(r) for r in roots]))
    else:
        base = Path.cwd()
    h = hashlib.sha256()
    entries = sorted((f.relative_to(base).as_posix(), f) for f in files)
    for rel, f in entries:
        name = rel.encode("utf-8")
        data = f.read_bytes()
        h.update(len(name).to_bytes(8, "little") + name)
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


# --------------------------------------------------------------------------- drift


@dataclasses.dataclass(frozen=True)
class Drift:
    """One provenance field that differs between the golden and the current run.

    - `field`: the provenance key, e.g. `"jaxlib"`.
    - `golden`, `current`: the two values (None where a side does not record it).
    - `severity`: `"bits"` if it can change XLA's last bits, else `"info"`.
    """

    field: str
    golden: Any
    current: Any
    severity: Severity

    def __str__(self) -> str:
        return f"{self.field}: {self.golden!r} -> {self.current!r} ({self.severity})"


def _same(field: str, a: Any, b: Any) -> bool:
    if field == "processes":  # files pinned before the field was recorded: one process
        return int(a or 1) == int(b or 1)
    if field == "xla_flags":
        # Flag order is not meaning, and the device count has its own field (a count of 1
        # written out or left implicit is the same run); compare the other flags as a set.
        def flags(v: Any) -> list[str]:
            return sorted(f for f in str(v or "").split() if not _DEVICE_FLAG_RE.match(f))

        return flags(a) == flags(b)
    return a == b


def environment_fingerprint(prov: Mapping[str, Any]) -> str:
    """A short digest of everything in a provenance that can move XLA's bits (the
    `BITS_FIELDS` and `processor`, compared as `drift` compares them: XLA flags as a set,
    the device count by its own field): two runs with the same fingerprint produce the same
    bits from the same code. Names a re-produced base in its cache
    (`parity.run.baseline`)."""
    fields = {f: prov.get(f) for f in (*BITS_FIELDS, "processor")}
    fields["processes"] = int(fields["processes"] or 1)
    fields["xla_flags"] = sorted(
        f for f in str(prov.get("xla_flags") or "").split() if not _DEVICE_FLAG_RE.match(f)
    )
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: Provenance fields that record a measurement or how the file was made (`order`: how its
#: forward order was made, `parity.judge.dataflow`), not the environment: never a drift.
NOT_ENVIRONMENT = frozenset({"calibration", "order"})


def drift(golden_prov: Mapping[str, Any], current_prov: Mapping[str, Any]) -> list[Drift]:
    """The fields where the current environment differs from the golden's.

    `base_sha` and `producer_digest` are compared only when both sides record one (a check
    run usually has no base SHA of its own); `calibration` (what `parity calibrate`
    measured) and `order` (how the forward order was made) are not compared. Fields
    neither list knows are reported as "info".

    **Arguments:**

    - `golden_prov`: the provenance stored in the golden file.
    - `current_prov`: `collect_provenance()` of this run.

    **Returns:** a list of `Drift`, "bits" first, then by field name.
    """
    out: list[Drift] = []
    same_cap = golden_prov.get("isa_cap") is not None and golden_prov.get(
        "isa_cap"
    ) == current_prov.get("isa_cap")
    for field in sorted(set(golden_prov) | set(current_prov)):
        g, c = golden_prov.get(field), current_prov.get(field)
        if field in ("base_sha", "producer_digest") and (g is None or c is None):
            continue
        if field in NOT_ENVIRONMENT:
            continue
        if _same(field, g, c):
            continue
        if field in BITS_FIELDS or (field == "processor" and not same_cap):
            severity: Severity = "bits"
        else:
            severity = "info"
        out.append(Drift(field, g, c, severity))
    out.sort(key=lambda d: (d.severity != "bits", d.field))
    return out


@dataclasses.dataclass(frozen=True)
class PolicyDecision:
    """What the bitwise policy makes of the drifts (see the module docstring).

    - `mode`: the policy applied.
    - `drifts`: every drift, as given.
    - `bits_drifts`: the ones that can change XLA's last bits.
    - `bitwise_max_ulp`: None to keep bitwise classes bitwise; else check them as `ulp`
      with this many ulp.
    - `error`: True if the drift itself fails the check ("strict" with a "bits" drift).
    - `header`: lines for the report's header (empty without drift).
    """

    mode: PolicyMode
    drifts: tuple[Drift, ...]
    bits_drifts: tuple[Drift, ...]
    bitwise_max_ulp: int | None
    error: bool
    header: tuple[str, ...]


def bitwise_policy(
    drifts: Sequence[Drift],
    mode: PolicyMode = "warn",
    *,
    relax_ulps: int = DEFAULT_RELAX_ULPS,
) -> PolicyDecision:
    """Decide what environment drift does to bitwise classes.

    **Arguments:**

    - `drifts`: from `drift(golden_prov, current_prov)`.
    - `mode`: `"warn"` (default), `"relax"` or `"strict"`, as in the module docstring.
    - `relax_ulps`: the ulp bound bitwise classes get under `"relax"`, at least 1.

    **Returns:** a `PolicyDecision`.
    """
    if mode not in ("strict", "relax", "warn"):
        raise ValueError(f"bitwise policy must be 'strict', 'relax' or 'warn', got {mode!r}")
    if relax_ulps < 1:
        raise ValueError(f"relax_ulps must be at least 1, got {relax_ulps}")
    drifts = tuple(drifts)
    bits = tuple(d for d in drifts if d.severity == "bits")
    info = tuple(d for d in drifts if d.severity != "bits")
    header: list[str] = []
    max_ulp: int | None = None
    error = False
    if bits:
        listed = "; ".join(str(d) for d in bits)
        if mode == "warn":
            header.append(
                f"environment drift that can change XLA's last bits: {listed}. Bitwise "
                "classes are still checked bitwise; this drift may explain bitwise failures "
                "(repin under this environment, or rerun with the golden's)."
            )
        elif mode == "relax":
            max_ulp = relax_ulps
            header.append(
                f"environment drift that can change XLA's last bits: {listed}. Policy "
                f"'relax': bitwise classes are checked as ulp <= {relax_ulps}."
            )
        else:
            error = True
            header.append(
                f"environment drift that can change XLA's last bits: {listed}. Policy "
                "'strict' refuses to compare: rerun in the golden's environment, or repin."
            )
    if info:
        header.append("environment drift (informational): " + "; ".join(str(d) for d in info))
    return PolicyDecision(
        mode=mode,
        drifts=drifts,
        bits_drifts=bits,
        bitwise_max_ulp=max_ulp,
        error=error,
        header=tuple(header),
    )
