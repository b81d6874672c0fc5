"""Produce in a fresh process, then check: what `parity check` and `parity bisect` do with
a code root (`Produced`, `produce`, `check_produced`). The producers themselves run in
`parity.machinery._producer_runner`, which `parity.machinery._launcher.run_producers`
starts, for repin too.

`produce` runs the producers file in a subprocess (`parity.machinery._producer_runner`) with the ISA
cap and device count set before jax starts, importing the code under test from the
configured src roots of some code root (the current tree, or a worktree at a commit), and
loads what it saved. `check_produced` compares every group with the goldens in one pass
through `parity.check.check_groups`, the one place that resolves classes and applies the
drift policy. Nothing here imports jax.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Unpack

import numpy as np

from parity._environment import backend_of
from parity._results import CheckError, CheckResult
from parity.check import BaselineSource, GoldenDir, GroupOptions, Settler, check_groups
from parity.judge._converting import Conversion, ConvertError
from parity.judge._dataflow import DATAFLOW, HOST
from parity.machinery._config import ConfigError, ParityConfig
from parity.machinery._converters import (
    CONVERT_DIR,
    LAYOUT_FILE,
    read_conversions,
    write_layouts,
)
from parity.machinery._launcher import (
    KeptRun,
    ProducerCommand,
    ProducerRun,
    ProducerRunError,
    UnusableClassError,
    kept_producers,
    run_producers,
)
from parity.machinery._processes import Layout
from parity.machinery._producers_table import ProducersTable
from parity.machinery._runner_output import RunnerOutput, load_runner_output
from parity.machinery._worker import Place
from parity.store import Provenance

__all__ = [
    "Checkout",
    "Produced",
    "check_produced",
    "goldens_layouts",
    "produce",
    "producers_table",
    "producing",
    "usable_conversion",
]


@dataclass(frozen=True)
class Produced:
    """What one producer run returned: one record per group, as the runner saved it.

    **Fields:**

    - `runs`: group -> what the runner saved for it (`parity.machinery._runner_output.
      RunnerOutput`: its arrays, keys in producer (forward) order; the provenance of the
      process that made them, which the drift policy judges against the golden's; how its
      order was made; why the recorder could not see its programs; the producers' table).
    - `seconds`: wall time of the run, process start included.
    - `xla_flags`: the XLA flags the run used.
    - `layout`: processes and devices per process of the run.
    - `conversions`: group -> what the producers' `CONVERT` does to its goldens
      (`parity.judge._converting.Conversion`), or why it cannot be used (`ConvertError`),
      for the groups it names whose goldens' layout the run was given.

    The views below read `runs`, one field of every group each.
    """

    runs: dict[str, RunnerOutput]
    seconds: float
    xla_flags: str
    layout: Layout = field(default_factory=Layout)
    conversions: Mapping[str, Conversion | ConvertError] = field(default_factory=dict)

    @property
    def groups(self) -> dict[str, dict[str, np.ndarray]]:
        """Group -> `{key: array}`, keys in producer (forward) order."""
        return {g: r.arrays for g, r in self.runs.items()}

    @property
    def provenance(self) -> dict[str, Provenance]:
        """Group -> the producer process's provenance (collected where the arrays were
        made)."""
        return {g: r.provenance for g, r in self.runs.items()}

    @property
    def orders(self) -> dict[str, str]:
        """Group -> how its forward order was made (`dataflow`: its outputs were read from
        its traced program; `declared`: it does not trace, or was not traced; `host`: no jax
        program computed them; `unread`: not asked for)."""
        return {g: r.order for g, r in self.runs.items()}

    @property
    def recorders(self) -> dict[str, str]:
        """Group -> why the programs it ran could not be seen (this jax cannot be hooked, or
        a hook failed: `parity.origin._adapter`), one line; absent where they were."""
        return {g: r.recorder for g, r in self.runs.items() if r.recorder}

    @property
    def table(self) -> ProducersTable:
        """The producers' `CLASS_MAP`, `STACK` and `RENAME`, the same for every group (none
        where no group was produced)."""
        return next((r.table for r in self.runs.values()), ProducersTable())

    def recorder_line(self) -> str:
        """The header's one line where the recorder could not see some group's programs
        ("" where it saw every group's): why, and which groups."""
        lines: dict[str, list[str]] = {}
        for group, why in self.recorders.items():
            lines.setdefault(why, []).append(group)
        return "; ".join(f"{why} (groups {', '.join(gs)})" for why, gs in lines.items())


@dataclass(frozen=True, kw_only=True)
class Checkout:
    """The code a producer run imports.

    **Fields:** `root` (the checkout: the project root, or a worktree at a commit;
    `config.src` is taken relative to the project root and found at the same place here),
    `drop_paths` (`sys.path` entries the run must not import from: the user's own src
    roots, when `root` is another commit), `name` (what `root` holds, for messages:
    `"commit 1a2b3c4d5e6f"`).
    """

    root: Path
    drop_paths: Sequence[Path] = ()
    name: str = "the code under test"


@contextlib.contextmanager
def producing(
    config: ParityConfig,
    *,
    at: Checkout | None = None,
    groups: Sequence[str] = (),
    progress: Callable[[str], None] = lambda _: None,
    timeout: float | None = None,
    place: Place | None = None,
    command: ProducerCommand = "check",
    check_classes: bool = False,
    read_order: bool = True,
    keep: bool = False,
    goldens: GoldenDir | None = None,
) -> Iterator[tuple[Produced, KeptRun | None]]:
    """Run the configured producers against a checkout in a fresh process, and keep it
    while the block runs where asked (`keep`).

    **Arguments:**

    - `config`: producers file, src roots, ISA cap and device count.
    - `at`: the code imported (`Checkout`); None: `config.root`'s, the current tree.
    - `groups`: a subset of the producer groups (default all).
    - `progress`: receives the producer's progress lines.
    - `timeout`: the seconds the run may take (with `config.processes` above 1 the default
      is `parity.machinery._processes.DEFAULT_TIMEOUT_S`; one process has no limit by default).
    - `place`: on a cluster, this host's place in the run
      (`parity.machinery._worker.Place`: only its worker starts here, and only process
      0's host gets the outputs, the others no groups); None: every
      process runs here.
    - `command`: the command that runs them, which a failure's message fits
      (`parity.machinery._launcher.ProducerRunError`).
    - `check_classes`: refuse a `CLASS_MAP` naming a class parity cannot use, before any
      group runs (`parity.machinery._launcher.UnusableClassError`), as a repin does.
    - `read_order`: read each group's forward order from the programs it runs (the
      recorder's hooks in jax while it runs); False: leave it unread, no hook installed.
    - `keep`: in a run of one process, keep the process alive while the block runs, so
      that a failing check records its groups op by op in the run that produced them
      (`parity.machinery._launcher.KeptRun`), not in another one. Not on a GPU or TPU,
      which one process holds at a time: the run there ends once its groups are saved,
      and the kept run yielded is None.
    - `goldens`: the golden folder the groups are checked against: each group's layout
      (its golden keys and shapes) goes to the run, which probes the producers' `CONVERT`
      on it (`Produced.conversions`).

    With `config.processes` above 1 the producers run SPMD as the workers of one JAX
    distributed run, `config.devices` devices each, and process 0's outputs are loaded.

    **Yields:** a `Produced`, and the `KeptRun` that made it where it is kept (one
    process and `keep`; None otherwise). Raises `parity.machinery._launcher.ProducerRunError` if the
    producers cannot run there (a crash, a worker of a multi-process run failed or was
    killed, the run timed out; its `UnknownGroupsError` for a group they do not define, its
    `UnusableClassError` with `check_classes`),
    and `parity.machinery._config.ConfigError` if nothing says which producers to run.
    """
    at = at or Checkout(root=config.root)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="parity-produce-") as tmp:
        run = ProducerRun.of(
            config,
            Path(tmp),
            command=command,
            code_root=at.root,
            groups=groups,
            drop_paths=at.drop_paths,
            timeout=timeout,
            coordinator=None if place is None else place.coordinator,
            process_id=None if place is None else place.process_id,
            code=at.name,
            check_classes=check_classes,
            read_order=read_order,
            keep=keep and config.processes == 1 and place is None,
        )
        if goldens is not None:
            layouts = goldens_layouts(goldens, groups)
            run = replace(run, goldens_layout=write_layouts(Path(tmp), layouts))
        with contextlib.ExitStack() as stack:
            if run.keep:
                kept: KeptRun | None = stack.enter_context(kept_producers(run, progress=progress))
                flags = kept.flags
            else:
                kept, flags = None, run_producers(run, progress=progress)
            produced = _loaded(Path(tmp), config, command, time.perf_counter() - t0, flags)
            if kept is not None and _on_an_accelerator(produced):
                # One process holds an accelerator at a time: the base's run needs it free,
                # so a failure there is recorded in a run of its own, as before.
                kept.close()
                kept = None
            yield produced, kept


