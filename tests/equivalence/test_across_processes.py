"""The subject across processes, through parity's launcher (`parity.run._produced.produce`, what
`parity check --processes 2 --devices 2` runs): the producers run as 2 processes x 2
devices of one JAX distributed run, each process supplying its own rows of the batch, and
as 1 process x 4 devices; the 2x2 outputs must pass their goldens under the pinned class
maps alone (the check reads the 2x2 layout from the producers' provenance and judges each key
by the looser of its pinned class and its calibrated bound at 2x2), and match the 1x4 run
live.

Between 2x2 and 1x4 the per-device shards are the same (one row per device); what changes
is the all-reduce over the four devices, in-process in one case and through gloo between
processes in the other, which sums the per-device partials in another order. So the two
agree within fp32 reassociation of a 4-term sum, not bitwise (measured on eval: 4 of 56
metrics differ, worst 4.8e-7, a ce_diff of 0.0037, which breaks `device_count` and holds
`eval_metric`). The live check is between two layouts, neither the pinned one, so no pinned
class applies: each key is held to the sum of the spreads calibration recorded for it at
2x2 and at 1x4 (each layout's distance from the golden bounds their distance from each
other), times the calibrated class's margin.

The default suite checks the `eval` group at 2x2 against its goldens (the cheapest group
that reduces across processes: one run of about 30 s of compile per process);
`--across-processes all` (by hand: `pytest tests/equivalence/test_across_processes.py
--across-processes all`) adds the three trajectories and the 1x4 run with the live checks.
Each run starts its own processes, so the module runs in 1-device sessions only; it is part
of the test suite (`pytest -n 2`), not of tox -e equivalence, whose 2x2 session runs every
group at that layout through the pytest plugin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from parity.calibrated._spreads import Spreads
from parity.judge._tolerance import ClassMap
from parity.machinery._config import load_config
from parity.machinery._worker import worker_place
from parity.report import format_table
from parity.run._produced import Produced, produce

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_GROUPS = ("eval",)
ALL_GROUPS = ("train_remat_nothing", "train_remat_dots", "train_branches", "eval")


def _live(config: pytest.Config) -> bool:
    return config.getoption("--across-processes") == "all"


def _groups(config: pytest.Config) -> tuple[str, ...]:
    return ALL_GROUPS if _live(config) else DEFAULT_GROUPS


def _against_goldens(group: str, produced: Produced, parity_check) -> Any:
    share = produced.seconds / len(produced.groups)
    return parity_check(produced.groups[group], group, name=f"2x2.{group}", produce_s=share,
                        provenance=produced.provenance[group], fail=False)  # fmt: skip


def _between_layouts(gf: Any, labels: tuple[str, str]) -> ClassMap:
    """Per key, `calibrated` with the sum of its recorded spreads under both layouts."""
    spreads = Spreads.of(gf.provenance)
    missing = [lb for lb in labels if lb not in spreads.labels]
    assert not missing, f"{gf.path} records no calibration at {missing}; run parity calibrate"
    rules = []
    for key in gf.ordered_keys():
        total = sum(spreads.for_columns(key, [lb]) or 0.0 for lb in labels)
        rules.append((key, f"calibrated[spread={total:.6g}]"))
    return ClassMap(rules=tuple(rules))


@pytest.mark.slow
def test_groups_at_2x2_match_their_goldens_and_the_1x4_run(
    pytestconfig, parity_check, parity_goldens
):
    """One test, so that xdist runs the layouts once (a fixture would run per worker)."""
    devices = pytestconfig.getoption("--parity-devices")
    if worker_place() is not None or devices not in (None, 1):
        pytest.skip("starts its own 2x2 and 1x4 runs: runs in 1-device sessions only")
    base = load_config(ROOT)
    groups = _groups(pytestconfig)
    layouts = {"2x2": (2, 2), "1x4": (1, 4)} if _live(pytestconfig) else {"2x2": (2, 2)}
    runs: dict[str, Produced] = {}
    for name, (processes, per_process) in layouts.items():
        config = base.with_overrides(processes=processes, devices=per_process)
        # Four groups at 2x2 on a loaded 2-core machine can outlast the default timeout.
        runs[name] = produce(config, groups=groups, timeout=3600)
        assert runs[name].layout.processes == processes
        assert sorted(runs[name].groups) == sorted(groups)
    checks = {f"2x2.{g}": _against_goldens(g, runs["2x2"], parity_check) for g in groups}
    if "1x4" in runs:
        for group in groups:
            a, b = runs["2x2"].groups[group], runs["1x4"].groups[group]
            assert list(a) == list(b), f"{group}: the two layouts produced different keys"
            between = _between_layouts(parity_goldens.open(group), ("processes=2x2", "devices=4"))
            checks[f"live.2x2_vs_1x4.{group}"] = parity_check(
                a, b, name=f"live.2x2_vs_1x4.{group}", class_map=between, order=list(a),
                fail=False,
            )  # fmt: skip
    failed = {name: c for name, c in checks.items() if not c.passed}
    assert not failed, "\n".join(
        f"parity check {name!r} failed\n{format_table(c, header={})}" for name, c in failed.items()
    )
