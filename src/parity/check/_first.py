"""A golden check's first stage: the tree compared with its goldens, once, before any
baseline (`first_verdict`, making a `FirstVerdict`): the classes resolved, the environment
difference decided, the drift policy applied; and the one comparison every check makes, of
a golden file, of two files or of two live trees (`flatten_sides`, then `compare_flat`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parity._environment import environment_difference
from parity._results import CheckError
from parity.calibrated._bounds import KeyClasses, golden_classes
from parity.check._request import BaselineRequest, CheckRequest, Registries
from parity.judge._chunks import DEFAULT_BUDGET
from parity.judge._classes import ToleranceClass
from parity.judge._compare import Comparison, Order, compare_trees
from parity.judge._converting import annotated, concatenation_offer
from parity.judge._dataflow import DATAFLOW, HOST
from parity.judge._renames import parse_renames, renamed, renaming_offer
from parity.judge._stacking import join_rows, parse_stack, split_stacked, stacking_offer
from parity.judge._tolerance import KeyClass, UnknownClassError, UnmatchedKeyError
from parity.judge._trees import flatten
from parity.store import GoldenFile, GoldenStoreError, Provenance

if TYPE_CHECKING:
    from parity._environment import EnvironmentDifference

__all__ = ["FirstVerdict", "compare_flat", "first_verdict", "flatten_sides"]


def flatten_sides(
    actual: Any,
    expected: Any,
    name: str,
    *,
    bare: str | None = None,
    non_arrays: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both sides of a check as flat `{key: array}` (`parity.judge._trees.flatten`); with
    `non_arrays`, two dicts that receive each side's leaves that are not arrays. Raises
    `CheckError` for a tree it cannot flatten (an object array)."""
    statics_a, statics_e = non_arrays if non_arrays is not None else (None, None)
    try:
        flat_a = flatten(actual, non_arrays=statics_a, bare=bare)
        flat_e = flatten(expected, non_arrays=statics_e, bare=bare)
    except (TypeError, ValueError) as e:
        raise CheckError(f"check {name!r}: {e}") from None
    return flat_a, flat_e


def compare_flat(
    flat_a: Mapping[str, Any],
    flat_e: Mapping[str, Any],
    classes: Callable[[str], KeyClass],
    *,
    registry: Mapping[str, ToleranceClass],
    order: Order | None,
    name: str,
    reference: str = "golden",
    budget: int = DEFAULT_BUDGET,
) -> Comparison:
    """The one comparison every check makes (of a golden file, of two files, of two live
    trees): every key of both flat sides under its class, in the forward order. Raises
    `CheckError` for input it cannot compare (an unknown class, a key without one)."""
    try:
        comparison = compare_trees(
            flat_a,
            flat_e,
            classes,
            registry=registry,
            order=order,
            budget=budget,
            reference=reference,
        )
    except (TypeError, UnknownClassError, UnmatchedKeyError) as e:
        raise CheckError(f"check {name!r}: {e}") from None
    return _offer_as_one(comparison)


