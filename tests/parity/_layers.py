"""parity's layers, lowest first: the floors the import test holds each module to
(`test_import_boundaries.py`) and the call-path tool reads (`tools/call_path.py`)."""

from __future__ import annotations

#: parity's layers, lowest first, by folder as a reader sees them: each subpackage of
#: src/parity is one unit, each top-level module one of its own, and a unit sits at one tier.
#: A module may import its own unit and the units of every tier before its own, never a
#: sibling of its tier nor a unit of a later tier; imports inside functions count (they run
#: as soon as the function does), those under `if TYPE_CHECKING:` (which never run) do not.
#: `parity` itself (the package's `__init__`, which imports nothing until a public name is
#: used) sits below every tier. The order is the one the code had when it was written down
#: (issue 23), with the calibrated class in a check and the measuring of the noise in two
#: rooms since (issue 38); each subpackage's docstring says it in prose.
LAYERS: tuple[tuple[str, ...], ...] = (
    # leaves: the XLA flag names; compile statistics (jax only); the root of every error
    ("parity._xla_env", "parity._compile_stats", "parity._errors"),
    ("parity._environment",),  # whether two environments differ, and how: decided once
    ("parity._environment_fingerprint",),  # an environment's name in the baseline cache
    ("parity.judge",),  # numpy only
    # each over the judge (the store: h5py, xla_env too; localise: jax inside functions only)
    ("parity.store", "parity.report", "parity.origin"),
    ("parity._results",),  # the core: what a check hands back (CheckResult, CheckError)
    ("parity.calibrated",),  # the core: the recorded spreads, the calibrated class in a check
    # the core: the check's stages, from its request to its verdict, and its door
    ("parity.check",),
    ("parity.machinery",),  # processes: config, devices, launcher, processes, worker, git
    ("parity.run",),  # the workflows over it: produce, repin, baseline, origins, bisect
    ("parity.calibration",),  # measuring the noise (`parity calibrate`), over parity.run
    ("parity._assertions", "parity.commands", "parity.pytest_plugin"),  # the faces
    ("parity._cli",),  # the one argparse tree over the commands
    ("parity.__main__",),
)


def unit_of(module: str) -> str | None:
    units = [u for tier in LAYERS for u in tier if module == u or module.startswith(u + ".")]
    return max(units, key=len, default=None)


def floor_of(module: str) -> int:
    """The tier of `module`'s unit in `LAYERS` (0 the lowest); -1 for `parity` itself, which
    sits below every tier."""
    unit = unit_of(module)
    return -1 if unit is None else next(i for i, units in enumerate(LAYERS) if unit in units)
