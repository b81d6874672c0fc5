"""`[tool.parity]` in the adopting project's `pyproject.toml`.

The table is found by walking up from a folder (the working directory by default) to the
first `pyproject.toml`, as pytest finds its rootdir; a `pyproject.toml` without the table
still marks the project root, and every key takes its default. Keys:

- `goldens`: the golden folder (default `goldens`);
- `producers`: a Python file defining `GROUPS` and optionally `CLASS_MAP` (no default);
- `src`: import root(s) of the code under test, a string or a list (default `src` if it
  exists, else the project root);
- `isa`: the XLA CPU ISA cap set before jax starts, `"none"` leaves it alone (default
  `AVX2`);
- `devices`: simulated CPU devices, per process (default 1);
- `processes`: processes of one JAX distributed run (default 1; see `parity.machinery._processes`);
- `baseline`: the baseline, the reference off the pin's environment, `"auto"` (default:
  where the environment differs from the pin's and a key fails its pinned class, the tree
  is compared with the golden group re-produced at its base commit here:
  `parity.check._against_baseline`), `"require"` (as auto, and where the baseline cannot
  be re-produced, an input error instead of a pass by calibration alone) or `"off"` (the
  goldens are the reference, by calibration);
- `baseline_cache`: the folder of the baselines (default the user's cache folder:
  `parity.run._baseline`);
- `drift`: the drift policy, what a difference that can change bits between the goldens'
  environment and this one does to bitwise classes: `"warn"` (default), `"relax"` or
  `"strict"` (`parity._environment`);
- `jax_cache`: the machine's jax compilation cache folder, shared by the pytest plugin and
  every process the commands start, `"none"` turns it off (default `~/.cache/parity/jax`:
  `parity.machinery._jax_cache`).

Relative paths resolve against the folder holding the `pyproject.toml`. Three environment
variables stand for keys, for the command line and the pytest plugin alike (`ENV`):
`PARITY_DEVICES` (devices), `PARITY_JAX_CACHE` (jax_cache) and `PARITY_BASELINE_CACHE`
(baseline_cache); each overrides the table. A flag overrides both: `parity check --devices
N`, `pytest --parity-devices N` (`with_overrides`). An unknown key or a value of the wrong
type is a `ConfigError` naming the file (or the variable) and the key.

This module never imports jax.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from parity._environment import DRIFT_MODES
from parity._errors import ParityError
from parity._xla_env import DEFAULT_ISA_CAP

__all__ = [
    "DRIFT_MODES",
    "ENV",
    "KEYS",
    "ConfigError",
    "ParityConfig",
    "find_pyproject",
    "load_config",
]

#: The keys `[tool.parity]` accepts.
KEYS = (
    "goldens",
    "producers",
    "src",
    "isa",
    "devices",
    "processes",
    "baseline",
    "baseline_cache",
    "drift",
    "jax_cache",
)
#: The environment variables that stand for keys, over the table, under a flag.
ENV = {
    "PARITY_DEVICES": "devices",
    "PARITY_JAX_CACHE": "jax_cache",
    "PARITY_BASELINE_CACHE": "baseline_cache",
}
#: The values of `baseline`.
BASELINE_MODES = ("auto", "require", "off")
#: The values of `drift` (`parity._environment.PolicyMode`, offered as `DRIFT_MODES` lists them).
DriftMode = Literal["warn", "relax", "strict"]


class ConfigError(ParityError):
    """`[tool.parity]` (or a flag overriding it) cannot be used; the message is one line
    naming the file and the key."""


@dataclass(frozen=True)
class ParityConfig:
    """The settings of `[tool.parity]`, paths resolved.

    **Fields:**

    - `root`: the project root (the folder of `pyproject`, or the start folder if none).
    - `pyproject`: the `pyproject.toml` read, or None.
    - `goldens`: the golden folder.
    - `producers`: the producers file, or None if not configured.
    - `src`: the import roots of the code under test (absolute).
    - `isa`: the ISA cap (`--xla_cpu_max_isa`), or None to leave it alone.
    - `devices`: simulated CPU devices, per process.
    - `processes`: processes of one distributed run.
    - `baseline`: the baseline, `"auto"`, `"require"` or `"off"`.
    - `baseline_cache`: the folder of the baselines, or None for the default.
    - `drift`: the drift policy, `"warn"`, `"relax"` or `"strict"`.
    - `jax_cache`: the compilation cache folder; None for the default
      (`parity.machinery._jax_cache.default_folder`), or, where `jax_cache` is in `explicit`
      (`"none"`), off.
    - `explicit`: the keys the table (or a flag) set, as opposed to defaults.
    - `table`: whether `pyproject` has a `[tool.parity]` table (empty or not): the project
      adopted parity, as opposed to a folder that merely has a `pyproject.toml`.
    """

    root: Path
    pyproject: Path | None = None
    goldens: Path = Path("goldens")
    producers: Path | None = None
    src: tuple[Path, ...] = ()
    isa: str | None = DEFAULT_ISA_CAP
    devices: int = 1
    processes: int = 1
    baseline: str = "auto"
    baseline_cache: Path | None = None
    drift: DriftMode = "warn"
    jax_cache: Path | None = None
    explicit: frozenset[str] = frozenset()
    table: bool = False

    @property
    def where(self) -> str:
        """What to name in messages: the file's `[tool.parity]`, or the root."""
        return (
            f"{self.pyproject} [tool.parity]"
            if self.pyproject
            else f"{self.root} (no pyproject.toml)"
        )

    def src_relative(self) -> tuple[str, ...]:
        """`src` relative to `root` (`"."` for the root itself), for finding the same
        roots inside a worktree of another commit. Raises `ConfigError` for a root outside
        the project."""
        out = []
        for p in self.src:
            try:
                out.append(p.relative_to(self.root).as_posix() or ".")
            except ValueError:
                raise ConfigError(
                    f"{self.where}: src {str(p)!r} lies outside the project root {self.root}; "
                    "a commit's worktree cannot provide it"
                ) from None
        return tuple(out)

    def need_producers(self) -> Path:
        """The producers file; `ConfigError` saying how to configure it if unset or missing."""
        if self.producers is None:
            raise ConfigError(
                f"{self.where}: no producers file configured; set producers = "
                '"path/to/producers.py" in [tool.parity], or pass --producers FILE'
            )
        if not self.producers.is_file():
            raise ConfigError(f"{self.where}: producers file {self.producers} does not exist")
        return self.producers

    def need_table(self, start: str | os.PathLike[str] | None = None) -> None:
        """A `ConfigError` unless this is an adopting project: a `[tool.parity]` table was
        found, or a `--producers` flag stands in for it. The message names the folders
        walked from `start` (default the working directory, where `load_config` began)
        and what to add.
        """
        if self.table or "producers" in self.explicit:
            return
        here = Path(start if start is not None else Path.cwd()).resolve()
        top = self.pyproject.parent if self.pyproject is not None else None
        walked = [here]
        while walked[-1] != top and walked[-1].parent != walked[-1]:
            walked.append(walked[-1].parent)
        found = (
            f"the first pyproject.toml there, {self.pyproject}, has none"
            if self.pyproject is not None
            else "none of them has a pyproject.toml"
        )
        raise ConfigError(
            f"no [tool.parity] table found: looked for one in {', '.join(map(str, walked))} "
            f"({found}); run from inside your project, or add to its pyproject.toml "
            '[tool.parity] with producers = "tests/producers.py" (the file defining GROUPS; '
            "docs/adopting.md, section 1), or pass --producers FILE"
        )

    def with_overrides(self, **flags: Any) -> ParityConfig:
        """This config with the flags that are not None applied (same names as the keys;
        relative paths resolve against the working directory, as a shell user expects).

        **Returns:** a new `ParityConfig`. Raises `ConfigError` for a value of the wrong type.
        """
        given = {k: v for k, v in flags.items() if v is not None}
        unknown = sorted(set(given) - set(KEYS))
        if unknown:
            raise ConfigError(f"unknown setting(s) {unknown}; known: {', '.join(KEYS)}")
        if not given:
            return self
        values = _parse(given, base=Path.cwd(), where="command line")
        return dataclasses.replace(self, **values, explicit=self.explicit | set(values))


