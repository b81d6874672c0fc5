"""What the calibration projects of tests/parity share (calibrated/test_calibrated,
check/test_against_baseline): their numpy producers move `BASE = np.linspace(1.0, 2.0, 8)`
by `DEVICE_NOISE` on more than one device, as XLA's layouts move bits, and a test computes
the resulting figure here, by another path than the harness's."""

from __future__ import annotations

import numpy as np

DEVICE_NOISE = 2.5e-7


def moved(noise: float) -> float:
    """max |a-b| of the producers' `BASE` moved by `noise`, in float32."""
    base = np.linspace(1.0, 2.0, 8)
    a = (base + noise).astype(np.float32).astype(np.float64)
    return float(np.max(np.abs(a - base.astype(np.float32).astype(np.float64))))
