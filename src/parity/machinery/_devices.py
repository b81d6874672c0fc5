"""Simulated CPU device counts and the XLA flags that make goldens reproducible.

XLA's CPU backend reads its device count once, when jax initialises its backends, so the
count must be fixed before the first array is made: one count per process.
"""

from __future__ import annotations

import os
import sys

from parity._errors import ParityError
from parity._xla_env import DEFAULT_ISA_CAP, DEVICE_FLAG, ISA_FLAG, jax_backend_started
from parity.judge._floats import count


class DeviceCountError(ParityError, RuntimeError):
    """jax already started with a different device count than the one asked for."""


def _set_flag(flags: str, name: str, value: str) -> str:
    kept = [f for f in flags.split() if not f.startswith(name + "=")]
    kept.append(f"{name}={value}")
    return " ".join(kept)


def xla_flags_for(n_devices: int, *, isa_cap: str | None = DEFAULT_ISA_CAP, base: str = "") -> str:
    """Return ``base`` XLA flags with the device count and ISA cap set (replacing any old ones).

    **Arguments:**

    - `n_devices`: number of simulated host (CPU) devices, at least 1.
    - `isa_cap`: value for `--xla_cpu_max_isa`, or `None` to leave the ISA alone.
    - `base`: existing flags, for example `os.environ.get("XLA_FLAGS", "")`.

    **Returns:** the flag string, for `XLA_FLAGS`.
    """
    if n_devices < 1:
        raise ValueError(f"device count must be at least 1, got {n_devices}")
    flags = _set_flag(base, DEVICE_FLAG, str(n_devices))
    if isa_cap is not None:
        flags = _set_flag(flags, ISA_FLAG, isa_cap)
    return flags.strip()


#: The jax settings a subprocess inherits: the backend chosen and the matmul precision.
_PASSED_JAX = ("JAX_PLATFORMS", "JAX_DEFAULT_MATMUL_PRECISION")


def isolated_env(
    n_devices: int, *, isa_cap: str | None = DEFAULT_ISA_CAP, base: dict[str, str] | None = None
) -> dict[str, str]:
    """Environment for a subprocess that must not share this one's jax settings.

    Drops every `JAX_*` and `PARITY_*` variable but the backend chosen (`JAX_PLATFORMS`),
    the matmul precision (`JAX_DEFAULT_MATMUL_PRECISION`) and the log folder
    (`PARITY_LOGS`, `parity.machinery._logs`), and fixes the device count
    and ISA cap in `XLA_FLAGS`. The one jax setting it passes on is the machine's compilation cache
    (`parity.machinery._jax_cache`: the root this process resolved, off where it was turned off),
    so that a program the child compiles is compiled once per machine; what a child measures
    of a compile (`parity._compile_stats`) it measures with the cache off.
    """
    from parity.machinery import _jax_cache as jax_cache
    from parity.machinery._compile_count import LOG_VAR
    from parity.machinery._logs import LOGS_VAR

    src = dict(os.environ) if base is None else base
    env = {k: v for k, v in src.items() if not k.startswith(("JAX_", "PARITY_"))}
    # The backend and the matmul precision the check runs at are its environment (recorded
    # in provenance): a producer, a baseline and an origin run where the check runs.
    env |= {k: src[k] for k in _PASSED_JAX if k in src}
    env["XLA_FLAGS"] = xla_flags_for(n_devices, isa_cap=isa_cap)
    root = jax_cache.for_children(src)
    env.update(jax_cache.child_env(root))
    if root is not None:  # the grandchildren (a producer's own subprocesses) inherit it
        env[jax_cache.RESOLVED_VAR] = str(root)
    if LOG_VAR in src:  # a benchmark counting every process's compiles
        env[LOG_VAR] = src[LOG_VAR]
    if src.get(LOGS_VAR):  # a child's logs (a recording's traceback) go where this one's go
        env[LOGS_VAR] = src[LOGS_VAR]
    return env


def cap_isa(isa_cap: str) -> None:
    """Cap XLA's CPU ISA for this process, leaving the device count and any cap the user
    already set in `XLA_FLAGS` alone. A no-op once jax's backends have started."""
    if jax_backend_started():
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if ISA_FLAG + "=" in flags:
        return  # the user chose a cap explicitly
    os.environ["XLA_FLAGS"] = f"{flags} {ISA_FLAG}={isa_cap}".strip()


def set_cpu_device_count(n_devices: int, *, isa_cap: str | None = DEFAULT_ISA_CAP) -> None:
    """Fix the number of simulated CPU devices (and the ISA cap) for this process.

    Must run before jax initialises its backends. If it already did with the same count,
    this is a no-op; with another count it raises `DeviceCountError` saying how to fix it.
    """
    if jax_backend_started():
        import jax

        have = jax.device_count()
        if have != n_devices:
            raise DeviceCountError(
                f"jax already started with {count(have, 'device')} in this process, but "
                f"{n_devices} {'was' if n_devices == 1 else 'were'} asked for. The count is "
                "fixed when jax first creates an array: set it before that (the pytest option "
                "--parity-devices, or PARITY_DEVICES, or "
                f"XLA_FLAGS={DEVICE_FLAG}={n_devices}) and run one count per process."
            )
        return
    os.environ["XLA_FLAGS"] = xla_flags_for(
        n_devices, isa_cap=isa_cap, base=os.environ.get("XLA_FLAGS", "")
    )
    if "jax" in sys.modules:
        import jax

        jax.config.update("jax_num_cpu_devices", n_devices)