def _on_an_accelerator(produced: Produced) -> bool:
    """Whether some group ran on a GPU or TPU (its provenance's `backend`)."""
    return any(backend_of(p) != "cpu" for p in produced.provenance.values())


def _loaded(
    tmp: Path, config: ParityConfig, command: ProducerCommand, seconds: float, flags: str
) -> Produced:
    """What the runner saved in `tmp`, every group, as a `Produced`."""
    runs = {
        manifest.stem: load_runner_output(tmp, manifest.stem, command=command)
        for manifest in sorted(tmp.glob("*.json"))
        if manifest.name != LAYOUT_FILE
    }
    layout = Layout(config.processes, config.devices)
    return Produced(runs, seconds, flags, layout, conversions=read_conversions(tmp))


def goldens_layouts(goldens: GoldenDir, groups: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """Each group's golden keys and shapes, in the goldens' order (`groups`; default every
    group with a golden file): what a run probes the producers' `CONVERT` on."""
    out: dict[str, dict[str, Any]] = {}
    for group in groups or goldens.groups():
        if goldens.path_of(group).is_file():
            with contextlib.suppress(CheckError):  # an unusable file: its check says so
                gf = goldens.open(group)
                out[group] = {k: gf.info(k).shape for k in gf.ordered_keys()}
    return out


def produce(
    config: ParityConfig,
    *,
    at: Checkout | None = None,
    groups: Sequence[str] = (),
    progress: Callable[[str], None] = lambda _: None,
    timeout: float | None = None,
    place: Place | None = None,
    command: ProducerCommand = "check",
    check_classes: bool = False,
    read_order: bool = True,
) -> Produced:
    """Run the configured producers against a checkout in a fresh process, as `producing`
    does (the same arguments), the process ended once its groups are saved.

    **Returns:** a `Produced`. Raises as `producing` does.
    """
    with producing(
        config,
        at=at,
        groups=groups,
        progress=progress,
        timeout=timeout,
        place=place,
        command=command,
        check_classes=check_classes,
        read_order=read_order,
    ) as (produced, _):
        return produced


def producers_table(
    config: ParityConfig,
    *,
    command: ProducerCommand = "check",
    check_classes: bool = False,
    goldens: GoldenDir | None = None,
    conversions_into: Path | None = None,
) -> ProducersTable | None:
    """The configured producers' table (`CLASS_MAP`, `STACK`, `RENAME`), as a producer run
    reads it (`ProducersTable.of_module`): the producers file is imported in a fresh
    process, as `repin --classes-only` does, and no group runs. For the pytest plugin, which
    runs no producers of its own and must read the table as `parity check` does (a
    `parity check` gets it with each group's arrays, `Produced.table`).

    **Arguments:** `config`, the producers file and src roots; `command`, the command a
    failure's message fits; `check_classes`, refuse a `CLASS_MAP` naming a class parity
    cannot use (the runner's `--check-classes`, the one check); `goldens` and
    `conversions_into`, the producers' `CONVERT` probed on those goldens' layout and what
    it does kept in that folder, as a run keeps it in its own
    (`parity.machinery._converters.read_conversions` reads it).

    **Returns:** the table; None where the producers file is missing or cannot be imported
    or its src roots cannot be found, left to the run that needs them to report. Raises
    `UnusableClassError` (with `check_classes`).
    """
    try:
        producers, src = config.need_producers(), config.src_relative()
    except ConfigError:
        return None
    with tempfile.TemporaryDirectory(prefix="parity-table-") as tmp:
        try:
            run = ProducerRun(
                code_root=config.root,
                producers=producers,
                out=Path(tmp),
                command=command,
                src=src,
                mode="class_map",
                check_classes=check_classes,
            )
            if goldens is not None:
                run = replace(
                    run, goldens_layout=write_layouts(Path(tmp), goldens_layouts(goldens))
                )
            run_producers(run, progress=lambda _: None)
        except UnusableClassError:
            raise
        except ProducerRunError:
            return None
        made = Path(tmp) / CONVERT_DIR
        if conversions_into is not None and made.is_dir():
            shutil.copytree(made, conversions_into / CONVERT_DIR, dirs_exist_ok=True)
        return ProducersTable.read(Path(tmp))


def check_produced(
    produced: Produced,
    goldens: GoldenDir | Path,
    *,
    baseline: BaselineSource | None = None,
    settle: Settler | None = None,
    **options: Unpack[GroupOptions],
) -> list[CheckResult]:
    """Check every produced group against its golden file, in one pass
    (`parity.check.check_groups`).

    **Arguments:**

    - `produced`: what `produce` returned.
    - `goldens`: the golden folder.
    - `baseline`: what re-produces the baselines (`parity.run._baseline.BaselineBuilder`):
      the groups whose first verdict wants their baseline (`parity.check._against_baseline`)
      get it from one producer run per base commit, not one per group. None: the goldens are the
      reference.
    - `settle`: what settles the failures op by op (`parity.run._origins.FailureSettler`),
      once, after every verdict; None: the verdicts stand.
    - `options`: as `parity.check.check_group` takes them (`class_map`, `overrides`,
      `drift_mode`, `node`, `save_actual`, `require_baseline`, ...); `produce_s` is each
      group's share of the producers' run.

    **Returns:** one `CheckResult` per group, in group order. Raises `CheckError` for a
    group without a usable golden file, and (`require_baseline`) one whose baseline cannot
    be re-produced.
    """
    # The drift policy judges the producer process's environment, not this jax-free one.
    # A group produced in the order its programs compute it is compared in that order.
    orders = produced.orders
    dataflow = {g: list(a) for g, a in produced.groups.items() if orders.get(g) == DATAFLOW}
    options.setdefault("produce_s", produced.seconds / max(1, len(produced.groups)))
    # The producers' STACK (stacked keys compared with per-layer goldens) and RENAME (moved
    # keys compared with the goldens'), where the caller gave none of its own.
    table = produced.table.given(stack=options.get("stack"), rename=options.get("rename"))
    if table.stack:
        options["stack"] = table.stack
    if table.rename:
        options["rename"] = table.rename
    # The producers' CONVERT: each group's tree read in its goldens' layout through it.
    conversions = {g: usable_conversion(produced.conversions, g) for g in produced.groups}
    return check_groups(
        produced.groups,
        dataflow_orders=dataflow,
        host_computed={g for g in produced.groups if orders.get(g) == HOST},
        goldens=goldens,
        provenance=produced.provenance,
        baseline=baseline,
        settle=settle,
        conversions={g: c for g, c in conversions.items() if c is not None},
        **options,
    )


def usable_conversion(
    conversions: Mapping[str, Conversion | ConvertError], group: str
) -> Conversion | None:
    """What the producers' `CONVERT` does to `group`'s goldens (None where it names no
    such group); `CheckError` where its converter cannot be used (it computes, copies,
    raises: the user's input), for `parity check`, bisect and the pytest plugin alike."""
    conversion = conversions.get(group)
    if isinstance(conversion, ConvertError):
        raise CheckError(f"the producers' CONVERT[{group!r}] cannot be used: {conversion}")
    return conversion
