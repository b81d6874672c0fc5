"""Every golden group: produce on the current code, check under the pinned classes.

The goldens are pinned on 1 device. On more than one, trajectories are checked under
`device_count` instead of `trajectory`, and so are the toy targets' outputs: their matmuls,
at one example per device, take other kernels than at four (measured: up to 2.4e-7 abs,
2.7e-6 relative, against bitwise on 1 device). The GLU logits and taps stay bitwise on 4
devices, and eval metrics keep `eval_metric`, which was sized on the 1-against-4 spread.
"""

from __future__ import annotations

import time

import jax
import pytest
from producers import GROUPS

DEVICE_OVERRIDES = [("traj.*", "device_count"), ("*.toy.*", "device_count")]


@pytest.mark.parametrize("group", list(GROUPS))
def test_group_matches_its_goldens(group, parity_check):
    t0 = time.perf_counter()
    actual = GROUPS[group]()
    produce_s = time.perf_counter() - t0
    overrides = DEVICE_OVERRIDES if jax.device_count() > 1 else []
    parity_check(actual, group, class_overrides=overrides, produce_s=produce_s)


def test_every_golden_file_has_a_producer(parity_goldens):
    orphans = [g for g in parity_goldens.groups() if g not in GROUPS]
    assert not orphans, (
        f"golden files {orphans} in {parity_goldens.path} have no producer group in "
        f"tests/equivalence/producers.py (producers define {sorted(GROUPS)}); delete them or "
        "restore their producers, then repin: python tools/repin_goldens.py --base <SHA>"
    )
