"""The XLA settings of this process that every layer reads: the names of the XLA flags that
fix the simulated CPU device count and the CPU ISA cap, the cap every run uses, and whether
jax has started its backends (after which neither can change). `parity.machinery._devices` sets
them, `parity.store._provenance` records them and `parity._environment` compares them; all take the
names from here. This module imports nothing of parity and no jax: it asks jax only if jax
is already imported.
"""

from __future__ import annotations

import sys

__all__ = ["DEFAULT_ISA_CAP", "DEVICE_FLAG", "ISA_CAPS", "ISA_FLAG", "jax_backend_started"]

#: The XLA flag of the simulated CPU device count.
DEVICE_FLAG = "--xla_force_host_platform_device_count"
#: The XLA flag of the CPU ISA cap.
ISA_FLAG = "--xla_cpu_max_isa"
#: XLA CPU ISA caps (`--xla_cpu_max_isa`), lowest first, with the /proc/cpuinfo flag each
#: one needs.
ISA_CAPS: tuple[tuple[str, str], ...] = (
    ("SSE4_2", "sse4_2"),
    ("AVX", "avx"),
    ("AVX2", "avx2"),
    ("AVX512", "avx512f"),
    ("AVX512_VNNI", "avx512_vnni"),
    ("AVX512_BF16", "avx512_bf16"),
)
#: The ISA cap every pinning or checking run uses, so that bitwise goldens reproduce on any
#: x86 host with at least AVX2 (see docs/design.md, "Reproducing bits across hosts").
DEFAULT_ISA_CAP = "AVX2"


def jax_backend_started() -> bool:
    """Whether jax has initialised its backends in this process (so the count is fixed)."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())
