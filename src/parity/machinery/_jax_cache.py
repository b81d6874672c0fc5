"""One jax compilation cache per machine, shared by every process parity starts.

jax's persistent compilation cache turns a second compile of the same program into a file
read. parity shares one folder between the pytest plugin's xdist workers, the processes of
a distributed session, every producer process the CLI starts (check, repin, bisect,
calibrate, baseline) and the tests' own subprocesses, so a program is compiled once per
machine rather than once per process.

Two facts of jax 0.10's cache decide how (read in `jax/_src/cache_key.py` and
`jax/_src/lru_cache.py`):

- **The folder is part of the key.** With jax's default
  `jax_persistent_cache_enable_xla_caches`, the compile options carry
  `xla_gpu_per_fusion_autotune_cache_dir = <folder>/...`, and the serialized compile
  options are hashed into the key: two folders never share an entry, whatever they hold.
  That is why the old per-worker folders shared nothing. parity turns those XLA-side caches
  off (`"none"`, they serve GPU autotuning only), so a key no longer depends on where the
  folder is.
- **Writes are not atomic.** Without a size limit the cache writes an entry with
  `Path.write_bytes` (open, truncate, write) and reads it with no lock, so a reader in
  another process can see a half-written entry. With a size limit the cache takes a
  `filelock` lock around every read and write (and evicts the least recently used entries
  beyond the limit): one writer at a time and no torn read. parity always sets a limit.

- **Only process 0 of a distributed run writes, and the others' keys differ from its.**
  jax hashes the CPU topology's fingerprint into every key, and on CPU that fingerprint
  differs per process (process 1's never equals process 0's), while jax's `_cache_write`
  skips every process but 0 (to spare shared filesystems concurrent writers). So process
  1 of a 2-process session found nothing and compiled everything on every run.
  `write_from_every_process` lets each process write its own entries (under its own key:
  no two processes write one file, and the lock serialises the folder).
- **Every write reads the whole folder.** Before each write, under the folder's lock, the
  size-limited cache lists every entry, stats it and reads its access-time file, to learn
  whether the folder is over its limit (`LRUCache._evict_if_needed`): a write into a
  folder of n entries costs n file reads, while every other process waits on the lock (28
  ms at 1,900 entries here, the size of one cold test suite; a machine's folder grows to
  its 8 GiB limit, hundreds of thousands of entries). `keep_a_size_tally` keeps the
  folder's byte count in a file beside the entries (`SIZE_TALLY`), updated under the same
  lock: a write reads one small file, and the folder is listed only where the tally says
  the limit would be passed (then jax evicts as it would, least recently used first, and
  the tally is counted again) or where there is no tally yet.

The folder holds a subfolder per processor (`parity.store._provenance.cpu_signature`):
XLA's CPU code is built for the host, so a home folder shared by machines of different
processors never hands one machine another's kernels.

Where: `[tool.parity] jax_cache`, `PARITY_JAX_CACHE` or the plugin's `--parity-jax-cache`
(`"none"` turns it off), else `$XDG_CACHE_HOME/parity/jax` (`~/.cache/parity/jax`).
`parity._compile_stats` still compiles with the cache off, as a compile-time measurement
must.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.store._provenance import cpu_signature

if TYPE_CHECKING:
    from parity.machinery._config import ParityConfig

__all__ = [
    "MAX_BYTES",
    "RESOLVED_VAR",
    "SIZE_TALLY",
    "child_env",
    "default_folder",
    "enable",
    "export",
    "folder_for",
    "for_children",
    "keep_a_size_tally",
    "resolve",
    "write_from_every_process",
]

#: Where the plugin (or a command) records the cache root it resolved, for the processes
#: it starts; internal, beside the user's `PARITY_JAX_CACHE`, which keeps its own meaning
#: in the settings' precedence.
RESOLVED_VAR = "PARITY_RESOLVED_JAX_CACHE"
#: The size limit: past it the least recently used entries go. A limit is also what makes
#: jax lock the folder around every read and write (module docstring).
MAX_BYTES = 8 * 1024**3
#: The file, in the cache folder, holding the bytes its entries take (`keep_a_size_tally`).
SIZE_TALLY = ".parity-size-tally"


def default_folder() -> Path:
    """`$XDG_CACHE_HOME/parity/jax`, else `~/.cache/parity/jax`: beside the baselines."""
    from parity.machinery._config import user_cache_folder

    return user_cache_folder("jax")


def folder_for(root: Path) -> Path:
    """The subfolder of `root` for this machine's processor (and architecture)."""
    import platform

    tag = f"{platform.machine()}|{cpu_signature() or platform.processor()}"
    return root / hashlib.sha256(tag.encode()).hexdigest()[:12]


