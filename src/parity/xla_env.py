"""The XLA settings of this process that every layer reads: the names of the XLA flags that
fix the simulated CPU device count and the CPU ISA cap, and whether jax has started its
backends (after which neither can change). `parity.run.devices` sets them,
`parity.store.provenance` records them and `parity.environment` compares them; all take the
names from here. This module imports nothing of parity and no jax: it asks jax only if jax
is already imported.
"""

from __future__ import annotations

import sys

__all__ = ["DEVICE_FLAG", "ISA_FLAG", "jax_backend_started"]

#: The XLA flag of the simulated CPU device count.
DEVICE_FLAG = "--xla_force_host_platform_device_count"
#: The XLA flag of the CPU ISA cap.
ISA_FLAG = "--xla_cpu_max_isa"


def jax_backend_started() -> bool:
    """Whether jax has initialised its backends in this process (so the count is fixed)."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())
