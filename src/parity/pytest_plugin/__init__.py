"""pytest plugin for parity, registered through the `pytest11` entry point.

Options:

Each option is the `parity` command line's flag for the same idea with a `--parity-`
prefix (docs/design.md, "Vocabulary"). Settings are resolved by the command line's one
path, `parity.machinery._config` (`configure.session_config`): `[tool.parity]` in the nearest
`pyproject.toml`, then the environment variables `PARITY_DEVICES`, `PARITY_JAX_CACHE`,
`PARITY_BASELINE_CACHE`, then the options; so in an adopting project
`parity_check(actual, "group")` works with no options. Where that table exists, its `src`
roots go to the front of `sys.path` before conftests and test modules are imported (as
`parity check` runs the producers), so tests import the project's package uninstalled.

- `--parity-goldens DIR`: the golden folder (default `[tool.parity]` goldens, else ini
  `parity_goldens`, else `goldens`; relative to the rootdir).
- `--parity-report DIR`: write the session's comparisons as a text table, JSON and HTML.
- `--parity-override PATTERN=CLASS` (repeatable), `--parity-class NAME`: rules every check
  tries first (the class as `*=NAME`, after the overrides), before a check's own
  `overrides=` and `class_map=`.
- `--parity-drift {warn,relax,strict}`: what environment drift does to bitwise classes
  (see `parity._environment`; default `[tool.parity]` drift, else warn).
- `--parity-baseline {auto,require,off}`: the baseline, the reference off the pin's
  environment.
- `--parity-save-actual DIR`: when a check fails, write what was produced to
  `DIR/<check>.h5` in golden format; the failure message gives the `parity diff` command
  that reproduces its table.
- `--parity-unchecked {ignore,warn,fail}`: list golden keys that no test checked;
  `fail` makes the session fail if there are any. Judged against what was selected: keys
  of every group some check opened, and whole groups no check opened only when the run
  was not narrowed (no `-k`, `-m`, `--deselect`, `--lf`, or node ids).
- `--parity-isa CAP`: the XLA CPU ISA cap set before jax starts (default `[tool.parity]`
  isa, else AVX2; `none`).
- `--parity-devices N` (env `PARITY_DEVICES`): simulated CPU device count, set before jax
  starts (a clear error if it already started with another count); per process with
  `--parity-processes`.
- `--parity-processes N`: run the session as N processes of one JAX distributed run
  (`parity.machinery._processes`): this pytest starts N copies of itself (without xdist), each joins
  the run before jax starts, the tests run SPMD over the global mesh, each check gathers
  its arrays to every process, compares and takes process 0's verdict; process 0's output
  is shown and it alone writes the report. A worker that crashes, is killed or outlives
  `--parity-timeout S` (default 3600) ends the session with exit 2 naming it.
- `--parity-jax-cache DIR` (env `PARITY_JAX_CACHE`, `[tool.parity]` jax_cache): jax's
  persistent compilation cache folder, one per machine (`parity.machinery._jax_cache`): shared by
  the xdist workers, the processes of a distributed session and every process the tests
  start. `none` disables it. Default `~/.cache/parity/jax` (`$XDG_CACHE_HOME/parity/jax`),
  outside the checkout. The terminal summary counts the session's compiles and cache loads.

Fixtures:

- `parity_goldens`: the golden folder (`parity.check.GoldenDir`); files open lazily,
  read-only, once per process (safe under pytest-xdist: every worker opens its own).
- `parity_check`: compare arrays against a golden group or a live reference
  (`parity.check.check_group` / `check_live`), record the result for the session report,
  fail with the table.

The hooks stay thin: class resolution, the drift policy and comparison live in
`parity.check`; the report in `parity.report`. Results cross from xdist workers to the
controller as `parity._results.CheckResult` dicts. A face: the plugin may import every layer
below it (`parity.judge`, `parity.store`, `parity.report`, the core, `parity.run`), never
a sibling face (`parity.commands`, `parity._assertions`) nor `parity._cli`
(`tests/parity/test_import_boundaries.py` holds it to that).

The plugin is a folder: `options` (the options above), `configure` (the session set up
before jax starts), `fixtures`, `summary` (the session's end and its report) and `stash`
(what they keep on the pytest config); this module gathers their hooks and fixtures for
pytest.
"""

from parity.pytest_plugin._configure import (
    pytest_cmdline_main,
    pytest_configure,
    pytest_configure_node,
    pytest_deselected,
    pytest_load_initial_conftests,
    pytest_unconfigure,
)
from parity.pytest_plugin._fixtures import parity_check, parity_goldens
from parity.pytest_plugin._options import SESSION_TIMEOUT_S, pytest_addoption
from parity.pytest_plugin._summary import (
    pytest_sessionfinish,
    pytest_terminal_summary,
    pytest_testnodedown,
)

__all__ = [
    "SESSION_TIMEOUT_S",
    "parity_check",
    "parity_goldens",
    "pytest_addoption",
    "pytest_cmdline_main",
    "pytest_configure",
    "pytest_configure_node",
    "pytest_deselected",
    "pytest_load_initial_conftests",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
    "pytest_testnodedown",
    "pytest_unconfigure",
]