#: Settings a jax of the declared range may lack (jax 0.4.35 has no XLA-side caches, so no
#: switch for them): skipped there. Every other setting is in every release from 0.4.35 on.
_SINCE = frozenset({"jax_persistent_cache_enable_xla_caches"})


def _settings(folder: Path) -> dict[str, str | int | float]:
    return {
        "jax_compilation_cache_dir": str(folder),
        # Test and producer programs compile in well under a second each: cache them all.
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
        "jax_compilation_cache_max_size": MAX_BYTES,
        "jax_persistent_cache_enable_xla_caches": "none",
    }


def enable(root: Path) -> Path:
    """Point this process's jax at the shared cache under `root` (before or after jax
    started: these settings are read at each compile). **Returns:** the folder used."""
    import jax

    folder = folder_for(root)
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in _settings(folder).items():
        if name in _SINCE and name not in jax.config.values:
            continue  # an older jax, without the XLA-side caches it turns off
        jax.config.update(name, value)
    write_from_every_process()
    keep_a_size_tally()
    return folder


def write_from_every_process() -> bool:
    """Let every process of a distributed run write its own compiled programs to the cache,
    not only process 0 (module docstring). This wraps a private function of jax
    (`jax._src.compiler._cache_write`, jax 0.10); where jax has none of that shape, it
    changes nothing and returns False, and the other processes compile as jax made them.
    Idempotent."""
    import inspect

    from jax._src import compilation_cache, compiler, distributed

    original = getattr(compiler, "_cache_write", None)
    if original is None or getattr(original, "_parity_every_process", False):
        return original is not None
    expected = [
        "cache_key",
        "compile_time_secs",
        "module_name",
        "backend",
        "executable",
        "host_callbacks",
    ]
    if list(inspect.signature(original).parameters) != expected:
        return False

    def _cache_write(
        cache_key: str,
        compile_time_secs: float,
        module_name: str,
        backend: Any,
        executable: Any,
        host_callbacks: Any,
    ) -> None:
        if distributed.global_state.process_id in (None, 0) or host_callbacks:
            return original(
                cache_key, compile_time_secs, module_name, backend, executable, host_callbacks
            )
        import jax

        if compile_time_secs < jax.config.jax_persistent_cache_min_compile_time_secs:  # pyright: ignore[reportAttributeAccessIssue]
            return None
        try:
            compilation_cache.put_executable_and_time(
                cache_key, module_name, executable, backend, int(compile_time_secs)
            )
        except Exception as e:  # as jax's own writer: a failed write is a warning
            import warnings

            warnings.warn(
                f"parity: cannot write compilation cache entry {module_name!r}: {e}",
                stacklevel=2,
            )
        return None

    _cache_write._parity_every_process = True  # pyright: ignore[reportFunctionMemberAccess]
    compiler._cache_write = _cache_write
    return True


def _stored_bytes(folder: Path, suffix: str) -> int:
    """The bytes the entries (`*<suffix>`) of `folder` take."""
    total = 0
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.endswith(suffix):
                with contextlib.suppress(FileNotFoundError):  # removed since the listing
                    total += entry.stat().st_size
    return total


