"""Run a producers file against another checkout's code and save what it returns.

Started by `parity.machinery._launcher` in a subprocess, by path. The harness (`parity`) is
the current tree's, imported first; the code under test comes from `--src` (the worktree of the
commit tried, named by `--code` in messages, or the current tree); the producers file is
the current tree's. Arrays go to `OUT/<group>.npz` with a
manifest `OUT/<group>.json` (key order, dtype names; ml_dtypes are saved as same-width
unsigned ints) and `provenance`: the environment of *this* process, collected right after the
group ran (x64 mode and device count as jax saw them, the XLA flags it ran under), so a
`JAX_ENABLE_X64` or `XLA_FLAGS` in the user's shell, which this process never sees, cannot
be recorded for arrays made without it. In one process, the programs each group
dispatches are kept while it runs (`parity.origin._programs`), and its keys put in the order
those programs compute them (`parity.origin._record.record_programs`); with
`--record-origin` they are also run op by op and the recording's summary saved as
`OUT/<group>.origin.npz`, beside the arrays, or `OUT/<group>.origin.json`
(`{"reason": ...}`) where the group cannot be recorded; with `--keep` the run stays alive
once every group is saved and records the groups the launcher asks for on stdin
(`parity.machinery._runner_groups`, which also runs each group). Exit
codes: 0 ok, 1 a producer raised, 3 the base lacks a needed symbol, 4 a group asked for
is not defined (`OUT/unknown_groups.json` says which, and which are), 5 (with
`--check-classes`) a `CLASS_MAP` rule names a class parity cannot use
(`OUT/unusable_classes.json` says why), before any group runs.

As one worker of a multi-process run (`parity.machinery._processes.run_workers` sets
`PARITY_PROCESS_ID`, `PARITY_PROCESSES` and `PARITY_COORDINATOR`), it joins JAX's
distributed runtime before anything touches jax, runs every group on every process (SPMD),
brings arrays sharded over processes to the host (a gather every process joins), checks
that every process holds the same bytes for every key, and only process 0 saves.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

# Run as a script, this file's folder (parity/machinery/) comes first on sys.path, and its
# modules (config, launcher, processes, ...) would shadow a project's own modules of the same
# name: the folder holding the parity package takes its place.
_HERE = os.path.dirname(os.path.realpath(__file__))
if sys.path and os.path.realpath(sys.path[0] or ".") == _HERE:
    sys.path[0] = os.path.dirname(os.path.dirname(_HERE))

from parity.judge._converting import ConvertError  # noqa: E402
from parity.machinery._converters import write_conversions  # noqa: E402
from parity.machinery._producers_table import ProducersTable  # noqa: E402
from parity.machinery._runner_groups import (  # noqa: E402
    Kept,
    log as _log,
    run_group,
    serve,
)

EXIT_PRODUCER_FAILED = 1
EXIT_MISSING_SYMBOL = 3
EXIT_UNKNOWN_GROUP = 4
EXIT_UNUSABLE_CLASS = 5
#: What the runner writes into OUT when asked for groups the producers do not define.
UNKNOWN_GROUPS = "unknown_groups.json"
#: What the runner writes into OUT when `--check-classes` finds a `CLASS_MAP` rule naming a
#: class that cannot be pinned: one sentence per such rule.
UNUSABLE_CLASSES = "unusable_classes.json"


def _missing_symbol(exc: BaseException, src: str, code: str) -> str | None:
    """What the code under test lacks, when `exc` says so: `code` names it (the commit
    tried, the base commit of a repin, the current tree), `src` where it was imported."""
    if isinstance(exc, ImportError) and exc.name:
        if isinstance(exc, ModuleNotFoundError):
            what = f"the module {exc.name!r}"
        else:  # `from module import name`: Python's message is the one place naming `name`
            named = re.search(r"cannot import name '([^']+)'", str(exc))
            symbol = f"{named.group(1)!r}" if named else "a name the producers import"
            what = f"{symbol} in the module {exc.name!r}"
        return f"{code} ({src}) lacks {what}, which the producers need"
    if isinstance(exc, (ImportError, AttributeError)):
        return f"{code} ({src}) lacks a symbol the producers need: {exc}"
    return None


def _die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this process when the repin that started it dies (a repin
    killed with SIGKILL runs no cleanup, and would leave producers running); exit at once
    if it died already. Done here rather than in a `preexec_fn`, which would make the
    parent fork a multithreaded (jax) process."""
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if parent and os.getppid() != parent:
        sys.exit(EXIT_PRODUCER_FAILED)


