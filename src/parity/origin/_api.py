"""`localise(new_fn, old_fn, *args)`: the first operation of the new program that computes
what the old one never did, at its source line; `locate` does the same for two recordings
made apart (one of them, say, in another process at a base commit).

jax is imported only inside the recording (the caller has it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from parity.judge._classes import REGISTRY, ToleranceClass
from parity.judge._compare import Comparison, compare_trees
from parity.judge._converting import Conversion
from parity.judge._renames import Rename
from parity.judge._stacking import StackRule
from parity.judge._tolerance import (
    ClassMapLike,
    UnknownClassError,
    class_resolver,
    to_class,
)
from parity.origin._align import Alignment, align, matching_tolerance
from parity.origin._executables import Executables
from parity.origin._localisation import Localisation
from parity.origin._proof import (
    Proof,
    answering,
    provable,
    provable_up_to_rounding,
    prove,
    settle,
    upstream,
)
from parity.origin._record import LocaliseError, record
from parity.origin._recording import Recording
from parity.origin._replayed import Replay
from parity.origin._rounding_proof import RoundingProof

__all__ = [
    "PROFILE_BINS",
    "Settlement",
    "localise",
    "locate",
    "prove_and_locate",
]


def _first_failing_key(
    new: Recording,
    old: Recording,
    resolve: Callable[[str], str],
    registry: Mapping[str, ToleranceClass],
) -> str | None:
    both = [k for k in new.outputs if k in old.outputs]
    comparison = compare_trees(
        {k: new.output_arrays[k] for k in both},
        {k: old.output_arrays[k] for k in both},
        resolve,
        registry=registry,
        order=both,
    )
    first = comparison.first_failure
    return None if first is None else first.key


#: The most bins of the matched-share profile a localisation carries (for the HTML plot).
PROFILE_BINS = 120


def locate(
    new: Recording,
    old: Recording,
    *,
    class_map: ClassMapLike = "bitwise",
    registry: Mapping[str, ToleranceClass] = REGISTRY,
    key: str | None = None,
    root: str | Path | None = None,
    against: str = "the old program",
    exact: Alignment | None = None,
) -> Localisation:
    """The origin of the first output of `new` that breaks its class against `old`.

    **Arguments:**

    - `new`, `old`: recordings of the two programs on the same inputs (`record`,
      `record_programs`); `old` may be a summary (`Recording.summary()`, or read back with
      `Recording.from_arrays`).
    - `class_map`, `registry`: each output key's class: a class name for every key, or a
      `ClassMap` whose rules by key pattern come first (what a check's `overrides` are), by
      the precedence every check uses (`parity.judge._tolerance.class_resolver`).
    - `key`: the output to explain; default: the first in dataflow order that fails its
      class (keys present on both sides only).
    - `root`: paths in the origin are given relative to it when they lie under it.
    - `against`: what `old` is, for the lines (`"the base commit"`).
    - `exact`: `align(new, old, 0.0)`, where the caller has it.

    **Returns:** a `Localisation`: `named` with the `Origin` (among the values from which
    the failing output is reached through values that equal no value of `old` at all, the
    earliest that also breaks the class's matching tolerance and has an old value of its
    shape), the value the tolerance alone would name where that is another (`beyond`), and
    the matched share along the new program; `matched` where every value upstream of the
    failing output equals one of `old`'s bit for bit; `no_failure` where no output fails its class.
    A class that gives no matching tolerance (`logit_kl`, a calibrated class read without
    its golden) leaves the search at equality only (`reason` says why). Raises
    `LocaliseError` when the key is absent.
    """
    resolve = class_resolver(class_map=class_map)
    if key is None:
        key = _first_failing_key(new, old, resolve, registry)
        if key is None:
            return Localisation("no_failure", against=against)
    if key not in old.output_arrays:
        raise LocaliseError(f"the old program has no output {key!r}; it has {list(old.outputs)}")
    rho, note = _tolerance(resolve(key), registry, old.output_arrays[key])
    # At equality first: the values that equal no old value at all, from which the key is
    # reached through such values, hold where the code changed, however small the change;
    # a tolerance alone would let a change that a softmax squashes below it through, to be
    # named at a later operation that amplifies it. Among them the origin is the earliest
    # that also breaks the class's tolerance and has an old value of its shape (a changed
    # value, not one of a new kind such as a refactor's fused weight); a difference within
    # the tolerance (a refactor's reordered sum) is not it.
    exact = exact if exact is not None else align(new, old, 0.0)
    reached = exact.cone(key)
    if not reached:  # the key's value equals one of old's: proved, or why not
        return _matched(new, old, exact, key, root=root, against=against)
    loose = None if not rho else align(new, old, rho)
    computed = sorted(i for i in reached if new.values[i].kind in ("op", "move"))
    moved = [i for i in computed if loose is None or not loose.matched[i]]
    changed = next((i for i in moved if exact.has_old_peer(i)), None)
    if changed is not None:  # back through new kinds of values feeding it (a new scale)
        while fed := [
            j for j in new.values[changed].inputs if j in moved and not exact.has_old_peer(j)
        ]:
            changed = min(fed)
    first = changed if changed is not None else (moved or computed or sorted(reached))[0]
    # Back from where values first equal nothing to where they were first computed from
    # other data than the base's (issue 58: a changed key is named where it is made).
    origin = exact.describe(exact.edited(first), key, root=root)
    beyond = origin if loose is None else loose.origin(key, root=root)
    counted = np.array([v.kind != "input" for v in new.values])
    matched = exact.matched[counted].astype(np.float64)
    bins = np.array_split(matched, min(PROFILE_BINS, max(1, len(matched))))
    return Localisation(
        "named",
        origin=origin,
        key=key,
        against=against,
        rho=rho or 0.0,
        values=len(matched),
        profile=tuple(round(float(b.mean()), 4) if len(b) else 1.0 for b in bins),
        origin_at=round(int(counted[: origin.position].sum()) / max(1, len(matched)), 4),
        beyond=None if beyond is None or beyond.position == origin.position else beyond,
        within=beyond is None,
        reason=note,
    )


def _matched(
    new: Recording,
    old: Recording,
    exact: Alignment,
    key: str,
    *,
    root: str | Path | None,
    against: str,
) -> Localisation:
    """Output `key`'s own value equals one of `old`'s: `matched`, with why it is not proved
    where it is not (`parity.origin._proof`), or `named` at the key's own value where every
    value it reads equals `old`'s and it still is not `old`'s same key (it reads another)."""
    proof = prove(new, old, [key], against=against, exact=exact)[key]
    target = new.outputs[key]
    wired = (
        not proof.proved
        and target >= 0
        and bool(exact.matched[sorted(upstream(new, target))].all())
    )
    # A step removed or a read rewired: the output is a value the base computed, read
    # where its counterpart read another (issue 58), so the edit is named there.
    rewired = not proof.proved and target >= 0 and exact.change(target, root=root).kind == "edge"
    if not wired and not rewired:
        return Localisation("matched", key=key, against=against, proof=proof.reason)
    return Localisation(
        "named",
        origin=exact.describe(exact.edited(target), key, root=root),
        key=key,
        against=against,
        proof=(
            f"run op by op it equals a value {against} computed, not {against}'s {key}: "
            "the output reads another value"
        ),
    )


@dataclass(frozen=True)
class Settlement:
    """A failing comparison settled by the recordings of both programs (`prove_and_locate`).

    **Fields:** `comparison` (each `op_by_op` failure proved into a pass or told why not),
    `origin` (the origin of the first key still failing; None where none fails or nobody
    asked), `proofs` (by key, each proof made).
    """

    comparison: Comparison
    origin: Localisation | None
    proofs: Mapping[str, Proof]


def prove_and_locate(
    comparison: Comparison,
    new: Recording,
    old: Recording,
    *,
    registry: Mapping[str, ToleranceClass] = REGISTRY,
    root: str | Path | None = None,
    against: str = "the old program",
    origin: bool = True,
    stack: Sequence[StackRule] = (),
    rename: Sequence[Rename] = (),
    shadow: Replay | None = None,
    convert: Conversion | None = None,
) -> Settlement:
    """A failing comparison of two programs' compiled outputs, settled by their recordings:
    each failure under a class that proves (`op_by_op`) proved op by op or told why not
    (`parity.origin._proof`), then, where `origin` and a key still fails, the origin of the
    first (`locate`, under the class the comparison judged it by, from `registry`). One
    alignment serves both. With `stack` (`parity.judge._stacking`), a per-layer key is
    proved, and its origin named, as its row of the stacked output that holds it, and a
    stacked key as the rows a program holds per layer; with `rename`
    (`parity.judge._renames`), as the key under the name `new` gave it
    (`parity.origin._proof.answering`); with `convert` (the user's converter,
    `parity.judge._converting`), a golden key as the elements of `new`'s outputs the
    converter put it in. With `shadow` (the replay of `new` on `old`'s values,
    `parity.origin._shadow`, or its answers read back: `parity.origin._replayed`), a key of a
    class that proves up to rounding and is not proved op by op is proved up to rounding or
    told why not, and named at the shadow's origin.

    **Returns:** the `Settlement`.
    """
    keys = [f.key for f in comparison.findings]
    replayed = new
    new = answering(new, keys, stack=stack, rename=rename, convert=convert)
    old = answering(old, keys, stack=stack)
    exact = align(new, old, 0.0)
    provables = [f.key for f in comparison.findings if provable(f)]
    proofs = prove(new, old, provables, against=against, exact=exact)
    rounding = _up_to_rounding(comparison, proofs, shadow, replayed, root)
    proofs = proofs | {k: p for k, (p, _) in rounding.items()}
    comparison = settle(comparison, proofs)
    first, found = comparison.first_failure, None
    if origin and first is not None and first.key in rounding and shadow is not None:
        named = shadow.origin(replayed, rounding[first.key][1], root=root)
        if named is not None:  # where the replay on the base's values found it
            found = Localisation("named", origin=named, key=first.key, against=against)
    if origin and first is not None and found is None:  # under the class it was judged by
        if first.key not in new.outputs or first.key not in old.output_arrays:
            why = f"the recorded programs do not both output {first.key!r}"
            found = Localisation("not_named", key=first.key, reason=why)
        else:
            found = locate(
                new,
                old,
                class_map=first.class_name,
                registry=registry,
                key=first.key,
                root=root,
                against=against,
                exact=exact,
            )
    return Settlement(comparison, found, proofs)


def _up_to_rounding(
    comparison: Comparison,
    proofs: Mapping[str, Proof],
    shadow: Replay | None,
    new: Recording,
    root: str | Path | None,
) -> dict[str, tuple[Proof, RoundingProof]]:
    """Each failure of a class that proves up to rounding (`Rule.rounds`) not proved op by
    op, proved by the shadow replay or told why not (with the replay's own proof); without a
    replay, told that its proof needs one."""
    out: dict[str, tuple[Proof, RoundingProof]] = {}
    wanted = [
        f.key
        for f in comparison.findings
        if provable_up_to_rounding(f) and not (f.key in proofs and proofs[f.key].proved)
    ]
    if not wanted:
        return out
    if shadow is None:
        for k in wanted:
            why = "the new program was not replayed on the base's values"
            if k in proofs and proofs[k].reason:
                why += f"; op by op: {proofs[k].reason}"
            out[k] = (Proof(k, False, why, rounding=True), RoundingProof(k, False, why))
        return out
    for k, rp in shadow.proofs(new, wanted, root=root).items():
        how = rp.describe() if rp.proved else ""
        out[k] = (Proof(k, rp.proved, rp.reason, rp.exact, rounding=True, how=how), rp)
    return out


def _tolerance(
    class_name: str, registry: Mapping[str, ToleranceClass], old_output: Any
) -> tuple[float | None, str]:
    """The matching tolerance of a key's class, or None and why it gives none (a class that
    judges in another unit, `logit_kl`; one whose bound needs the golden's calibration):
    the origin is then looked for at equality only."""
    try:
        return matching_tolerance(to_class(class_name, registry), old_output), ""
    except LocaliseError as e:
        return None, e.reason
    except (UnknownClassError, ValueError) as e:
        return None, f"class {class_name!r} cannot be read here ({' '.join(str(e).split())})"


def localise(
    new_fn: Callable[..., Any],
    old_fn: Callable[..., Any],
    *args: Any,
    class_map: ClassMapLike = "bitwise",
    registry: Mapping[str, ToleranceClass] = REGISTRY,
    key: str | None = None,
    root: str | Path | None = None,
    **kwargs: Any,
) -> Localisation:
    """Name the first operation of `new_fn`'s program that computes a value `old_fn`'s
    program never computed, and its source line.

    Both programs are run equation by equation on the same arguments, every intermediate
    kept (scans unrolled); each value of the new program is matched by value against the
    old program's, within a tolerance derived from the class of the failing output
    (docs/design.md, "Where it diverged"). The origin is the earliest unmatched value from
    which the failing output is reached through unmatched values only.

    **Arguments:**

    - `new_fn`, `old_fn`: functions jax can trace, taking the same arguments and returning
      pytrees with the same keys (as `parity.judge._trees.flatten` names them; a bare array
      is `array`). Arguments that are not arrays must be closed over.
    - `args`, `kwargs`: what both are called with.
    - `class_map`, `registry`, `key`, `root`: as `locate`.

    **Returns:** a `Localisation` (`parity.Localisation`): `status` is `named` (its
    `origin`: `primitive`, `file`, `line`, `function`, `shape`, `max_diff`, `key`,
    `matched_fraction`, ...), `matched` (every value upstream of the failing output
    matched) or `no_failure` (every output holds its class when run op by op); `.line` is
    the one-line answer. Raises `LocaliseError` when a function does not trace.

    **Example:**

    ```python
    found = parity.localise(scanned_forward, unrolled_forward, params, tokens)
    assert found.status != "named", found.line
    ```
    """
    shared = Executables()  # an operation both sides run is compiled once
    new = record(new_fn, *args, executables=shared, **kwargs)
    old = record(old_fn, *args, executables=shared, **kwargs)
    return locate(new, old, class_map=class_map, registry=registry, key=key, root=root)
