"""Golden groups re-produced at their base commit in this environment, cached: the
baselines, the reference of a check run off the pin's environment where a key fails its
pinned class (`parity.check._against_baseline`; docs/design.md, "Two references").

`BaselineBuilder.reproduce(group, pinned, current)` returns the group as the producers make
it at the golden's base commit in the environment `current` describes (processor, ISA cap,
processes x devices, jax, XLA flags): a temporary worktree at the commit, the producers of
the current tree run against its code in a fresh process (or processes) with that layout
and ISA cap, exactly as `parity repin` runs them, the user's checkout and goldens
untouched. The result is kept in a cache folder, one golden-format file per

    <cache>/<base sha>/<environment fingerprint>-<producers digest>/<group>.h5

(`parity._environment_fingerprint.environment_fingerprint`, `digest_sources` of the producers
file), written atomically with a sha256 per array like a golden, so only the first check
on a machine pays for it. A lock file per entry serialises builders (pytest-xdist workers,
the processes of a multi-process run, several checks at once): the second finds the first
one's file.

The cache folder is, first found: `PARITY_BASELINE_CACHE`, `[tool.parity] baseline_cache`,
`$XDG_CACHE_HOME/parity/baselines`, `~/.cache/parity/baselines`. `parity baseline
build/list/clear` manages it. Beside an entry, where a failing check asked for its origin
(`parity.run._origins`), `<group>.origin.npz` holds the programs the group ran at the base
commit, recorded op by op in the same run that made its arrays (`prepare(..., record=True)`),
or `<group>.origin.json` says why they could not be recorded.

Nothing here imports jax.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity._environment import (
    backend_of,
    describe_backend,
    environment_difference,
    layout_of,
)
from parity._environment_fingerprint import environment_fingerprint
from parity._results import BaselineUnavailable
from parity._xla_env import ISA_CAPS
from parity.check import Baseline
from parity.judge._floats import count
from parity.machinery._config import ParityConfig, user_cache_folder
from parity.machinery._launcher import (
    ProducerRun,
    ProducerRunError,
    run_producers,
)
from parity.machinery._runner_output import load_runner_output
from parity.machinery._worktree import GitError, git, repo_root, resolve_sha, temporary_worktree
from parity.run._goldens import write_run
from parity.run._recordings import ARRAYS, Record, keep_recording, recorded
from parity.store import GoldenStoreError, Provenance, open_goldens
from parity.store._provenance import digest_sources
from parity.store._staging import owned_tempdir

__all__ = [
    "ENV_VAR",
    "BaselineBuilder",
    "BaselineCache",
    "CachedBaseline",
    "base_commit",
    "cache_dir",
]

#: The environment variable that moves the cache folder.
ENV_VAR = "PARITY_BASELINE_CACHE"
#: The prefix of a build's temporary folders.
BUILD_PREFIX = "parity-baseline-"


def cache_dir(config: ParityConfig | None = None) -> Path:
    """The cache folder: `PARITY_BASELINE_CACHE`, else `[tool.parity] baseline_cache`,
    else the user's cache folder (`$XDG_CACHE_HOME` or `~/.cache`) + `parity/baselines`."""
    raw = os.environ.get(ENV_VAR)
    if raw:
        return Path(raw).expanduser().resolve()
    if config is not None and config.baseline_cache is not None:
        return config.baseline_cache
    return user_cache_folder("baselines")


@dataclass(frozen=True)
class CachedBaseline:
    """One cached baseline: a group at a base commit in one environment.

    **Fields:** `path`, `group`, `sha` (the base commit), `fingerprint` (of the
    environment), `digest` (of the producers, 12 hex), `layout` (`processes x devices`),
    `isa` (the ISA cap; `-` off a CPU), `cpu` (the processor, or off a CPU the backend in
    words) and `bytes` (the file's size).
    """

    path: Path
    group: str
    sha: str
    fingerprint: str
    digest: str
    layout: str
    isa: str
    cpu: str
    bytes: int

    def line(self) -> str:
        """One line for `parity baseline list`."""
        return (
            f"{self.group:<22} base {self.sha[:12]}  layout {self.layout:<5} isa {self.isa:<8} "
            f"{self.bytes / 1e6:6.2f} MB  env {self.fingerprint}  {self.cpu}"
        )


def _listing_order(e: CachedBaseline) -> tuple[Any, ...]:
    widths = [cap for cap, _ in ISA_CAPS]
    width = widths.index(e.isa) if e.isa in widths else -1
    return (e.sha, e.group, e.layout, -width, e.isa, e.cpu, str(e.path))