def _join_run() -> Any:
    """Join the distributed run this process is a worker of, if any: its
    `parity.machinery._worker.Place`, else None."""
    from parity.machinery._worker import initialize, worker_place

    place = worker_place()
    if place is None:
        return None
    process_id, processes, coordinator = place.process_id, place.processes, place.coordinator
    initialize(coordinator, processes, process_id)
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):  # the machine's cache: every process
        from parity.machinery._jax_cache import write_from_every_process  # writes its programs

        write_from_every_process()
    _log(f"process {process_id} of {processes} joined the run at {coordinator}")
    return place


def _disagreement(hosted: dict) -> str | None:
    """What differs between this process's host arrays and process 0's, in one line (the
    same line on every process), or None. A gathered array is the same everywhere by
    construction; a value each process made for itself (a fully replicated array, a numpy
    result) need not be, and process 0's copy alone would hide a per-process draw."""
    import hashlib

    import numpy as np
    from jax.experimental import multihost_utils

    digests = np.stack(
        [
            np.frombuffer(hashlib.sha256(np.ascontiguousarray(v).tobytes()).digest(), np.uint8)
            for v in hosted.values()
        ]
        or [np.zeros(32, np.uint8)]
    )
    everyone = np.asarray(multihost_utils.process_allgather(digests))
    for process in range(1, everyone.shape[0]):
        for j, key in enumerate(hosted):
            if not np.array_equal(everyone[process, j], everyone[0, j]):
                return (
                    f"process {process} holds other values for key {key!r} than process 0 "
                    "(a value drawn or computed per process where the run expects one for "
                    "all); make it the same on every process, or shard it over the mesh"
                )
    return None


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    """The worker's command line (the launcher writes it)."""
    p = argparse.ArgumentParser()
    p.add_argument("--parent-pid", type=int, default=0, help="die when this process dies")
    p.add_argument("--src", required=True, help="folder to import the code under test from")
    p.add_argument(
        "--also-src", action="append", default=[], help="further import roots, after --src"
    )
    p.add_argument("--drop-path", action="append", default=[], help="sys.path entries to remove")
    p.add_argument("--producers", required=True)
    p.add_argument(
        "--code",
        default="the code under test",
        help="what --src holds, for messages (a commit, the current tree)",
    )
    p.add_argument("--out", required=True)
    p.add_argument("--groups", default="", help="comma-separated subset of groups")
    p.add_argument(
        "--check-classes",
        action="store_true",
        help="refuse a CLASS_MAP that names a class parity cannot use, before any group runs",
    )
    p.add_argument(
        "--class-map-only",
        action="store_true",
        help="import the producers and save their table (CLASS_MAP, STACK, RENAME: "
        "OUT/table.json), run no group",
    )
    p.add_argument(
        "--goldens-layout",
        metavar="FILE",
        help="a JSON map group -> [[golden key, shape], ...]: probe each group's CONVERT "
        "function on it (OUT/convert/<group>.npz)",
    )
    p.add_argument(
        "--record-origin",
        action="store_true",
        help="also record the programs each group runs, op by op (OUT/<group>.origin.npz)",
    )
    p.add_argument(
        "--record-arrays",
        action="store_true",
        help="with --record-origin, keep every recorded value's numbers in the recording",
    )
    p.add_argument(
        "--replay",
        metavar="FILE",
        help="with --record-origin, a JSON map group -> {base, keys, root}: record the group "
        "with its replay on the base's values and save the answers (OUT/<group>.replay.json)",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="once every group is saved, record groups as stdin asks (one process only)",
    )
    p.add_argument(
        "--no-order",
        action="store_true",
        help="leave each group's forward order unread: no hook goes into jax",
    )
    return p.parse_args(argv)


