"""Repin goldens at a git base commit, without touching the user's checkout.

Steps (docs/design.md, "Repin"): resolve and verify the SHA; add a detached worktree at it in a
temporary folder; run the producers (from the *current* tree, public API only) in a
subprocess against that worktree's code, with the device count and XLA flags fixed (that
process also collects the provenance, so it describes the arrays' environment, not the
caller's); write the new golden files atomically; report what changed against the old ones;
remove the worktree on success, failure and interrupt.

Crash safety (`parity.store._staging`): a repin holds an exclusive lock on the golden folder, first
finishes or cleans up after a killed one (`recover`), stages every new file completely and
replaces the old ones through a journal, so SIGKILL at any moment leaves the old goldens or
the complete new ones. A full disk or an unwritable folder is a `RepinError` with the old
goldens intact; producers that cannot run, a `parity.machinery._launcher.ProducerRunError` saying
so.

A producers file defines `GROUPS`, a mapping of group name to a zero-argument callable
returning `{key: array}` in forward order (the order first-divergence reports follow), and
`CLASS_MAP`, a sequence of `(glob pattern, class name)` rules. Each group becomes one file,
`<out>/<group>.h5`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from parity._errors import ParityError
from parity._xla_env import DEFAULT_ISA_CAP
from parity.judge._floats import count
from parity.judge._tolerance import ClassMap
from parity.machinery._config import ParityConfig
from parity.machinery._launcher import ProducerRun, run_producers
from parity.machinery._producers_table import ProducersTable
from parity.machinery._runner_output import load_runner_output
from parity.machinery._signals import signals_reach_main_thread
from parity.machinery._worktree import (
    remove_stale_worktrees,
    repo_root,
    resolve_sha,
    temporary_worktree,
)
from parity.run._goldens import (
    GroupChange,
    carry_calibration,
    summarize_change,
    write_golden,
    write_run,
)
from parity.store import GoldenStoreError, open_goldens
from parity.store._provenance import digest_sources
from parity.store._staging import (
    JOURNAL_NAME,
    RUNNER_PREFIX,
    StagingError,
    commit_staged,
    folder_lock,
    owned_tempdir,
    recover,
    staged_name,
)


class RepinError(ParityError, RuntimeError):
    """Repinning failed before or after the producers ran (no producers file, an unusable
    or locked golden folder, a golden that cannot be written or read); the old goldens are
    untouched. Producers that fail are a `parity.machinery._launcher.ProducerRunError`."""


@dataclass(frozen=True)
class RepinResult:
    sha: str
    out_dir: Path
    changes: tuple[GroupChange, ...] = field(default_factory=tuple)


@dataclass(frozen=True, kw_only=True)
class RepinRun:
    """How a repin runs the producers at its base commit.

    **Fields:** `devices`, `isa` (the device count and ISA cap, fixed for the producer run
    and recorded in provenance), `groups` (a subset of the producer groups; empty: all),
    `src` (the import roots of the code under test, relative to the repository root; None:
    `src`; the same folders of the current checkout are kept off the path),
    `keep_worktree` (leave the worktree for inspection; its path is reported).
    """

    devices: int = 1
    isa: str | None = DEFAULT_ISA_CAP
    groups: Sequence[str] = ()
    src: Sequence[str] | None = None
    keep_worktree: bool = False

    @classmethod
    def of(
        cls, config: ParityConfig, *, groups: Sequence[str] = (), keep_worktree: bool = False
    ) -> RepinRun:
        """A run of `groups` in `config`'s device count and ISA cap, from its src roots."""
        devices, isa, src = config.devices, config.isa, config.src_relative()
        return cls(devices=devices, isa=isa, groups=groups, src=src, keep_worktree=keep_worktree)


def repin(
    base: str,
    *,
    producers: Path | str,
    out_dir: Path | str,
    repo: Path | str = ".",
    progress: Callable[[str], None] = print,
    run: RepinRun | None = None,
) -> RepinResult:
    """Pin goldens at commit `base`.

    **Arguments:**

    - `base`: a revision naming a commit of the repository (resolved to a SHA).
    - `producers`: the producers file, from the current tree.
    - `out_dir`: where `<group>.h5` files go (created if missing).
    - `repo`: a folder inside the repository.
    - `progress`: receives one line per step.
    - `run`: the layout, ISA cap, groups and src roots of the producer run, and whether to
      keep its worktree (`RepinRun`; None: its defaults, every group on 1 device).

    **Returns:** a `RepinResult` with what changed per file.
    """
    run = run or RepinRun()
    root = repo_root(repo)
    sha = resolve_sha(root, base)
    producers = Path(producers).resolve()
    if not producers.is_file():
        raise RepinError(f"producers file not found: {producers}")
    out = Path(out_dir).resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RepinError(
            f"cannot use {out} as the golden folder: {e.strerror or e}; pass --out a "
            "writable folder"
        ) from None
    with signals_reach_main_thread(), _locked(out):
        for line in _recover(out, root):
            progress(line)
        return _repin_locked(root, sha, producers, out, run, progress)


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    try:
        with folder_lock(out):
            yield
    except StagingError as e:
        raise RepinError(str(e)) from None