class BaselineCache:
    """The cache folder (see the module docstring).

    **Arguments:**

    - `folder`: where the entries live (created on first write).
    """

    def __init__(self, folder: Path | str):
        self.folder = Path(folder)

    def path_for(self, sha: str, fingerprint: str, digest: str, group: str) -> Path:
        """Where the entry of `group` at `sha` in the environment `fingerprint` for the
        producers `digest` lives."""
        return self.folder / sha / f"{fingerprint}-{digest[:12]}" / f"{group}.h5"

    @staticmethod
    def usable(path: Path, *, record: Record = False) -> bool:
        """Whether `path` holds a readable golden-format file (a damaged one is rebuilt),
        and with `record`, its recording (or why it has none: `recorded`) beside it."""
        if not path.is_file() or (record and recorded(path, arrays=record == ARRAYS) is None):
            return False
        try:
            with open_goldens(path):
                return True
        except GoldenStoreError:
            return False

    @contextlib.contextmanager
    def locked(self, paths: Sequence[Path]) -> Iterator[None]:
        """Hold the lock of every entry in `paths` (taken in sorted order, so two builders
        never wait on each other); blocks while another builder holds one. On the way out,
        whatever happened, an entry that holds no file leaves nothing behind: its lock file
        and the folders it made empty go (a build that did not happen is not cached)."""
        fresh = not self.folder.exists()
        try:
            with contextlib.ExitStack() as stack:
                for path in sorted(set(paths)):
                    path.parent.mkdir(parents=True, exist_ok=True)
                    lock = stack.enter_context(open(path.with_suffix(".lock"), "a+"))
                    fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                yield
                stack.callback(self._discard_unbuilt, paths, fresh)
        except BaseException:
            self._discard_unbuilt(paths, fresh)
            raise

    def _discard_unbuilt(self, paths: Sequence[Path], fresh: bool) -> None:
        """Remove the lock of each entry of `paths` without a file, then the folders left
        empty up to the cache folder (that too if this call made it)."""
        for path in sorted(set(paths)):
            if path.is_file():
                continue
            with contextlib.suppress(OSError):
                path.with_suffix(".lock").unlink(missing_ok=True)
            for folder in (path.parent, path.parent.parent, *([self.folder] if fresh else [])):
                with contextlib.suppress(OSError):  # not empty: another entry lives there
                    folder.rmdir()

    def entries(self) -> list[CachedBaseline]:
        """Every cached group, in an order that does not depend on the host: by base commit,
        group, layout, ISA cap (the widest first), processor, then file."""
        out: list[CachedBaseline] = []
        for path in sorted(self.folder.glob("*/*/*.h5")):
            fingerprint, _, digest = path.parent.name.partition("-")
            try:
                with open_goldens(path) as gf:
                    prov = gf.provenance
            except GoldenStoreError:
                continue
            processes, devices = layout_of(prov)
            on_cpu = backend_of(prov) == "cpu"  # an accelerator reads no ISA cap
            out.append(
                CachedBaseline(
                    path,
                    path.stem,
                    path.parent.parent.name,
                    fingerprint,
                    digest,
                    f"{processes}x{devices}",
                    str(prov.isa_cap) if on_cpu else "-",
                    (prov.cpu or prov.processor or "?").split(";")[0]
                    if on_cpu
                    else describe_backend(prov),
                    path.stat().st_size,
                )
            )
        return sorted(out, key=_listing_order)

    def clear(self, *, sha: str | None = None) -> int:
        """Remove every entry (or those of the base commits starting with `sha`).

        **Returns:** how many files were removed.
        """
        if not self.folder.is_dir():
            return 0
        removed = 0
        for commit in sorted(self.folder.iterdir()):
            if not commit.is_dir() or (sha is not None and not commit.name.startswith(sha)):
                continue
            with self.locked(list(commit.glob("*/*.h5"))):
                removed += len(list(commit.glob("*/*.h5")))
                shutil.rmtree(commit)
        return removed


