"""The origin of a failing golden check: the first operation of the tree's program that
computes what the base's program never did, at its source line (issue 35; docs/design.md,
"Where it diverged"; the matching itself is `parity.origin`'s).

`parity check` asks for it after the verdict, for the failing groups only, so a passing
check costs what it did before: one more producer run of those groups on the current tree
with `--record-origin` (each group's program recorded op by op, its summary saved), and one
at the golden's base commit in this environment (a temporary worktree, as a baseline is
re-produced), cached beside the baseline's entry
(`<cache>/<sha>/<fingerprint>-<digest>/<group>.origin.npz`), so a failing check run again
pays only for the current tree's recording. `locate`'s rule then runs here, on the two
summaries. `parity bisect` does the same for the first bad commit against its parent.

Where a group is not recorded, one line says why, and the verdict stands: its outputs are
not computed by the jax programs the producer runs (numpy made them), the run spans processes,
the failing key's class gives no matching tolerance (`logit_kl`), the base cannot be
re-produced, or the program is too large (`_producer_runner.ORIGIN_MAX_BYTES`).

Nothing here imports jax.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from parity.baseline import BaselineUnavailable
from parity.check import GoldenDir
from parity.environment import environment_fingerprint, layout_of
from parity.judge.classes import REGISTRY, ToleranceClass
from parity.judge.tolerance import UnknownClassError, to_class
from parity.origin import LocaliseError, Recording, align, matching_tolerance
from parity.results import CheckError, CheckResult
from parity.run.baseline import BaselineCache, base_commit, cache_dir
from parity.run.config import ParityConfig
from parity.run.launcher import ProducerRunError, run_producers
from parity.run.produced import Produced
from parity.run.worktree import GitError, temporary_worktree
from parity.store.provenance import digest_sources
from parity.store.staging import owned_tempdir

__all__ = [
    "PROFILE_BINS",
    "base_recordings",
    "explain",
    "name_origins",
    "origin_between",
    "record_groups",
]

#: What `--record-origin` writes per group (`_producer_runner.ORIGIN_RECORDING`, `_REASON`).
_RECORDING, _REASON = ".origin.npz", ".origin.json"
#: The most bins of the matched-share profile a result carries (for the HTML plot).
PROFILE_BINS = 120
_PREFIX = "parity-origin-"

Progress = Callable[[str], None]


def record_groups(
    code_root: Path,
    config: ParityConfig,
    groups: Sequence[str],
    out: Path,
    *,
    code: str,
    drop_paths: Sequence[Path] = (),
    current: Mapping[str, Any] | None = None,
    progress: Progress = lambda _: None,
    timeout: float | None = None,
) -> dict[str, Path | str]:
    """Record `groups`' programs at `code_root` in one producer run (`--record-origin`),
    into `out`, in one process with the layout and ISA cap of `current` (a provenance) or
    of `config`.

    **Returns:** group -> its recording's file, or one line saying why it has none.
    """
    devices, isa = config.devices, config.isa
    if current is not None:
        (_, devices), isa = layout_of(current), current.get("isa_cap")
    try:
        run_producers(
            code_root, config.need_producers(), out, command="origin", device_count=devices,
            isa_cap=isa, groups=groups, drop_paths=drop_paths, progress=progress,
            src=config.src_relative(), timeout=timeout, code=code, record_origin=True,
        )  # fmt: skip
    except ProducerRunError as e:
        return dict.fromkeys(groups, f"the producers cannot run at {code}: {e.reason}")
    found: dict[str, Path | str] = {}
    for g in groups:
        path, why = out / f"{g}{_RECORDING}", out / f"{g}{_REASON}"
        if path.is_file():
            found[g] = path
        elif why.is_file():
            found[g] = str(json.loads(why.read_text())["reason"])
        else:
            found[g] = f"the producers recorded nothing for it at {code}"
    return found


def base_recordings(
    config: ParityConfig,
    wanted: Sequence[tuple[str, Mapping[str, Any], Mapping[str, Any]]],
    *,
    cache: BaselineCache | None = None,
    progress: Progress = lambda _: None,
    timeout: float | None = None,
) -> dict[str, Path | str]:
    """Each group's program recorded at its golden's base commit in the environment its
    check ran in: from the cache, else recorded now (one producer run per base commit and
    environment, under the cache entries' locks).

    **Arguments:** `wanted`, `(group, pinned provenance, current provenance)` triples.

    **Returns:** group -> the recording's file in the cache, or one line saying why not.
    """
    cache = cache or BaselineCache(cache_dir(config))
    digest = digest_sources([config.need_producers()])
    out: dict[str, Path | str] = {}
    batches: dict[tuple[str, str], list[tuple[str, Path]]] = {}
    envs: dict[tuple[str, str], Mapping[str, Any]] = {}
    for group, pinned, current in wanted:
        sha = str(pinned.get("base_sha") or "")
        if not sha:
            out[group] = "its golden records no base commit to re-produce (repin it with --base)"
            continue
        fp = environment_fingerprint(current)
        path = cache.path_for(sha, fp, digest, group).with_suffix(_RECORDING)
        batches.setdefault((sha, fp), []).append((group, path))
        envs[(sha, fp)] = current
    for (sha, fp), todo in batches.items():
        with cache.locked([p for _, p in todo]):
            missing = [(g, p) for g, p in todo if not p.is_file()]
            out |= {g: p for g, p in todo if p.is_file()}
            if missing:
                out |= _record_base(config, sha, missing, envs[(sha, fp)], progress, timeout)
    return out


def _record_base(
    config: ParityConfig, sha: str, missing: Sequence[tuple[str, Path]],
    current: Mapping[str, Any], progress: Progress, timeout: float | None,
) -> dict[str, Path | str]:  # fmt: skip
    groups = [g for g, _ in missing]
    try:
        root, full = base_commit(config.root, sha)
    except BaselineUnavailable as e:
        return dict.fromkeys(groups, f"the base cannot be re-produced here: {e.reason}")
    progress(f"recording {', '.join(groups)} at the base {full[:12]} to name the origin")
    found: dict[str, Path | str] = {}
    try:
        with owned_tempdir(_PREFIX) as tmp, temporary_worktree(root, full) as wt:
            got = record_groups(
                wt, config, groups, Path(tmp), code=f"the base {full[:12]}",
                drop_paths=[root / r for r in config.src_relative()], current=current,
                progress=progress, timeout=timeout,
            )  # fmt: skip
            for group, path in missing:
                made = got[group]
                if isinstance(made, str):
                    found[group] = f"at the base {full[:12]}: {made}"
                    continue
                staged = path.with_suffix(".part")
                shutil.copyfile(made, staged)
                os.replace(staged, path)
                found[group] = path
    except GitError as e:
        return dict.fromkeys(groups, f"the base cannot be checked out: {' '.join(str(e).split())}")
    return found


def _load(path: Path) -> Recording:
    with np.load(path) as data:
        return Recording.from_arrays(dict(data))


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


def explain(
    new_file: Path,
    old_file: Path,
    key: str,
    class_name: str,
    *,
    root: Path | None,
    registry: Mapping[str, ToleranceClass] = REGISTRY,
    old_name: str = "the base",
) -> tuple[dict[str, Any] | None, str]:
    """The origin of `key` in the new recording against the old one (`parity.origin`'s
    rule, the matching tolerance from `class_name`), as the JSON dict a result carries
    (`CheckResult.origin`) and the `origin:` line; `(None, line)` where every value
    upstream of `key` matched. Raises `LocaliseError` where the key is absent or its class
    gives no matching tolerance."""
    new, old = _load(new_file), _load(old_file)
    if key not in old.output_arrays or key not in new.outputs:
        raise LocaliseError(f"the recorded programs do not both output {key!r}")
    rho = matching_tolerance(to_class(class_name, registry), old.output_arrays[key])
    alignment = align(new, old, rho)
    origin = alignment.origin(key, root=root)
    if origin is None:
        return None, (
            f"origin: none: run op by op, {key} and every value upstream of it match "
            f"{old_name}'s (the difference is in how XLA compiled them, not in the operations)"
        )
    counted = np.array([v.kind != "input" for v in new.values])
    matched = alignment.matched[counted].astype(np.float64)
    bins = np.array_split(matched, min(PROFILE_BINS, max(1, len(matched))))
    doc = {k: _jsonable(v) for k, v in dataclasses.asdict(origin).items()}
    doc |= {
        "values": len(matched),
        "profile": [round(float(b.mean()), 4) if len(b) else 1.0 for b in bins],
        "origin_at": round(int(counted[: origin.position].sum()) / max(1, len(matched)), 4),
    }
    return doc, f"origin: {origin.describe()}"


def _why_not(r: CheckResult, produced: Produced) -> str | None:
    """Why the failing check `r` gets no recording, or None: asked before any run."""
    group, first = r.group or "", r.comparison.first_failure
    if first is None:
        return "no key breaks its class"
    if produced.layout.processes > 1:
        return "the check ran in several processes; the origin is recorded in one (check with 1)"
    if produced.orders.get(group) != "dataflow":
        return (
            "the producer's outputs are not computed by the jax programs it runs (numpy "
            "computed them on the host), so the operations that made them cannot be recorded"
        )
    actual = produced.groups.get(group, {}).get(first.key)
    if actual is None:
        return None
    try:
        tol = to_class(first.class_name, REGISTRY)
    except (UnknownClassError, ValueError) as e:
        return f"the failing key {first.key}'s class cannot be read here ({e})"
    try:
        matching_tolerance(tol, actual)
    except LocaliseError as e:
        if tol.rule.unit in ("abs", "ulp"):
            return f"the failing key {first.key}'s class gives no matching tolerance: {e.reason}"
        return (
            f"the failing key {first.key}'s class {tol.name} judges in {tol.rule.unit!r}, not "
            "|a-b| or ulps, so it gives no matching tolerance for the values upstream of it "
            "(a close, relative_to_max or ulp class does)"
        )
    return None


def name_origins(
    results: Sequence[CheckResult],
    produced: Produced,
    config: ParityConfig,
    goldens: GoldenDir,
    *,
    root: Path,
    progress: Progress = lambda _: None,
    timeout: float | None = None,
) -> list[CheckResult]:
    """`results` with each failing group's origin named (`CheckResult.origin`,
    `origin_line`), against its golden's base commit recorded here (module docstring); passing
    checks untouched. `root`: paths in the origins are relative to it."""
    lines: dict[str, str] = {}
    todo: list[CheckResult] = []
    for r in results:
        if r.passed or r.group is None:
            continue
        why = _why_not(r, produced)
        if why is None:
            todo.append(r)
        else:
            lines[r.name] = f"origin: not named: {why}"
    docs: dict[str, dict[str, Any]] = {}
    if todo:  # before any recording run: a base that is not here is said at once
        missing = _bases_out_of_reach(config, goldens, todo, produced)
        lines |= {name: f"origin: not named: {why}" for name, why in missing.items()}
        todo = [r for r in todo if r.name not in missing]
    if todo:
        progress(f"recording {', '.join(r.name for r in todo)} op by op to name the origin")
        with owned_tempdir(_PREFIX) as tmp:
            new = record_groups(
                config.root, config, [r.group or "" for r in todo], Path(tmp),
                code="the current tree", progress=progress, timeout=timeout,
            )  # fmt: skip
            wanted = []
            for r in todo:
                try:
                    wanted.append((r.name, goldens.open(r.name).provenance,
                                   produced.provenance.get(r.name) or {}))  # fmt: skip
                except CheckError as e:
                    new[r.name] = str(e)
            recorded = [w for w in wanted if isinstance(new[w[0]], Path)]
            old = base_recordings(config, recorded, progress=progress, timeout=timeout)
            for r in todo:
                doc, lines[r.name] = _one(r, new.get(r.name), old.get(r.name), root)
                if doc is not None:
                    docs[r.name] = doc
    return [
        dataclasses.replace(r, origin=docs.get(r.name), origin_line=lines[r.name])
        if r.name in lines else r
        for r in results
    ]  # fmt: skip


def _bases_out_of_reach(
    config: ParityConfig, goldens: GoldenDir, todo: Sequence[CheckResult], produced: Produced
) -> dict[str, str]:
    """The failing checks of `todo` whose golden's base commit is not in this clone (a
    shallow one, say) and whose base recording is not cached, each with one line: what is
    missing and what to do (`base_commit`'s). Asked before any recording run, so a check
    that cannot reach its base pays for none. Groups this cannot judge (no golden, no base
    commit recorded) are left to the recording path, which says why."""
    cache = BaselineCache(cache_dir(config))
    digest = digest_sources([config.need_producers()])
    out: dict[str, str] = {}
    for r in todo:
        try:
            sha = str(goldens.open(r.name).provenance.get("base_sha") or "")
        except CheckError:
            continue
        current = produced.provenance.get(r.name) or {}
        path = cache.path_for(sha, environment_fingerprint(current), digest, r.name)
        if not sha or path.with_suffix(_RECORDING).is_file():
            continue
        try:
            base_commit(config.root, sha)
        except BaselineUnavailable as e:
            out[r.name] = f"the base cannot be re-produced here: {e}"
    return out


def _one(
    r: CheckResult, new: Path | str | None, old: Path | str | None, root: Path
) -> tuple[dict[str, Any] | None, str]:
    first = r.comparison.first_failure
    assert first is not None  # `_why_not` let only failing checks through
    for side in (new, old):
        if not isinstance(side, Path):
            return None, f"origin: not named: {side or 'nothing was recorded'}"
    assert isinstance(new, Path) and isinstance(old, Path)
    try:
        return explain(new, old, first.key, first.class_name, root=root,
                       old_name="the base commit")  # fmt: skip
    except (LocaliseError, UnknownClassError, ValueError) as e:
        return None, f"origin: not named: {e.reason if isinstance(e, LocaliseError) else e}"


def origin_between(
    config: ParityConfig,
    repo: Path,
    step: tuple[str, str, str],
    new_sha: str,
    old_sha: str,
    *,
    progress: Progress = lambda _: None,
    timeout: float | None = None,
) -> tuple[dict[str, Any] | None, str]:
    """The origin of a bisection's answer: `step`'s `(group, key, class)` recorded at the
    first bad commit `new_sha` and at its parent `old_sha` (each in a temporary worktree of
    `repo`, in this environment), as `explain` gives it; file paths relative to the
    repository. Never raises for a program it cannot record: the line says why."""
    group, key, class_name = step
    files: dict[str, Path | str] = {}
    with owned_tempdir(_PREFIX) as tmp:
        try:
            for side, sha in (("new", new_sha), ("old", old_sha)):
                (tmp / side).mkdir()
                progress(f"recording {group} at {sha[:12]} to name the origin")
                with temporary_worktree(repo, sha) as wt:
                    files[side] = record_groups(
                        wt, config, [group], tmp / side, code=f"commit {sha[:12]}",
                        drop_paths=config.src, progress=progress, timeout=timeout,
                    )[group]  # fmt: skip
                    files[f"{side}_root"] = wt.resolve()
                if isinstance(files[side], str):
                    return None, f"origin: not named: {files[side]}"
        except GitError as e:
            return None, f"origin: not named: cannot check out: {' '.join(str(e).split())}"
        new, old, root = files["new"], files["old"], files["new_root"]
        assert isinstance(new, Path) and isinstance(old, Path) and isinstance(root, Path)
        try:
            return explain(new, old, key, class_name, root=root,
                           old_name=f"the parent {old_sha[:12]}")  # fmt: skip
        except (LocaliseError, UnknownClassError, ValueError) as e:
            return None, f"origin: not named: {e.reason if isinstance(e, LocaliseError) else e}"