def _recover(out: Path, root: Path) -> list[str]:
    """`recover` the golden folder, then remove the stale worktrees a killed repin left in
    the repository at `root`; **returns** one line per thing done."""
    return recover(out) + remove_stale_worktrees(root)


def recover_folder(out_dir: Path | str, *, repo: Path | str = ".") -> list[str]:
    """Finish or clean up after a repin of `out_dir` that was killed (`parity.store._staging`).

    **Returns:** one line per thing done. Raises `RepinError` if a repin holds the folder.
    """
    out = Path(out_dir).resolve()
    with _locked(out):
        try:
            return _recover(out, repo_root(repo))
        except StagingError as e:
            raise RepinError(str(e)) from None


def _repin_locked(
    root: Path,
    sha: str,
    producers: Path,
    out: Path,
    run: RepinRun,
    progress: Callable[[str], None],
) -> RepinResult:
    progress(f"repin at {sha[:12]}: adding a temporary worktree")
    src = run.src
    with (
        owned_tempdir(RUNNER_PREFIX) as tmp,
        temporary_worktree(root, sha, keep=run.keep_worktree) as wt,
    ):
        if run.keep_worktree:
            progress(f"worktree kept at {wt}")
        at_base = ProducerRun(
            code_root=wt,
            producers=producers,
            out=Path(tmp),
            command="repin",
            devices=run.devices,
            isa=run.isa,
            groups=run.groups,
            drop_paths=[root / r for r in src] if src else [root / "src"],
            src=src,
            check_classes=True,
            code=f"the base commit {sha[:12]}",
        )
        run_producers(at_base, progress=progress)
        digest = digest_sources([producers])
        names = sorted(p.stem for p in Path(tmp).glob("*.json"))
        staged: list[tuple[Path, Path]] = []
        changes = []
        try:
            for name in names:
                produced = load_runner_output(Path(tmp), name, command="repin")
                dest = out / f"{name}.h5"
                change = summarize_change(name, dest, produced.arrays, produced.order)
                calibration, note = carry_calibration(dest, change)
                changes.append(dataclasses.replace(change, calibration=note))
                new = staged_name(dest)
                staged.append((new, dest))
                try:
                    write_run(new, produced, sha=sha, digest=digest, calibration=calibration)
                except (OSError, RuntimeError) as e:  # a full disk, a quota, RLIMIT_FSIZE
                    raise RepinError(
                        f"cannot write the new golden {dest.name} in {out}: "
                        f"{type(e).__name__}: {' '.join(str(e).split())}; old goldens are "
                        "untouched"
                    ) from None
            # Every file is complete before any replaces an old one (see parity.store._staging).
            commit_staged(out, staged)
        except StagingError as e:
            raise RepinError(str(e)) from None
        finally:
            if not (out / JOURNAL_NAME).exists():  # else the journal still needs them
                for new, _ in staged:
                    with contextlib.suppress(FileNotFoundError):
                        new.unlink()
    return RepinResult(sha, out, tuple(changes))


@dataclass(frozen=True)
class Reclassed:
    """What `reclass` did to one golden file.

    **Fields:** `group`, `path`, `arrays` (how many), `moved` (keys whose stored sha256
    changed: always empty unless the file was damaged), `changed` (`(key, old class,
    new class)` for every key whose class changed) and `reordered` (with `reorder`: how
    many keys changed place in the forward order; else None).
    """

    group: str
    path: Path
    arrays: int
    moved: tuple[str, ...]
    changed: tuple[tuple[str, str, str], ...]
    reordered: int | None = None

    def describe(self) -> str:
        """One line, then one per class change (counted by old -> new)."""
        moved = "unchanged" if not self.moved else f"{len(self.moved)} MOVED"
        lines = [
            f"{self.group}: {count(self.arrays, 'array')}, {moved}; "
            f"{len(self.changed)} changed class"
        ]
        if self.reordered is not None:
            lines[0] += f"; {self.reordered} changed place in the forward order"
        counts: dict[tuple[str, str], int] = {}
        for _, old, new in self.changed:
            counts[(old, new)] = counts.get((old, new), 0) + 1
        lines += [f"  {count(n, 'key')} {old} -> {new}" for (old, new), n in sorted(counts.items())]
        return "\n".join(lines)


