"""Where goldens came from: the environment of a run, recorded.

`collect_provenance` records the environment of a run (versions, platform, the backend jax
computed on: `backend` (cpu, gpu, tpu), `device_kind`, device count and processes; XLA
flags, ISA cap, x64 mode, the default matmul precision) plus the git base SHA and a digest
of the producer code (`digest_sources`). It reads versions with `importlib.metadata` and
never starts jax's backends: it imports nothing heavy, and asks jax only if jax is already
imported.

This module only collects. Whether two environments differ, and what that does to bitwise
classes, is decided once, in `parity._environment`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import platform
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from parity._xla_env import DEVICE_FLAG, ISA_FLAG, jax_backend_started
from parity.store._provenance_record import FIELD_NAMES, Provenance

__all__ = ["collect_provenance", "digest_sources", "imported_distributions"]

_DEVICE_FLAG_RE = re.compile(re.escape(DEVICE_FLAG) + r"=(\d+)")
_ISA_FLAG_RE = re.compile(re.escape(ISA_FLAG) + r"=(\S+)")
_SKIPPED_PARTS = frozenset({"__pycache__", ".git", ".pytest_cache", ".ruff_cache"})
#: The fields `collect_provenance` records: every one but the harness's `order` and
#: `calibration`.
_COLLECTED = tuple(name for name in FIELD_NAMES if name not in ("order", "calibration"))


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


def cpu_signature() -> str | None:
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
        # Set by parity.machinery._devices.set_cpu_device_count when jax was imported, not
        # started.
        configured = getattr(jax.config, "jax_num_cpu_devices", -1)
        if isinstance(configured, int) and configured > 0:
            return configured
    found = _DEVICE_FLAG_RE.findall(xla_flags)
    return int(found[-1]) if found else 1  # the last flag wins, as in XLA


def _backend() -> tuple[str | None, str | None]:
    """`(platform, device kind)` of jax's default backend where it is started in this
    process (a producer process, after its producers ran), else `(None, None)`: a file that
    records no backend reads as a CPU run (`parity._environment.backend_of`)."""
    if not jax_backend_started():
        return None, None
    import jax

    devices = jax.devices()
    kind = str(devices[0].device_kind) if devices else None
    return str(jax.default_backend()), kind


def _matmul_precision() -> str | None:
    """jax's default matmul precision (None: the backend's default). On a TPU it decides
    how many bits of a float32 product survive, so it is part of the environment."""
    if "jax" in sys.modules:
        import jax

        value = getattr(jax.config, "jax_default_matmul_precision", None)
        return None if value is None else str(value)
    return os.environ.get("JAX_DEFAULT_MATMUL_PRECISION") or None


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
    packages: Mapping[str, str] | None = None,
) -> Provenance:
    """Record the environment of this run, for a golden file's root or a report's header.

    Never starts jax's backends: versions come from `importlib.metadata`, and jax is asked
    for its device count and x64 mode only if it is already imported.

    **Arguments:**

    - `base_sha`: the git commit the goldens were produced from.
    - `producer_digest`: `digest_sources` of the producer code.
    - `packages`: the distributions the producers imported, with their versions
      (`imported_distributions`; the producer run passes them).
    - `device_count`: the device count, if the caller knows it. Otherwise jax's (if its
      backends are started), else `--xla_force_host_platform_device_count` in `XLA_FLAGS`,
      else 1.

    **Returns:** the `Provenance`, every field it collects recorded (a None as null):
    versions (None if not installed), the host (`platform`, `machine`, `processor`, `cpu`:
    vendor, family, model and vector ISA flags), `backend` and `device_kind` (None where
    jax's backends are not started here), `device_count` (jax's global count: every
    process's devices), `processes` (of a multi-process run, from
    `parity.machinery._worker`'s environment; 1 otherwise), `xla_flags`, `isa_cap` (None if
    no cap), `x64`, `matmul_precision` (jax's default, None if unset), `base_sha` and
    `producer_digest`. `order` and `calibration` are the harness's to add.
    """
    xla_flags = os.environ.get("XLA_FLAGS", "")
    isa = _ISA_FLAG_RE.findall(xla_flags)
    backend, device_kind = _backend()
    collected = Provenance(
        python=platform.python_version(),
        jax=_version("jax"),
        jaxlib=_version("jaxlib"),
        numpy=_version("numpy"),
        h5py=_version("h5py"),
        ml_dtypes=_version("ml_dtypes"),
        platform=platform.platform(),
        machine=platform.machine(),
        processor=_processor(),
        cpu=cpu_signature(),
        backend=backend,
        device_kind=device_kind,
        device_count=int(device_count) if device_count is not None else _device_count(xla_flags),
        processes=int(os.environ.get("PARITY_PROCESSES") or 1),
        xla_flags=xla_flags,
        isa_cap=isa[-1] if isa else None,
        x64=_x64(),
        matmul_precision=_matmul_precision(),
        base_sha=base_sha,
        producer_digest=producer_digest,
        packages=dict(packages) if packages is not None else None,
    )
    # Every field collected is recorded, a None as null, as files have always had it (but
    # `packages`, which only a producer run knows).
    unset = {name for name in _COLLECTED if getattr(collected, name) is None}
    unset.discard("packages")
    return dataclasses.replace(collected, nulls=frozenset(unset))


#: Distributions a producer run imports for the harness, not for the producers: never said
#: as the producers' packages (their versions cannot move a producer's numbers).
_HARNESS = frozenset({"parity-harness"})


def imported_distributions(before: Iterable[str]) -> dict[str, str]:
    """The installed distributions whose top-level modules were imported since `before`
    (the names `sys.modules` held then), each with its version: what the producers
    imported. A module of no distribution (the standard library, the user's own source)
    is left out. The first call scans the installed distributions (about 0.1 s), once a
    process."""
    import importlib.metadata as metadata

    held = set(before)
    new = {name for name in list(sys.modules) if "." not in name and name not in held}
    if not new:
        return {}
    owners = _owners()
    out: dict[str, str] = {}
    for dist in sorted({d for name in new for d in owners.get(name, ())}):
        if dist in _HARNESS:
            continue
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


@functools.cache
def _owners() -> Mapping[str, list[str]]:
    """Top-level module -> the distributions that install it (`importlib.metadata`)."""
    import importlib.metadata as metadata

    return metadata.packages_distributions()


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