def _import_harness() -> Callable[[Iterable[str]], dict[str, Any]] | None:
    """Import the harness (and install the compile counter where asked, and the size tally
    of the machine's compilation cache where it has one: `parity.machinery._jax_cache`); its
    `collect_provenance` as JSON (`Provenance.to_json_dict`: the manifest's, read back by
    `parity.machinery._runner_output`), given the modules held before the producers were
    imported (the distributions imported since are the producers' `packages`), or None
    where parity cannot be imported."""
    collect_provenance = None
    try:
        import parity
        import parity._compile_stats  # noqa: F401
        from parity.machinery import _compile_count as compile_count
        from parity.store._provenance import collect_provenance

        if os.environ.get(compile_count.LOG_VAR):
            compile_count.install()
        if os.environ.get("JAX_COMPILATION_CACHE_DIR"):  # the machine's cache
            from parity.machinery._jax_cache import keep_a_size_tally

            keep_a_size_tally()
    except ImportError:
        pass
    if collect_provenance is None:
        return None
    from parity.store._provenance import imported_distributions as imported

    collect = collect_provenance
    return lambda before: collect(packages=imported(before)).to_json_dict()


def _save_group(
    out: Path,
    name: str,
    arrays: dict[str, Any],
    table: ProducersTable,
    order: tuple[str, str],
    provenance: Any,
) -> None:
    """Write group `name`'s arrays to `OUT/<name>.npz` (ml_dtypes arrays as their bits,
    under `a0`, `a1`, ...) and its manifest to `OUT/<name>.json`: the keys, their
    dtypes, the producers' table (`CLASS_MAP`, `STACK`, `RENAME`: `table`, as
    `ProducersTable.to_json_dict` writes it), where the order came from and why the recorder
    could not see the programs ("" where it could) (`order`), and the provenance."""
    import numpy as np

    from parity.judge._mldtypes import to_raw

    raw: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    for j, (key, value) in enumerate(arrays.items()):
        # The dtype kept by the one codec (the golden store's): bfloat16 as uint16 and its name.
        raw[f"a{j}"], dtypes[key] = to_raw(value)
    np.savez(out / f"{name}.npz", **raw)  # pyright: ignore[reportArgumentType]
    manifest = {
        "keys": list(arrays),
        "dtypes": dtypes,
        **table.to_json_dict(),
        "order": order[0],
        "recorder": order[1],
        "provenance": provenance,
    }
    (out / f"{name}.json").write_text(json.dumps(manifest))