def _offer_as_one(comparison: Comparison) -> Comparison:
    """`comparison` with each missing key that is a row of a new key (stacked on a leading
    axis, `parity.judge._stacking.stacking_offer`), or whose rows are new keys (the
    reverse), or that is part of a new key holding it and its siblings concatenated
    (`parity.judge._converting.concatenation_offer`), or that a new key of its shape and dtype
    seems to replace under another prefix (`parity.judge._renames.renaming_offer`), saying
    so, and the rule that would compare them as one."""
    missing = {
        f.key: (f.shape_expected or (), f.dtype_expected or "")
        for f in comparison.findings
        if f.verdict == "missing"
    }
    new = {
        f.key: (f.shape_actual or (), f.dtype_actual or "")
        for f in comparison.findings
        if f.verdict == "unexpected"
    }
    if not missing or not new:
        return comparison
    stacked = stacking_offer(list(missing), {k: shape for k, (shape, _) in new.items()})
    # The reverse: missing stacked keys whose rows are new per-layer keys.
    rows: dict[str, list[str]] = {}
    unstacked = stacking_offer(list(new), {k: shape for k, (shape, _) in missing.items()})
    for row_key, (_, key, _) in sorted(unstacked.items(), key=lambda kv: kv[1][2]):
        rows.setdefault(key, []).append(row_key)
    taken = stacked.keys() | rows.keys()
    fused = concatenation_offer({k: v for k, v in missing.items() if k not in taken}, new)
    taken |= fused.keys()
    moved = renaming_offer({k: v for k, v in missing.items() if k not in taken}, new)
    if not stacked and not rows and not moved and not fused:
        return comparison
    rules = {t for t, _, _ in stacked.values()} | {t for t, _, _ in unstacked.values()}
    templates = ", ".join(repr(t) for t in sorted(rules))
    prefixes = ", ".join(
        repr(f"{o}={n}") for o, n in sorted({(o, n) for o, n, _ in moved.values()})
    )
    findings = []
    for f in comparison.findings:
        if f.key in stacked:
            _, key, row = stacked[f.key]
            f = dataclasses.replace(
                f,
                reason=f"{f.reason}; it is row {row} of the new key {key!r} (the layers "
                f"stacked): compare them as one with stack = [{templates}] (the producers' "
                "STACK, or stack= of the check)",
            )
        elif f.key in rows:
            held = rows[f.key]
            f = dataclasses.replace(
                f,
                reason=f"{f.reason}; its rows are the new keys {held[0]!r} ... {held[-1]!r} "
                f"(the layers per layer again): compare them as one with stack = "
                f"[{templates}] (the producers' STACK, or stack= of the check)",
            )
        elif f.key in fused:
            key, axis = fused[f.key]
            f = dataclasses.replace(
                f,
                reason=f"{f.reason}; its elements are part of the new key {key!r} (by "
                f"shapes: the missing keys concatenated on axis {axis}): compare them as one "
                "through the function that converts an old checkpoint into the new layout "
                "(the producers' CONVERT = {group: function}, or convert= of "
                "assert_equivalent)",
            )
        elif f.key in moved:
            f = dataclasses.replace(
                f,
                reason=f"{f.reason}; the new key {moved[f.key][2]!r} (its shape and dtype) "
                f"seems to replace it: compare them as one with rename = [{prefixes}] (the "
                "producers' RENAME, or rename= of the check)",
            )
        findings.append(f)
    return dataclasses.replace(comparison, findings=tuple(findings))


@dataclass(frozen=True, kw_only=True)
class FirstVerdict:
    """A golden check's first verdict: the tree compared with its goldens, once, before any
    baseline (`first_verdict`); `parity.check._conclusion.conclude` turns it into the
    `CheckResult`.

    **Fields:** `gf` (the golden file), `current` (the provenance `actual` was produced
    in), `difference` (how it differs from the pin's, decided once), `classes` (the classes
    of the golden's keys), `keys` (the golden keys checked), `flat_a` (`actual`, flattened
    once: every later judgement reads it), `forward` (the forward order), `comparison`
    (against the goldens, under the drift policy's classes), `registries`, `request` (what
    the check was asked), `started`, `load_s`, `compare_s` (timing), `order_source`
    (`dataflow` where `forward` was read from the programs that produced `flat_a`, `host`
    where no jax program computed them, else None: the golden's pinned order).
    """

    gf: GoldenFile
    current: Provenance
    difference: EnvironmentDifference
    classes: KeyClasses
    keys: tuple[str, ...]
    flat_a: dict[str, Any]
    forward: Order
    comparison: Comparison
    registries: Registries
    request: CheckRequest
    started: float
    load_s: float
    compare_s: float
    order_source: str | None = None

    @property
    def group(self) -> str:
        """The golden group (the file's name)."""
        return self.gf.path.stem

    @property
    def name(self) -> str:
        """The check's name in reports: the one asked for, else the group."""
        return self.request.name or self.group

    @property
    def wants_baseline(self) -> bool:
        """Whether the baseline should be the reference: on another backend than the pin's,
        always (the goldens' noise is no ruler there); else where the environment differs
        from the pin's in a way that can move bits and some key fails its pinned class."""
        if self.difference.across_backends:
            return True
        return self.difference.moves_bits and not self.comparison.passed

    def baseline_request(self) -> BaselineRequest:
        """What re-produces this group's baseline: `(group, pinned provenance, current)`."""
        return self.group, self.gf.provenance, self.current