class BaselineBuilder:
    """Re-produces golden groups at their base commit here, through the cache: the
    `parity.check._request.BaselineSource` of `parity check`, `parity bisect` and the pytest
    plugin.

    **Arguments:**

    - `config`: the project's `[tool.parity]` (producers, src roots; the layout and ISA
      cap of a build come from the check's environment, or from here for `build`).
    - `cache`: the cache (default `cache_dir(config)`).
    - `progress`: receives one line per step (to stderr in the CLI).
    - `timeout`: seconds one build may take (default: as `parity check`).
    - `record`: each entry it builds also has its programs recorded op by op in the same
      run (`prepare`'s default): a failure against it then records nothing at the base;
      `ARRAYS`: with every value's numbers (what a shadow replay runs on).
    """

    def __init__(
        self,
        config: ParityConfig,
        *,
        cache: BaselineCache | None = None,
        progress: Callable[[str], None] = lambda _: None,
        timeout: float | None = None,
        record: Record = False,
    ):
        self.config = config
        self.cache = cache or BaselineCache(cache_dir(config))
        self.progress = progress
        self.timeout = timeout
        self.record: Record = record
        self._failed: dict[tuple[str, str], BaselineUnavailable] = {}
        self._built: dict[Path, Baseline] = {}  # what this builder built, with its cost

    def _digest(self) -> str:
        return digest_sources([self.config.need_producers()])

    def has_entry(
        self, group: str, pinned: Provenance, current: Provenance, *, record: Record
    ) -> bool:
        """Whether `prepare` of `(group, pinned, current)` would find the entry in the cache
        (with its recording, with `record`) and build nothing."""
        sha = pinned.base_sha or ""
        if not sha:
            return False
        path = self.cache.path_for(sha, environment_fingerprint(current), self._digest(), group)
        return self.cache.usable(path, record=record)

    def reproduce(self, group: str, pinned: Provenance, current: Provenance) -> Baseline:
        """The group re-produced at `pinned.base_sha` in the environment `current`
        describes, from the cache or built now; `BaselineUnavailable` where it cannot be."""
        got = self.prepare([(group, pinned, current)])[group]
        if isinstance(got, BaselineUnavailable):
            raise got
        return got

    def prepare(
        self,
        wanted: Sequence[tuple[str, Provenance, Provenance]],
        *,
        record: Record | None = None,
    ) -> dict[str, Baseline | BaselineUnavailable]:
        """`reproduce` for several groups at once: the missing ones of each base commit
        and environment are built in one producer run.

        **Arguments:**

        - `wanted`: `(group, pinned provenance, current provenance)` triples.
        - `record`: the groups' programs recorded op by op too (`recorded`): an entry
          without its recording is built again. Default: a cached entry serves as it is,
          one built now is recorded where the builder's `record` says.

        **Returns:** group -> its baseline, or the `BaselineUnavailable` saying why it
        cannot be re-produced (every group tried).
        """
        # An entry made without its recording (`parity baseline build`) serves unless asked.
        need, make = record or False, self.record if record is None else record
        out: dict[str, Baseline] = {}
        batches: dict[tuple[str, str], list[str]] = {}
        envs: dict[tuple[str, str], Provenance] = {}
        errors: dict[str, BaselineUnavailable] = {}
        digest = self._digest()
        for group, pinned, current in wanted:
            sha = pinned.base_sha or ""
            if not sha:
                errors[group] = BaselineUnavailable(
                    "the golden records no base commit",
                    "repin it with `parity repin --base <SHA>`, which records one",
                )
                continue
            fp = environment_fingerprint(current)
            path = self.cache.path_for(sha, fp, digest, group)
            if self.cache.usable(path, record=need):
                out[group] = self._built.get(path) or Baseline(path, sha, cached=True)
                continue
            batches.setdefault((sha, fp), []).append(group)
            envs[(sha, fp)] = current
        for (sha, fp), groups in batches.items():
            known = self._failed.get((sha, fp))
            if known is not None:
                errors |= dict.fromkeys(groups, known)
                continue
            paths = [self.cache.path_for(sha, fp, digest, g) for g in groups]
            failed: BaselineUnavailable | None = None
            with self.cache.locked(paths):
                todo = [
                    g
                    for g, p in zip(groups, paths, strict=True)
                    if not self.cache.usable(p, record=need)
                ]
                built: dict[str, Baseline] = {}
                if todo:
                    try:
                        built = self.build(todo, sha, envs[(sha, fp)], digest=digest, record=make)
                    except BaselineUnavailable as e:
                        self._failed[(sha, fp)] = failed = e
            for g, p in zip(groups, paths, strict=True):
                if failed is None:
                    out[g] = built.get(g) or Baseline(p, sha, cached=True)
                elif self.cache.usable(p):  # written before the build failed
                    out[g] = self._built.get(p) or Baseline(p, sha, cached=True)
                else:
                    errors[g] = failed
        return {**out, **errors}

    def build(
        self,
        groups: Sequence[str],
        sha: str,
        current: Provenance | None = None,
        *,
        digest: str | None = None,
        record: Record = False,
    ) -> dict[str, Baseline]:
        """Produce `groups` at `sha` now and write them into the cache (no lock: `prepare`
        holds it; `parity baseline build` takes it too); with `record`, each group's
        programs recorded op by op in the same run, saved beside it (`recorded`).

        **Arguments:**

        - `groups`: producer groups.
        - `sha`: the base commit.
        - `current`: the environment to match (a check's provenance): its layout and ISA
          cap are used, and the build's own environment must have its fingerprint; None
          for the configured layout and ISA cap.
        - `digest`: the producers' digest (computed if not given).

        **Returns:** group -> its baseline (`seconds` is the run's share per group). Raises
        `BaselineUnavailable` when the commit is missing, the producers cannot run there, or
        the build's environment is not `current`'s.
        """
        config = self.config
        digest = digest or self._digest()
        if current is not None:
            (processes, devices), isa = layout_of(current), current.isa_cap
        else:
            processes, devices, isa = config.processes, config.devices, config.isa
        root, full = base_commit(config.root, sha)
        src = config.src_relative()
        where = (
            describe_backend(current)
            if current is not None
            else f"{processes}x{devices} devices, isa {isa}"
        )
        self.progress(_building(groups, full, where, record))
        t0 = time.perf_counter()
        with owned_tempdir(BUILD_PREFIX) as tmp, temporary_worktree(root, full) as wt:
            try:
                run = ProducerRun(
                    code_root=wt,
                    producers=config.need_producers(),
                    out=tmp,
                    command="baseline",
                    mode="record" if record else "produce",
                    record_arrays=record == ARRAYS,
                    devices=devices,
                    isa=isa,
                    processes=processes,
                    groups=groups,
                    drop_paths=[root / r for r in src],
                    src=src,
                    timeout=self.timeout,
                    code=f"the base commit {full[:12]}",
                )
                run_producers(run, progress=self.progress)
            except ProducerRunError as e:
                raise BaselineUnavailable(
                    f"the producers cannot run at the base {full[:12]}: {e.reason}",
                    "make the producers run there (feature-detect what the base lacks), or "
                    "turn the baseline off (`--baseline off`)",
                ) from None
            seconds = (time.perf_counter() - t0) / len(groups)
            out: dict[str, Baseline] = {}
            for group in groups:
                if not (tmp / f"{group}.json").is_file():
                    raise BaselineUnavailable(
                        f"the producers define no group {group!r}",
                        "check the group names against the producers' GROUPS",
                    )
                loaded = load_runner_output(tmp, group, command="baseline")
                fp = environment_fingerprint(loaded.provenance)
                if current is not None and fp != environment_fingerprint(current):
                    moved = "; ".join(
                        str(d) for d in environment_difference(current, loaded.provenance).bits
                    )
                    raise BaselineUnavailable(
                        f"the baseline ran in another environment than the check ({moved})",
                        "run the check with no XLA flags beyond the ISA cap and device count "
                        "parity sets, as the producers run",
                    )
                path = self.cache.path_for(full, fp, digest, group)
                path.parent.mkdir(parents=True, exist_ok=True)
                if record:  # first, so that a usable entry always has it
                    keep_recording(tmp, group, path)
                write_run(path, loaded, sha=full, digest=digest)
                out[group] = self._built[path] = Baseline(path, full, False, seconds)
        self.progress(
            f"re-produced {count(len(out), 'group')} at {full[:12]} in "
            f"{time.perf_counter() - t0:.1f}s, "
            f"cached in {self.cache.folder}"
        )
        return out