def _refusal(
    args: argparse.Namespace,
    groups: list[str],
    wanted: list[str],
    class_map: tuple[tuple[str, str], ...],
    out: Path,
) -> int | None:
    """What stops the run before any group runs, as its exit code (the reason written to
    OUT, typed for the launcher, and a line for the log): a wanted group the producers do
    not define, or (with `--check-classes`) a CLASS_MAP class parity cannot use."""
    unknown = [g for g in wanted if g not in groups]
    if unknown:
        # Typed for the launcher (`UnknownGroupsError`), a line for the log.
        (out / UNKNOWN_GROUPS).write_text(json.dumps({"unknown": unknown, "defined": groups}))
        _log(f"unknown group(s) {unknown}; the producers define {groups}")
        return EXIT_UNKNOWN_GROUP
    if args.check_classes:
        from parity.judge._tolerance import class_problem

        where = f"the producers' CLASS_MAP ({args.producers})"
        problems = [
            class_problem(str(c), f"{where}: the rule ({p!r}, {c!r})") for p, c in class_map
        ]
        if any(problems):
            (out / UNUSABLE_CLASSES).write_text(json.dumps([x for x in problems if x]))
            _log(f"{where} names a class parity cannot use")
            return EXIT_UNUSABLE_CLASS
    return None


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    _die_with_parent(args.parent_pid)
    place = _join_run()

    # The harness is the current tree's: import it before `--src` shadows the packages, so
    # that producers using `parity` (compile statistics, say) get it, while the subject
    # (everything else) comes from `--src`.
    collect_provenance = _import_harness()
    drop = {os.path.realpath(d) for d in args.drop_path}
    sys.path[:] = [e for e in sys.path if os.path.realpath(e or ".") not in drop]
    for root in reversed([args.src, *args.also_src]):
        sys.path.insert(0, os.path.realpath(root))

    import numpy as np

    before = set(sys.modules)  # what the producers import since is theirs (`packages`)
    try:
        spec = importlib.util.spec_from_file_location("parity_producers", args.producers)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["parity_producers"] = module
        spec.loader.exec_module(module)
    except Exception as exc:
        msg = _missing_symbol(exc, args.src, args.code)
        traceback.print_exc()
        if msg:
            _log(msg)
            return EXIT_MISSING_SYMBOL
        return EXIT_PRODUCER_FAILED
    groups: dict = module.GROUPS
    table = ProducersTable.of_module(module)  # the one reader of CLASS_MAP, STACK, RENAME
    wanted = [g for g in args.groups.split(",") if g] or list(groups)
    out = Path(args.out)
    refused = _refusal(args, list(groups), wanted, table.class_map, out)
    if refused is not None:
        return refused
    try:  # the producers' CONVERT, probed on the goldens' layout (never their values)
        layout = None if args.goldens_layout is None else Path(args.goldens_layout)
        write_conversions(module, layout, out, wanted)
    except ConvertError as e:
        _log(f"the producers' CONVERT cannot be used: {e}")
        return EXIT_PRODUCER_FAILED
    if args.class_map_only:
        table.write(out)
        return 0
    kept: dict[str, Kept] = {}
    for i, name in enumerate(wanted, 1):
        t0 = time.perf_counter()
        _log(f"[{i}/{len(wanted)}] {name}: {'recording' if args.record_origin else 'running'}")
        split: list[bool] = []
        try:
            # Producers may return any pytree: flattened to `{"a.b": array}` keys.
            from parity.judge._trees import flatten
            from parity.machinery._worker import sharded_over_processes, to_host

            def host(value: object, split: list[bool] = split) -> np.ndarray:
                split.append(sharded_over_processes(value))
                return to_host(value)

            order_source, recorder, arrays, kept[name] = run_group(
                name, groups[name], lambda r: flatten(r, to_array=host), args, place is None
            )
        except Exception as exc:
            traceback.print_exc()
            msg = _missing_symbol(exc, args.src, args.code)
            if msg:
                _log(f"group {name!r}: {msg}")
                return EXIT_MISSING_SYMBOL
            _log(f"group {name!r} raised {type(exc).__name__}: {exc}")
            return EXIT_PRODUCER_FAILED
        hosted = arrays
        if place is not None:
            disagree = _disagreement(hosted)
            if disagree:
                _log(f"group {name!r}: {disagree}")
                return EXIT_PRODUCER_FAILED
            if place.process_id != 0:  # process 0 saves; the others only had to take part
                _log(f"[{i}/{len(wanted)}] {name}: {len(arrays)} arrays, same as process 0")
                continue
        provenance = collect_provenance(before) if collect_provenance is not None else None
        _save_group(out, name, hosted, table, (order_source, recorder), provenance)
        _log(f"[{i}/{len(wanted)}] {name}: {len(arrays)} arrays in {time.perf_counter() - t0:.1f}s")
        if place is not None and place.processes > 1 and not any(split):
            # The run passes, but it tested nothing a single process does not: the
            # producer never split its work (inputs not sharded over the global mesh).
            _log(
                f"group {name!r}: no array was sharded across the {place.processes} processes; "
                "each process computed everything (see docs/adopting.md section 7)"
            )
    if place is not None:
        import jax

        jax.distributed.shutdown()
    elif args.keep:  # one process: record what the launcher asks for, until it is done
        serve(kept, out)
    return 0


def _exit(code: int) -> None:
    """Exit with `code`. A worker of a multi-process run that failed leaves at once
    (`os._exit`, after flushing its output): a plain exit runs jax's atexit
    `distributed.shutdown`, which waits for every other process at a shutdown barrier, so
    the failing worker would outlive the ones it left stuck in a collective, and the
    launcher would name one of them (a gloo timeout) instead of the worker that failed."""
    from parity.machinery._worker import worker_place

    if code and worker_place() is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    try:
        status = main()
    except Exception:  # an error outside any group (joining the run, say): still exit fast
        traceback.print_exc()
        status = EXIT_PRODUCER_FAILED
    _exit(status)
