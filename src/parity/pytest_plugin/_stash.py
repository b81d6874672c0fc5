"""What the plugin's hooks and fixtures keep on the pytest config (`config.stash`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # parity.check loads h5py: imported only when a check runs
    from collections.abc import Mapping
    from pathlib import Path

    from parity._results import CheckResult
    from parity.check import GoldenDir
    from parity.judge._converting import Conversion, ConvertError
    from parity.machinery._config import ParityConfig
    from parity.machinery._producers_table import ProducersTable
    from parity.origin import Localisation, Proof
    from parity.run._baseline import BaselineBuilder

#: The checks recorded in this process (on the xdist controller: every worker's too).
RESULTS: pytest.StashKey[list[CheckResult]] = pytest.StashKey()
#: The golden folder of the session.
GOLDENS: pytest.StashKey[GoldenDir] = pytest.StashKey()
#: Whether the run was narrowed (`-k`, `-m`, `--deselect`, `--lf`, node ids).
NARROWED = pytest.StashKey[bool]()
#: What re-produces the baselines of the session's golden checks, or None where the
#: baseline is off.
BASELINE: pytest.StashKey[BaselineBuilder | None] = pytest.StashKey()
#: The session's settings: `[tool.parity]`, the `PARITY_*` variables, the `--parity-*`
#: options (`configure.session_config`).
CONFIG: pytest.StashKey[ParityConfig] = pytest.StashKey()
#: The `(pattern, class)` rules every check tries first: `--parity-override`, then
#: `--parity-class` as `*=NAME`.
OVERRIDES: pytest.StashKey[tuple[tuple[str, str], ...]] = pytest.StashKey()
#: What settling each failing golden group op by op found: the proofs of its keys of
#: class `op_by_op` and its origin, so that a group is recorded at most once per session
#: (`fixtures._settled`).
ORIGINS: pytest.StashKey[dict[str, tuple[Mapping[str, Proof], Localisation | None]]] = (
    pytest.StashKey()
)
#: The producers' table (`CLASS_MAP`, `STACK`, `RENAME`), read as `parity check` reads it
#: (`parity.run._produced.producers_table`): once per session by the process that starts
#: it, handed to xdist's workers; read on first use where it was not
#: (`fixtures.producers_table`).
TABLE: pytest.StashKey[ProducersTable] = pytest.StashKey()
#: Where the producers' `CONVERT`, probed on the goldens' layout with the table, keeps
#: what it does (`parity.machinery._converters.read_conversions`): the folder the process
#: that read the table made, handed to xdist's workers; and, once read in a process, group
#: -> its `Conversion`, or why its converter cannot be used.
CONVERTED: pytest.StashKey[Path] = pytest.StashKey()
CONVERSIONS: pytest.StashKey[dict[str, Conversion | ConvertError]] = pytest.StashKey()
