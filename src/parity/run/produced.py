"""Produce in a fresh process, then check: what `parity check` and `parity bisect` do with
a code root (`Produced`, `produce`, `check_produced`). The producers themselves run in
`parity.machinery._producer_runner`, which `parity.machinery.launcher.run_producers`
starts, for repin too.

`produce` runs the producers file in a subprocess (`parity.machinery._producer_runner`) with the ISA
cap and device count set before jax starts, importing the code under test from the
configured src roots of some code root (the current tree, or a worktree at a commit), and
loads what it saved. `check_produced` compares every group with the goldens in one pass
through `parity.check.check_groups`, the one place that resolves classes and applies the
drift policy. Nothing here imports jax.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from parity.baseline import BaselineSource
from parity.check import GoldenDir, check_groups
from parity.environment import PolicyMode
from parity.judge.dataflow import DATAFLOW, HOST
from parity.machinery.config import ConfigError, ParityConfig
from parity.machinery.launcher import (
    Command,
    ProducerRun,
    ProducerRunError,
    UnusableClassError,
    load_runner_output,
    run_producers,
)
from parity.machinery.processes import Layout
from parity.results import CheckResult

__all__ = [
    "Produced",
    "check_produced",
    "produce",
    "refuse_unusable_classes",
]


@dataclass(frozen=True)
class Produced:
    """What one producer run returned.

    **Fields:**

    - `groups`: group -> `{key: array}`, keys in producer (forward) order.
    - `seconds`: wall time of the run, process start included.
    - `xla_flags`: the XLA flags the run used.
    - `provenance`: group -> the producer process's provenance (collected where the arrays
      were made), which the drift policy judges against the golden's.
    - `layout`: processes and devices per process of the run.
    - `orders`: group -> how its forward order was made (`dataflow`: its outputs were read
      from its traced program; `declared`: it does not trace, or was not traced).
    """

    groups: dict[str, dict[str, np.ndarray]]
    seconds: float
    xla_flags: str
    provenance: dict[str, dict[str, Any]] = field(default_factory=dict)
    layout: Layout = field(default_factory=Layout)
    orders: dict[str, str] = field(default_factory=dict)


def produce(
    code_root: Path,
    config: ParityConfig,
    *,
    groups: Sequence[str] = (),
    drop_paths: Sequence[Path] = (),
    progress: Callable[[str], None] = lambda _: None,
    timeout: float | None = None,
    coordinator: str | None = None,
    process_id: int | None = None,
    code: str = "the code under test",
    command: Command = "check",
    check_classes: bool = False,
) -> Produced:
    """Run the configured producers against `code_root` in a fresh process.

    **Arguments:**

    - `code_root`: the checkout whose code is imported (the project root, or a worktree);
      `config.src` is taken relative to the project root and found at the same place here.
    - `config`: producers file, src roots, ISA cap and device count.
    - `groups`: a subset of the producer groups (default all).
    - `drop_paths`: `sys.path` entries the child must not import from (the user's own
      src roots, when `code_root` is another commit).
    - `progress`: receives the producer's progress lines.
    - `timeout`: the seconds the run may take (with `config.processes` above 1 the default
      is `parity.machinery.processes.DEFAULT_TIMEOUT_S`; one process has no limit by default).
    - `coordinator`, `process_id`: on a cluster, process 0's `HOST:PORT` and this host's
      process id: only this host's worker starts here (one process per host), and only
      process 0's host gets the outputs (the others get no groups).
    - `code`: what `code_root` holds, for messages (`"commit 1a2b3c4d5e6f"`).
    - `command`: the command that runs them, which a failure's message fits
      (`parity.machinery.launcher.ProducerRunError`).
    - `check_classes`: refuse a `CLASS_MAP` naming a class parity cannot use, before any
      group runs (`parity.machinery.launcher.UnusableClassError`), as a repin does.

    With `config.processes` above 1 the producers run SPMD as the workers of one JAX
    distributed run, `config.devices` devices each, and process 0's outputs are loaded.

    **Returns:** a `Produced`. Raises `parity.machinery.launcher.ProducerRunError` if the
    producers cannot run there (a crash, a worker of a multi-process run failed or was
    killed, the run timed out; its `UnknownGroupsError` for a group they do not define, its
    `UnusableClassError` with `check_classes`),
    and `parity.machinery.config.ConfigError` if nothing says which producers to run.
    """
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="parity-produce-") as tmp:
        run = ProducerRun.of(
            config,
            Path(tmp),
            command=command,
            code_root=code_root,
            groups=groups,
            drop_paths=drop_paths,
            timeout=timeout,
            coordinator=coordinator,
            process_id=process_id,
            code=code,
            check_classes=check_classes,
        )
        flags = run_producers(run, progress=progress)
        out: dict[str, dict[str, np.ndarray]] = {}
        provenance: dict[str, dict[str, Any]] = {}
        orders: dict[str, str] = {}
        for manifest in sorted(Path(tmp).glob("*.json")):
            loaded = load_runner_output(Path(tmp), manifest.stem, command=command)
            out[manifest.stem] = loaded.arrays
            provenance[manifest.stem] = loaded.provenance
            orders[manifest.stem] = loaded.order
    layout = Layout(config.processes, config.devices)
    return Produced(out, time.perf_counter() - t0, flags, provenance, layout, orders)


def refuse_unusable_classes(config: ParityConfig, *, command: Command = "check") -> None:
    """Raise `UnusableClassError` where the configured producers' `CLASS_MAP` names a class
    parity cannot use: the producers file is imported in a fresh process, as `repin
    --classes-only` does (the runner's `--check-classes`, the one check), and no group
    runs. For the pytest plugin, which runs no producers of its own: a `parity check`
    asks in its producer run (`produce(check_classes=True)`). A producers file that is
    missing or cannot be imported, or src roots that cannot be found, are left to the run
    that needs them to report.
    """
    try:
        producers, src = config.need_producers(), config.src_relative()
    except ConfigError:
        return
    with tempfile.TemporaryDirectory(prefix="parity-classes-") as tmp:
        try:
            run = ProducerRun(
                code_root=config.root,
                producers=producers,
                out=Path(tmp),
                command=command,
                src=src,
                mode="class_map",
                check_classes=True,
            )
            run_producers(run, progress=lambda _: None)
        except UnusableClassError:
            raise
        except ProducerRunError:
            return


def check_produced(
    produced: Produced,
    goldens: GoldenDir | Path,
    *,
    overrides: Sequence[tuple[str, str]] = (),
    class_name: str | None = None,
    drift_mode: PolicyMode = "warn",
    save_actual: Path | None = None,
    node: str | None = None,
    baseline: BaselineSource | None = None,
    require_baseline: bool = False,
) -> list[CheckResult]:
    """Check every produced group against its golden file, in one pass
    (`parity.check.check_groups`).

    **Arguments:**

    - `produced`: what `produce` returned.
    - `goldens`: the golden folder.
    - `overrides`, `class_name`: before the pinned class map (`parity.check`'s precedence).
    - `drift_mode`: the drift policy (`parity.environment`), judged against each
      group's producer environment.
    - `save_actual`: a folder for the obtained arrays of failing groups.
    - `node`: who ran the check, for reports.
    - `baseline`: what re-produces the baselines (`parity.run.baseline.BaselineBuilder`):
      the groups whose first verdict wants their baseline (`parity.baseline`) get it from
      one producer run per base commit, not one per group. None: the goldens are the
      reference.
    - `require_baseline`: a group whose baseline would be the reference but cannot be
      re-produced is a `CheckError` (`parity.check.check_file`).

    **Returns:** one `CheckResult` per group, in group order. Raises `CheckError` for a
    group without a usable golden file, and (`require_baseline`) one whose baseline cannot
    be re-produced.
    """
    # The drift policy judges the producer process's environment, not this jax-free one.
    # A group produced in the order its programs compute it is compared in that order.
    orders = produced.orders
    dataflow = {g: list(a) for g, a in produced.groups.items() if orders.get(g) == DATAFLOW}
    return check_groups(
        produced.groups,
        dataflow_orders=dataflow,
        host_computed={g for g in produced.groups if orders.get(g) == HOST},
        goldens=goldens,
        provenance=produced.provenance,
        baseline=baseline,
        class_map=class_name,
        overrides=overrides,
        drift_mode=drift_mode,
        node=node,
        produce_s=produced.seconds / max(1, len(produced.groups)),
        save_actual=save_actual,
        require_baseline=require_baseline,
    )