def first_verdict(actual: Any, gf: GoldenFile, request: CheckRequest) -> FirstVerdict:
    """`actual` compared with the golden file `gf`, before any baseline: the classes
    resolved, the environment difference decided, the drift policy applied, the one
    comparison made, as `request` asks (`check_file`'s options; `request.dataflow_order`,
    where `actual`'s order was read from the programs that computed it, is its forward
    order, before the golden's pinned one). Whether a baseline is wanted is
    `FirstVerdict.wants_baseline`. Raises `CheckError` for unusable input."""
    started = time.time()
    t0 = time.perf_counter()
    group, order = gf.path.stem, request.order
    try:
        chosen = None if request.keys is None else set(request.keys)
        wanted = [k for k in gf if chosen is None or k in chosen]
        # Sources, not arrays: each is read in chunks when compared, checksum verified.
        golden_arrays = {k: (request.golden_source or gf.source)(k) for k in wanted}
        classes = golden_classes(
            gf,
            overrides=request.overrides,
            class_map=request.class_map,
            keys=wanted,
            registry=request.registry,
        )
        placed = gf.ordered_keys()
    except GoldenStoreError as e:
        raise CheckError(f"golden group {group!r} is unusable: {e}") from None
    difference = request.difference
    if difference is None:
        difference = environment_difference(gf.provenance, request.current)
    decision = difference.policy(request.drift_mode)
    if decision.refused:
        raise CheckError(" ".join(decision.header))
    registries = Registries.under(decision, request.registry)
    for key in golden_arrays:
        classes.bound(key)  # a calibrated key without a recorded spread is an error first
    load_s = time.perf_counter() - t0
    forward: Order = [k for k in placed if k in golden_arrays] if order is None else order
    if order is None and request.dataflow_order is not None:
        # Produced in an order read from the programs that computed it: that order, finer
        # than a declared one pinned in the golden.
        mine = [k for k in request.dataflow_order if k in golden_arrays]
        forward = mine + [k for k in placed if k in golden_arrays and k not in set(mine)]
    t0 = time.perf_counter()
    name = request.name or group
    flat_a, flat_e = flatten_sides(actual, golden_arrays, name)
    try:
        rules, renames = parse_stack(request.stack), parse_renames(request.rename)
    except ValueError as e:
        raise CheckError(f"check {name!r}: {e}") from None
    # A moved key of the tree is compared with the golden it replaces; a stacked one row by
    # row with the per-layer goldens it replaces, and per-layer ones joined into the
    # stacked golden they are the rows of.
    # Read through the producers' converter, the tree is in the goldens' layout: each golden
    # key rebuilt from the elements the converter put its elements in.
    if request.convert is not None:
        flat_a = request.convert.to_expected_layout(flat_a)
    flat_a = renamed(flat_a, flat_e, renames)
    flat_a = join_rows(split_stacked(flat_a, flat_e, rules), flat_e, rules)
    try:
        comparison = compare_flat(
            flat_a,
            flat_e,
            classes.bound,
            registry=registries.policy,
            order=forward,
            name=name,
            budget=request.budget,
        )
    except GoldenStoreError as e:
        raise CheckError(f"golden group {group!r} is unusable: {e}") from None
    if request.convert is not None:
        comparison = annotated(comparison, request.convert)
    compare_s = time.perf_counter() - t0
    source = DATAFLOW if request.dataflow_order is not None else None
    return FirstVerdict(
        gf=gf,
        current=request.current,
        difference=difference,
        classes=classes,
        keys=tuple(golden_arrays),
        flat_a=flat_a,
        forward=forward,
        comparison=comparison,
        registries=registries,
        request=request,
        started=started,
        load_s=load_s,
        compare_s=compare_s,
        order_source=source or (HOST if request.host_computed else None),
    )
