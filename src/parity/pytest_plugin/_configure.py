"""Setting the session up: `[tool.parity]` and the options applied before jax starts
(device count, ISA cap, compilation cache, src roots on `sys.path`), the launch of a
multi-process session, the golden folder."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from parity.judge._tolerance import RuleError, flag_rules
from parity.machinery._config import ConfigError, ParityConfig, load_config
from parity.machinery._devices import (
    DeviceCountError,
    cap_isa,
    set_cpu_device_count,
)
from parity.machinery._worker import Place, worker_place
from parity.pytest_plugin._stash import (
    BASELINE,
    CONFIG,
    CONVERTED,
    GOLDENS,
    NARROWED,
    ORIGINS,
    OVERRIDES,
    RESULTS,
    TABLE,
)

if TYPE_CHECKING:  # parity.check loads h5py: imported only when a check runs
    from parity.run._baseline import BaselineBuilder


def _enable_compile_cache(project: ParityConfig) -> None:
    """The machine's one compilation cache (`parity.machinery._jax_cache`), for this process, its
    xdist siblings and every process its tests start."""
    from parity.machinery import _compile_count as compile_count, _jax_cache as jax_cache

    root = jax_cache.resolve(project)
    jax_cache.export(root)
    if root is not None:
        jax_cache.enable(root)
    compile_count.install()


def session_config(config: pytest.Config) -> ParityConfig:
    """The session's settings, by the one path of the command line (`parity.machinery._config`):
    `[tool.parity]` of the nearest pyproject.toml above the invocation folder, then the
    `PARITY_*` environment variables, then the `--parity-*` options. The golden folder has
    a fourth source, the ini value `parity_goldens`, under `[tool.parity]`; the option and
    the ini value are relative to the rootdir. A bad value is a `pytest.UsageError`."""
    raw_cache = config.getoption("--parity-jax-cache")
    devices = config.getoption("--parity-devices")
    if devices is not None and devices < 1:
        raise pytest.UsageError(f"--parity-devices must be at least 1, got {devices}")
    processes = config.getoption("--parity-processes")
    try:
        project = load_config(config.invocation_params.dir)
        goldens = config.getoption("--parity-goldens")
        if goldens is None and "goldens" not in project.explicit:
            goldens = config.getini("parity_goldens")
        return project.with_overrides(
            goldens=None if goldens is None else Path(config.rootpath, goldens),
            isa=config.getoption("--parity-isa"),
            devices=devices,
            processes=processes,
            baseline=config.getoption("--parity-baseline"),
            drift=config.getoption("--parity-drift"),
            jax_cache=raw_cache,
        )
    except ConfigError as e:
        raise pytest.UsageError(str(e)) from None


def _session_overrides(config: pytest.Config) -> tuple[tuple[str, str], ...]:
    """`--parity-override PATTERN=CLASS` rules, then `--parity-class NAME` as `*=NAME`;
    a malformed rule or a class that cannot stand there
    (`parity.judge._tolerance.flag_rules`, the command line's parser) is a
    `pytest.UsageError` naming the option that gave it."""
    overrides = config.getoption("--parity-override") or ()
    try:
        return tuple(flag_rules(overrides, config.getoption("--parity-class"), prefix="--parity-"))
    except RuleError as e:
        raise pytest.UsageError(str(e)) from None


_SRC_ROOTS = pytest.StashKey[list[str]]()


def _put_src_on_path(config: pytest.Config) -> None:
    """Put `[tool.parity]`'s src roots at the front of `sys.path`, as the producer runner
    does for `parity check`, so the tests import the user's package with no PYTHONPATH
    and no install. Only where a `[tool.parity]` table exists: elsewhere the plugin does
    not know the project's layout. Once per session; `pytest_unconfigure` takes them off.
    """
    import sys

    if _SRC_ROOTS in config.stash:
        return
    try:
        project = load_config(config.invocation_params.dir)
    except ConfigError:
        return  # pytest_configure reports it
    added = [str(p) for p in project.src] if project.table else []
    sys.path[:0] = added
    config.stash[_SRC_ROOTS] = added


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Before the conftests (and later the test modules) are imported: they may import the
    project's package."""
    _put_src_on_path(early_config)


def pytest_unconfigure(config: pytest.Config) -> None:
    import sys

    for root in config.stash.get(_SRC_ROOTS, []):
        if root in sys.path:
            sys.path.remove(root)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """With N processes (N > 1: `--parity-processes N`, else `[tool.parity] processes`, the
    session's settings as `session_config` resolves them), this pytest runs no tests: it
    starts N copies of itself as the workers of one distributed run and ends with their
    verdict."""
    if worker_place() is not None:
        return None
    n = session_config(config).processes
    if n <= 1:
        return None
    import sys

    from parity.machinery._processes import Supervision, WorkerFailed, run_workers

    timeout = config.getoption("--parity-timeout")
    if timeout is None or timeout <= 0:
        raise pytest.UsageError(f"--parity-timeout must be positive, got {timeout}")
    argv = [sys.executable, "-m", "pytest", *config.invocation_params.args]
    if config.pluginmanager.hasplugin("xdist"):
        argv += ["-n", "0"]  # one jax process per worker; xdist would start more
    passed = (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED)
    try:
        codes = run_workers(
            argv,
            n,
            env=dict(os.environ),
            how=Supervision(
                timeout=timeout,
                ok=lambda code: code in passed,
                echo=sys.stdout,
                cwd=config.invocation_params.dir,
            ),
        )
    except WorkerFailed as e:
        import tempfile

        with tempfile.NamedTemporaryFile(
            "w", prefix="parity-session-", suffix=".log", delete=False
        ) as log:
            log.write(e.output)
        print(f"parity: {e}\nparity: every process's output: {log.name}", file=sys.stderr)
        return pytest.ExitCode.INTERRUPTED
    if len(set(codes)) > 1:
        print(
            f"parity: the processes ended with different statuses {codes} (by process id): a "
            "test outside parity_check failed on some processes only; process 0's output is "
            "above, run with --parity-processes 1 to see the others'",
            file=sys.stderr,
            flush=True,
        )
    return max(codes)


def pytest_configure(config: pytest.Config) -> None:
    project = session_config(config)
    config.stash[CONFIG] = project
    config.stash[OVERRIDES] = _session_overrides(config)
    # Loaded through a conftest's pytest_plugins, the plugin missed the early hook.
    _put_src_on_path(config)
    if "devices" in project.explicit:
        try:
            set_cpu_device_count(project.devices, isa_cap=project.isa)
        except DeviceCountError as e:
            raise pytest.UsageError(str(e)) from None
    if project.isa is not None:
        cap_isa(project.isa)
    # Before the runtime: joining a multi-process run starts jax's backends.
    _enable_compile_cache(project)
    place = worker_place()
    if place is not None:
        from parity.machinery._worker import initialize

        initialize(place.coordinator, place.processes, place.process_id)
    config.stash[RESULTS] = []
    config.stash[ORIGINS] = {}
    config.stash[NARROWED] = any("::" in str(a) for a in config.args)
    from parity.check import GoldenDir

    config.stash[GOLDENS] = GoldenDir(project.goldens)
    config.stash[BASELINE] = _baseline_builder(project)
    _read_the_table(config, project, place)


#: The key of the producers' table in an xdist worker's `workerinput`, and of the folder
#: that keeps what their `CONVERT` does.
_TABLE_INPUT = "parity_producers_table"
_CONVERTED_INPUT = "parity_converted"


def _read_the_table(config: pytest.Config, project: ParityConfig, place: Place | None) -> None:
    """The producers' table (`CLASS_MAP`, `STACK`, `RENAME`), read as `parity check` reads
    it (`parity.run._produced.producers_table`: the producers file imported in a fresh
    process, so the session's own process never imports it), into the stash, with what their
    `CONVERT` does to the goldens kept in a folder of the session's (`CONVERTED`). A
    `CLASS_MAP` naming a class parity cannot use (a typo) is a usage error at session start,
    as `parity check` and `parity repin` refuse it. Read once per session, by the process
    that starts it, and only where golden checks can run (a producers file and a golden
    folder); an xdist worker takes the controller's (`pytest_configure_node`), the other
    processes of a distributed session read it when their first golden check needs it."""
    if hasattr(config, "workerinput"):
        handed = config.workerinput.get(_TABLE_INPUT)  # pyright: ignore[reportAttributeAccessIssue]
        if handed is not None:
            from parity.machinery._producers_table import ProducersTable

            config.stash[TABLE] = ProducersTable.from_json_dict(handed)
        folder = config.workerinput.get(_CONVERTED_INPUT)  # pyright: ignore[reportAttributeAccessIssue]
        if folder is not None:
            config.stash[CONVERTED] = Path(folder)
        return
    if place is not None and place.process_id != 0:
        return
    if project.producers is None or not project.goldens.is_dir():
        return
    from parity.machinery._launcher import UnusableClassError
    from parity.pytest_plugin._fixtures import read_table

    # A producers file that cannot be imported reads as no rules: its tests say why. The
    # folder that keeps what their CONVERT does is handed to xdist's workers.
    try:
        read_table(config, check_classes=True)
    except UnusableClassError as e:
        raise pytest.UsageError(str(e)) from None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist's controller hands each worker the producers' table it read, so that no
    worker imports the producers again."""
    table = node.config.stash.get(TABLE, None)
    if table is not None:
        node.workerinput[_TABLE_INPUT] = table.to_json_dict()
    folder = node.config.stash.get(CONVERTED, None)
    if folder is not None:
        node.workerinput[_CONVERTED_INPUT] = str(folder)


def _baseline_builder(project: ParityConfig) -> BaselineBuilder | None:
    """What re-produces the baselines of golden checks (`parity.run._baseline`), from the
    session's settings: off where `--parity-baseline off` (or `baseline = "off"`) says so,
    and where no producers file is configured (nothing could re-produce a group; a usage
    error where `require` asks for the baseline). It builds them without their recording
    (the main job builds baselines for many groups that then pass): a failure against one
    has its base recorded when it is settled."""
    if project.baseline == "require" and project.producers is None:
        raise pytest.UsageError(
            f'--parity-baseline require (or baseline = "require") needs the producers that '
            f"re-produce a golden's baseline, and {project.where} names none; set producers, or "
            "pass --parity-baseline auto"
        )
    if project.baseline == "off" or project.producers is None:
        return None
    from parity.run._baseline import BaselineBuilder

    def progress(line: str) -> None:
        import sys

        print(f"parity: {line}", file=sys.stderr, flush=True)

    return BaselineBuilder(project, progress=progress)


def pytest_deselected(items: Sequence[pytest.Item]) -> None:
    """`-k`, `-m`, `--deselect`, `--lf` narrowed the run: unopened groups are not judged."""
    if items:
        items[0].config.stash[NARROWED] = True
