"""pytest plugin for parity, registered through the `pytest11` entry point.

Options:

- `--parity-devices N` (or env `PARITY_DEVICES`): simulated CPU device count, set before jax
  starts (a clear error if it already started with another count).
- `--parity-cache DIR` (or env `PARITY_JAX_CACHE`): jax persistent compilation cache folder;
  each xdist worker gets its own subfolder. `--parity-cache none` disables it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from parity.devices import DeviceCountError, set_cpu_device_count


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("parity", "differential equivalence testing")
    group.addoption(
        "--parity-devices",
        type=int,
        default=None,
        help="simulated CPU device count, set before jax starts (env PARITY_DEVICES)",
    )
    group.addoption(
        "--parity-cache",
        default=None,
        help="jax persistent compilation cache folder, per xdist worker; 'none' disables "
        "(env PARITY_JAX_CACHE; default .jax_cache under the rootdir)",
    )


def _device_count(config: pytest.Config) -> int | None:
    value = config.getoption("--parity-devices")
    if value is None and os.environ.get("PARITY_DEVICES"):
        raw = os.environ["PARITY_DEVICES"]
        try:
            value = int(raw)
        except ValueError:
            raise pytest.UsageError(f"PARITY_DEVICES must be an integer, got {raw!r}") from None
    return value


def _enable_compile_cache(config: pytest.Config) -> None:
    raw = config.getoption("--parity-cache") or os.environ.get("PARITY_JAX_CACHE")
    if raw is not None and raw.lower() == "none":
        return
    base = Path(raw) if raw else Path(config.rootpath) / ".jax_cache"
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    folder = base / worker
    folder.mkdir(parents=True, exist_ok=True)
    import jax

    jax.config.update("jax_compilation_cache_dir", str(folder))
    # Small test programs compile in well under a second; cache them all.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_configure(config: pytest.Config) -> None:
    n = _device_count(config)
    if n is not None:
        if n < 1:
            raise pytest.UsageError(f"--parity-devices must be at least 1, got {n}")
        try:
            set_cpu_device_count(n)
        except DeviceCountError as e:
            raise pytest.UsageError(str(e)) from None
    _enable_compile_cache(config)