def _read_tally(path: Path) -> int | None:
    try:
        return int(path.read_bytes())
    except (OSError, ValueError):  # none yet, or unreadable: the folder is counted again
        return None


def _write_tally(path: Path, size: int) -> None:
    """Write the tally whole (a temporary file renamed over it): a reader never sees part
    of a number, which could read as a smaller one."""
    part = path.with_name(f"{path.name}.{os.getpid()}")
    part.write_bytes(str(size).encode())
    os.replace(part, path)


def keep_a_size_tally() -> bool:
    """Let a write into the size-limited cache read one tally file instead of every entry
    (module docstring). This wraps a private method of jax
    (`jax._src.lru_cache.LRUCache._evict_if_needed`, jax 0.10), which jax calls under the
    folder's lock before each write; where jax has none of that shape, it changes nothing
    and returns False. Idempotent.

    The tally counts what this code wrote: a write whose file then fails, or an entry
    removed by hand, leaves it above the truth, so the folder is listed sooner than it had
    to be; entries written by a jax without this wrapper (a process parity did not set up)
    are not counted until the next listing, which writes the true figure again."""
    import inspect

    from jax._src import lru_cache

    cache = getattr(lru_cache, "LRUCache", None)
    original = getattr(cache, "_evict_if_needed", None)
    suffix = getattr(lru_cache, "_CACHE_SUFFIX", None)
    if original is None or not isinstance(suffix, str):
        return False
    if getattr(original, "_parity_tally", False):
        return True
    if list(inspect.signature(original).parameters) != ["self", "additional_size"]:
        return False

    def _evict_if_needed(self: Any, *, additional_size: int = 0) -> None:
        if not self.eviction_enabled:
            return
        folder = Path(self.path)
        tally = folder / SIZE_TALLY
        known = _read_tally(tally)
        if known is not None and known + additional_size <= self.max_size:
            _write_tally(tally, known + additional_size)
            return
        original(self, additional_size=additional_size)
        _write_tally(tally, _stored_bytes(folder, suffix) + additional_size)

    _evict_if_needed._parity_tally = True  # pyright: ignore[reportFunctionMemberAccess]
    cache._evict_if_needed = _evict_if_needed  # pyright: ignore[reportOptionalMemberAccess]
    return True


def child_env(root: Path | None) -> dict[str, str]:
    """The `JAX_*` variables that give a child process the shared cache under `root`, or
    turn the cache off where `root` is None."""
    if root is None:
        return {"JAX_ENABLE_COMPILATION_CACHE": "false"}
    folder = folder_for(root)
    folder.mkdir(parents=True, exist_ok=True)
    return {name.upper(): str(value) for name, value in _settings(folder).items()}


def resolve(config: ParityConfig) -> Path | None:
    """The cache root a project's settings choose: None where `jax_cache = "none"` (or
    `PARITY_JAX_CACHE=none`, or the plugin's `--parity-jax-cache none`) turned it off."""
    if "jax_cache" in config.explicit and config.jax_cache is None:
        return None
    return config.jax_cache if config.jax_cache is not None else default_folder()


def export(root: Path | None) -> None:
    """Record the resolved cache root in this process's environment (`RESOLVED_VAR`), so
    that every process it starts, and theirs, inherits the one choice."""
    os.environ[RESOLVED_VAR] = "none" if root is None else str(root)


def for_children(env: Mapping[str, str] | None = None) -> Path | None:
    """The cache root for a process this one starts: the one exported here or by a parent
    (`export`), else the one the project's settings around the working folder choose."""
    raw = (os.environ if env is None else env).get(RESOLVED_VAR)
    if raw:
        return None if raw == "none" else Path(raw)
    from parity.machinery._config import ConfigError, load_config

    try:
        return resolve(load_config())
    except ConfigError:  # reported by whatever reads the settings for real
        return default_folder()