def reclass(
    *,
    producers: Path | str,
    out_dir: Path | str,
    repo: Path | str = ".",
    groups: Sequence[str] = (),
    progress: Callable[[str], None] = print,
    src: Sequence[str] | None = None,
    reorder: bool = False,
) -> list[Reclassed]:
    """Give existing goldens the class map of the current producers, without producing.

    With `reorder`, also their forward order: the producers run (the current tree's code,
    in a fresh process) and only the order of the keys they return is kept, with how it was
    made (`parity.judge._dataflow`); every array stays the one pinned, byte for byte. For
    a change to the producers' order alone (each train step's metrics before the
    parameters it produced), where a repin would re-produce every array. A group whose
    produced keys are not the golden's is refused.

    The producers file is imported (the current tree's code, as `parity check` does) only
    to read its `CLASS_MAP`; every golden file of `groups` (default all in `out_dir`) is
    rewritten with that map and the classes it gives each key, its arrays, order and
    provenance (calibration included) byte for byte as they were. The files are replaced
    together, under the folder's lock, crash-safely (`parity.store._staging`). For a class
    decision made on main from a calibration, where a repin on another host would
    re-produce every array.

    **Returns:** one `Reclassed` per file. Raises `parity.machinery._launcher.ProducerRunError`
    if the producers cannot be imported (or, with `reorder`, run), `RepinError` if a group
    has no golden file.
    """
    root = repo_root(repo)
    producers = Path(producers).resolve()
    out = Path(out_dir).resolve()
    with signals_reach_main_thread(), _locked(out), owned_tempdir(RUNNER_PREFIX) as tmp:
        for line in _recover(out, root):
            progress(line)
        classes = ProducerRun(
            code_root=root,
            producers=producers,
            out=Path(tmp),
            command="repin",
            src=src,
            mode="class_map",
            check_classes=True,
        )
        run_producers(classes, progress=progress)
        class_map = ClassMap(rules=ProducersTable.read(Path(tmp)).class_map)
        names = list(groups) or sorted(p.stem for p in out.glob("*.h5"))
        missing = [g for g in names if not (out / f"{g}.h5").is_file()]
        if missing:
            raise RepinError(f"no golden file for group(s) {missing} in {out}; pin them first")
        orders: dict[str, tuple[list[str], str]] = {}
        if reorder:
            produced = Path(tmp) / "produced"
            produced.mkdir()
            run = ProducerRun(
                code_root=root,
                producers=producers,
                out=produced,
                command="repin",
                src=src,
                groups=names,
            )
            run_producers(run, progress=progress)
            for name in names:
                run = load_runner_output(produced, name, command="repin")
                orders[name] = (list(run.arrays), run.order)
        staged: list[tuple[Path, Path]] = []
        done: list[Reclassed] = []
        try:
            for name in names:
                dest = out / f"{name}.h5"
                new = staged_name(dest)
                staged.append((new, dest))
                done.append(_reclass_file(name, dest, new, class_map, orders))
            commit_staged(out, staged)
        except StagingError as e:
            raise RepinError(str(e)) from None
        finally:
            if not (out / JOURNAL_NAME).exists():
                for new, _ in staged:
                    with contextlib.suppress(FileNotFoundError):
                        new.unlink()
    return done


def _reclass_file(
    name: str,
    dest: Path,
    new: Path,
    class_map: ClassMap,
    orders: Mapping[str, tuple[list[str], str]],
) -> Reclassed:
    """Write group `name`'s golden `dest` again at `new` under `class_map` (and, where
    `orders` has the group, in the produced order), every array byte for byte."""
    try:
        with open_goldens(dest) as gf:
            arrays = {k: gf[k] for k in gf}
            before = {k: gf.info(k).class_name for k in gf}
            sha = {k: gf.info(k).sha256 for k in gf}
            provenance, order = gf.provenance, gf.ordered_keys()
    except GoldenStoreError as e:
        raise RepinError(
            f"the golden file of group {name!r} cannot be read, so its classes "
            f"cannot be rewritten ({' '.join(str(e).split())}); pin it again with "
            "parity repin --base <SHA>"
        ) from None
    reordered = None
    if name in orders:
        keys, made = orders[name]
        if sorted(keys) != sorted(arrays):
            raise RepinError(
                f"the producers return other keys for group {name!r} than its "
                f"golden holds ({len(set(keys) ^ set(arrays))} differ); "
                "--order only reorders: repin it with parity repin --base <SHA>"
            )
        old_place = {k: i for i, k in enumerate(order)}
        reordered = sum(old_place.get(k) != i for i, k in enumerate(keys))
        order, provenance = keys, dataclasses.replace(provenance, order=made)
    classes = write_golden(new, arrays, class_map, provenance=provenance, order=order)
    with open_goldens(new) as check:
        moved = tuple(k for k in check if check.info(k).sha256 != sha.get(k))
    changed = tuple((k, before[k], classes[k]) for k in arrays if before[k] != classes[k])
    return Reclassed(name, dest, len(arrays), moved, changed, reordered)