def _building(groups: Sequence[str], sha: str, where: str, record: Record) -> str:
    """The progress line of a build."""
    cost = {
        False: "the first check here pays for it",
        True: "with its programs recorded op by op, to name the origin (cached with it)",
        ARRAYS: "with its programs recorded op by op, every value kept to replay the tree on "
        "(cached with it)",
    }[record]
    what = f"re-producing {', '.join(groups)} at the base {sha[:12]}"
    return f"{what} in this environment ({where}); {cost}"


def base_commit(root: Path, sha: str) -> tuple[Path, str]:
    """The git repository holding `root` and the full SHA of the base commit `sha` there;
    `BaselineUnavailable` saying which of three things is wrong: `root` is in no git
    repository, the commit is missing from a shallow clone, or from a full one."""
    try:
        repo = repo_root(root)
    except GitError:
        raise BaselineUnavailable(
            f"{root} is not in a git repository, so its base commit {sha[:12]} cannot be "
            "checked out",
            "check in a git clone of the project that holds that commit, or where the goldens "
            "were pinned (its ISA cap and layout), where a check compares with them bit for bit",
        ) from None
    try:
        return repo, resolve_sha(repo, sha)
    except GitError:
        pass
    try:
        shallow = git(repo, "rev-parse", "--is-shallow-repository") == "true"
    except GitError:
        shallow = False
    if shallow:
        raise BaselineUnavailable(
            f"its commit {sha[:12]} is not in this clone, which is shallow (it holds no history)",
            "fetch the history (`git fetch --unshallow`; in CI, check out with full depth)",
        )
    raise BaselineUnavailable(
        f"its commit {sha[:12]} is not in the history of the repository at {repo}",
        f"fetch it (`git fetch origin {sha}`), or repin the goldens at a commit of this history",
    )