def user_cache_folder(name: str) -> Path:
    """`name` under parity's folder in the user's cache folder: `$XDG_CACHE_HOME/parity/NAME`,
    else `~/.cache/parity/NAME` (the baselines, the compilation cache)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "parity" / name


def find_pyproject(start: str | os.PathLike[str] | None = None) -> Path | None:
    """The first `pyproject.toml` in `start` (default the working directory) or above it."""
    here = Path(start if start is not None else Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def _error(where: str, key: str, expected: str, value: Any) -> ConfigError:
    return ConfigError(f"{where}: {key} must be {expected}, got {value!r}")


def _parse(
    table: Mapping[str, Any], *, base: Path, where: str, toml: bool = False
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key == "goldens":
            if not isinstance(value, str | os.PathLike) or not str(value):
                raise _error(where, key, "a folder path (a string)", value)
            out[key] = (base / value).resolve()
        elif key == "producers":
            if not isinstance(value, str | os.PathLike) or not str(value):
                raise _error(where, key, "a Python file path (a string)", value)
            out[key] = (base / value).resolve()
        elif key == "src":
            items = value.split(",") if isinstance(value, str) else value
            if (
                not isinstance(items, list | tuple)
                or not items
                or not all(isinstance(v, str | os.PathLike) and str(v) for v in items)
            ):
                raise _error(where, key, "a folder or a list of folders", value)
            out[key] = tuple((base / v).resolve() for v in items)
        elif key == "isa":
            if not isinstance(value, str) or not value:
                raise _error(where, key, 'an ISA name such as "AVX2", or "none"', value)
            out[key] = None if value.lower() == "none" else value
        elif key == "baseline":
            if value not in BASELINE_MODES:
                raise _error(where, key, '"auto" or "off"', value)
            out[key] = value
        elif key == "drift":
            if value not in DRIFT_MODES:
                raise _error(where, key, '"warn", "relax" or "strict"', value)
            out[key] = value
        elif key == "jax_cache":
            if not isinstance(value, str | os.PathLike) or not str(value):
                raise _error(where, key, 'a folder path (a string), or "none"', value)
            off = isinstance(value, str) and value.lower() == "none"
            out[key] = None if off else (base / Path(value).expanduser()).resolve()
        elif key == "baseline_cache":
            if not isinstance(value, str | os.PathLike) or not str(value):
                raise _error(where, key, "a folder path (a string)", value)
            out[key] = (base / Path(value).expanduser()).resolve()
        elif key in ("devices", "processes"):
            # A string is a number only from Python callers of `with_overrides`; in TOML
            # `devices = "2"` is a string the user did not mean, so it is an error.
            if not toml and isinstance(value, str) and value.strip().isdigit():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                expected = f"a whole number of {key}, at least 1"
                if toml:
                    expected += f" (a TOML integer, without quotes: {key} = 2)"
                raise _error(where, key, expected, value)
            out[key] = value
        else:
            raise ConfigError(
                f"{where}: unknown key {key!r} in [tool.parity]; known keys: {', '.join(KEYS)}"
            )
    return out


def load_config(
    start: str | os.PathLike[str] | None = None, *, pyproject: str | os.PathLike[str] | None = None
) -> ParityConfig:
    """Read `[tool.parity]` from the first `pyproject.toml` at or above `start`.

    **Arguments:**

    - `start`: the folder to walk up from (default the working directory).
    - `pyproject`: read this file instead of searching.

    **Returns:** a `ParityConfig` (defaults where the table, or the file, is absent).
    Raises `ConfigError` for an unreadable file, an unknown key or a wrong type.
    """
    import tomllib  # here: 30 ms that `parity diff` and `show` never need

    path = Path(pyproject).resolve() if pyproject is not None else find_pyproject(start)
    root = path.parent if path is not None else Path(start or Path.cwd()).resolve()
    table: dict[str, Any] = {}
    found = False
    if path is not None:
        try:
            doc = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(
                f"{path}: cannot be read as TOML: {' '.join(str(e).split())}"
            ) from None
        tool = doc.get("tool", {})
        found = isinstance(tool, dict) and "parity" in tool
        raw = tool.get("parity", {}) if isinstance(tool, dict) else {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: [tool.parity] must be a table, got {raw!r}")
        table = raw
    where = f"{path} [tool.parity]" if path is not None else str(root)
    values = _parse(table, base=root, where=where, toml=True)
    explicit = set(table)
    for var, key in ENV.items():
        raw = os.environ.get(var)
        if raw:  # set and not empty; relative paths against the working directory
            values |= _parse({key: raw}, base=Path.cwd(), where=f"environment {var}")
            explicit.add(key)
    if "src" not in values:
        values["src"] = ((root / "src") if (root / "src").is_dir() else root,)
    values.setdefault("goldens", root / "goldens")
    return ParityConfig(
        root=root, pyproject=path, explicit=frozenset(explicit), table=found, **values
    )
