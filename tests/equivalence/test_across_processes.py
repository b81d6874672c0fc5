"""The subject across processes, through parity's launcher (`parity.runner.produce`, what
`parity check --processes 2 --devices 2` runs): the producers run as 2 processes x 2
devices of one JAX distributed run, each process supplying its own rows of the batch, and
as 1 process x 4 devices; the 2x2 outputs must pass their goldens under the classes of the
4-device run (`test_goldens.DEVICE_OVERRIDES`, the same steps left out of train_branches),
and match the 1x4 run live.

Between 2x2 and 1x4 the per-device shards are the same (one row per device); what changes
is the all-reduce over the four devices, in-process in one case and through gloo between
processes in the other, which sums the per-device partials in another order. So the two
agree within fp32 reassociation of a 4-term sum, not bitwise (measured on eval: 4 of 56
metrics differ, worst 4.8e-7, a ce_diff of 0.0037, which breaks `device_count` and holds
`eval_metric`): the live check uses the classes the goldens are judged under on 4 devices.

The default suite checks the `eval` group at 2x2 against its goldens (the cheapest group
that reduces across processes: one run of about 30 s of compile per process);
`--across-processes all` (tox -e equivalence) adds the three trajectories and the 1x4 run
with the live checks. Each run starts its own processes, so the module runs in 1-device
sessions only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_goldens import BRANCHES_1_DEVICE_ONLY, DEVICE_OVERRIDES

from parity.config import load_config
from parity.processes import worker_place
from parity.report import format_table
from parity.runner import Produced, produce
from parity.tolerance import ClassMap

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_GROUPS = ("eval",)
ALL_GROUPS = ("train_remat_nothing", "train_remat_dots", "train_branches", "eval")
#: The classes of a 4-device run against 1-device goldens, for 2x2 against 1x4 too.
LIVE_CLASSES = ClassMap(rules=(*DEVICE_OVERRIDES, ("eval.*", "eval_metric")))


def _live(config: pytest.Config) -> bool:
    return config.getoption("--across-processes") == "all"


def _groups(config: pytest.Config) -> tuple[str, ...]:
    return ALL_GROUPS if _live(config) else DEFAULT_GROUPS


def _kept(group: str, arrays: dict[str, Any]) -> dict[str, Any]:
    if group != "train_branches":
        return arrays
    return {k: v for k, v in arrays.items() if not k.startswith(BRANCHES_1_DEVICE_ONLY)}


def _against_goldens(group: str, produced: Produced, parity_check, parity_goldens) -> Any:
    actual = produced.groups[group]
    share = produced.seconds / len(produced.groups)
    if group != "train_branches":
        return parity_check(actual, group, name=f"2x2.{group}", class_overrides=DEVICE_OVERRIDES,
                            produce_s=share, fail=False)  # fmt: skip
    gf = parity_goldens.open(group)
    keep = list(_kept(group, dict.fromkeys(gf.ordered_keys())))
    pinned = ClassMap.from_json(gf.class_map_json)
    class_map = ClassMap(rules=(*DEVICE_OVERRIDES, *pinned.rules), default=pinned.default)
    return parity_check({k: actual[k] for k in keep}, {k: gf[k] for k in keep},
                        name=f"2x2.{group}", class_map=class_map, order=keep,
                        produce_s=share, fail=False)  # fmt: skip


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
        runs[name] = produce(config.root, config, groups=groups, timeout=3600)
        assert runs[name].layout.processes == processes
        assert sorted(runs[name].groups) == sorted(groups)
    checks = {f"2x2.{g}": _against_goldens(g, runs["2x2"], parity_check, parity_goldens)
              for g in groups}  # fmt: skip
    if "1x4" in runs:
        for group in groups:
            a, b = runs["2x2"].groups[group], runs["1x4"].groups[group]
            assert list(a) == list(b), f"{group}: the two layouts produced different keys"
            checks[f"live.2x2_vs_1x4.{group}"] = parity_check(
                _kept(group, a), _kept(group, b), name=f"live.2x2_vs_1x4.{group}",
                class_map=LIVE_CLASSES, order=list(_kept(group, a)), fail=False,
            )  # fmt: skip
    failed = {name: c for name, c in checks.items() if not c.passed}
    assert not failed, "\n".join(
        f"parity check {name!r} failed\n{format_table(c, header={})}" for name, c in failed.items()
    )
