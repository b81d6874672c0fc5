"""Proved op by op: a key whose compiled bits differ from the old program's passes where
both programs, recorded operation by operation on the same inputs, compute it the same way
(docs/design.md, "Proved op by op").

Run op by op, each operation is computed on its own, from the values the program gives
it: what XLA's compilation reassociated (a fusion, a GEMM's blocking, a scan for an
unrolled loop) is gone, and what remains is the arithmetic the code asks for. A key is
*proved* when every value from which the new program computes it (its inputs included)
equals, bit for bit, a value of the old program's (`align` at `rho` 0), and the key's own
value equals the old program's value of the same key: a key wired to another value (a tap
that reads the wrong site) equals some old value but not its own, and is never proved.

`prove` judges keys between two recordings; `settle` turns a comparison's failures under a
class that proves (`parity.judge._fixed_rules.OpByOp`) into passes or into failures that
say why they were not proved.

This module imports numpy, the judge and `parity.origin._align` only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from parity.judge._converting import Conversion
from parity.judge._findings import PROVED, Comparison, Finding, compiled_difference
from parity.judge._floats import count
from parity.judge._registry import RULES
from parity.judge._renames import Rename
from parity.judge._stacking import StackRule, row_of, rows_held
from parity.origin._align import Alignment, align
from parity.origin._fingerprints import value_fingerprints
from parity.origin._recording import Recording, Value
from parity.origin._stored import Appended

__all__ = [
    "Proof",
    "answering",
    "provable",
    "provable_up_to_rounding",
    "prove",
    "proved_note",
    "settle",
    "unproved",
    "upstream",
]


@dataclass(frozen=True)
class Proof:
    """Whether one key was proved op by op.

    **Fields:** `key`; `proved`; `reason`, why not, in one line (`""` when proved);
    `values`, how many values upstream of the key (its own included) were found equal;
    `rounding`, whether it is a proof up to rounding (by the shadow replay,
    `parity.origin._shadow`) rather than op by op; `how`, for a proof up to rounding, what
    it rests on (`RoundingProof.describe`).
    """

    key: str
    proved: bool
    reason: str = ""
    values: int = 0
    rounding: bool = False
    how: str = ""

    @property
    def words(self) -> str:
        """How it was proved or not, for the lines: "op by op" or "up to rounding"."""
        return "up to rounding" if self.rounding else "op by op"


def provable(finding: Finding) -> bool:
    """Whether `finding` is a failure a proof op by op may turn into a pass: an array
    compared element by element (not absent, not another shape or dtype) under a class
    whose rule proves (`Rule.proves`)."""
    rule = RULES.get(finding.rule or "")
    return (
        finding.verdict == "fail"
        and rule is not None
        and rule.proves
        and finding.n_differ is not None
    )


def provable_up_to_rounding(finding: Finding) -> bool:
    """Whether `finding` is `provable` under a rule that goes on, where op by op fails, to
    a proof up to rounding (`Rule.rounds`: `up_to_rounding`)."""
    rule = RULES.get(finding.rule or "")
    return provable(finding) and rule is not None and rule.rounds


def upstream(new: Recording, target: int) -> set[int]:
    """`target` and every value it is computed from."""
    seen, todo = {target}, [target]
    while todo:
        for i in new.values[todo.pop()].inputs:
            if i not in seen:
                seen.add(i)
                todo.append(i)
    return seen


def answering(
    new: Recording,
    keys: Iterable[str],
    *,
    stack: Sequence[StackRule] = (),
    rename: Sequence[Rename] = (),
    convert: Conversion | None = None,
) -> Recording:
    """`new` with each of `keys` it does not output under that name answered by what holds
    it: the key's new name (`rename`); the stacked output whose row it is (`stack`: the
    key's value is that row, its value id the stacked output's, so what it is computed from
    is what the whole stack is computed from); for a stacked key whose rows `new` outputs
    per layer, a value added to `new` that stacks them (a data movement, kind `move`,
    primitive `stack`, with no source line); or, for a golden key the user's converter
    places in `new`'s outputs (`convert`, `parity.judge._converting`), a value added that
    gathers its elements from them (kind `move`, primitive `convert`). An alignment of
    `new` serves the answer where no value was added."""
    outputs, arrays = dict(new.outputs), dict(new.output_arrays)
    added: list[tuple[Value, np.ndarray]] = []
    converted: dict[str, np.ndarray] | None = None
    for key in keys:
        if key in outputs:
            continue
        names = (r.new_name(key) for r in rename)
        name = next((n for n in names if n is not None and n in new.outputs), key)
        found = (name, None) if name in new.outputs else row_of(name, new.outputs, stack)
        if found is not None and found[0] in new.output_arrays:
            held, row = found
            outputs[key] = new.outputs[held]
            whole = np.asarray(new.output_arrays[held])
            arrays[key] = whole if row is None else whole[row]
            continue
        rows = rows_held(name, new.outputs, stack)
        held = [] if convert is None else convert.feeding(key)
        if rows and all(new.outputs[r] >= 0 and r in new.output_arrays for r in rows):
            joined = np.stack([np.asarray(new.output_arrays[r]) for r in rows])
            ids = tuple(new.outputs[r] for r in rows)
            value = Value(len(new.values) + len(added), "stack", "move", joined.shape,
                          str(joined.dtype), ids)  # fmt: skip
            added.append((value, joined))
            outputs[key], arrays[key] = value.id, joined
        elif (
            convert is not None
            and held
            and all(new.outputs.get(k, -1) >= 0 and k in new.output_arrays for k in held)
        ):
            if converted is None:  # every golden key the outputs hold, rebuilt once
                placed = {
                    k: np.asarray(v) for k, v in new.output_arrays.items() if k in convert.maps
                }
                converted = convert.to_expected_layout(placed)
            gathered = converted.get(key)
            if gathered is None:  # the outputs are not of the converter's shapes
                continue
            ids = tuple(new.outputs[k] for k in held)
            value = Value(len(new.values) + len(added), "convert", "move", gathered.shape,
                          str(gathered.dtype), ids)  # fmt: skip
            added.append((value, gathered))
            outputs[key], arrays[key] = value.id, gathered
    if len(outputs) == len(new.outputs):
        return new
    prints = [value_fingerprints(a) for _, a in added]  # a value's and its rows', in one pass
    return dataclasses.replace(
        new,
        values=(*new.values, *(v for v, _ in added)),
        fingerprints=(*new.fingerprints, *(whole for whole, _ in prints)),
        rows={
            **new.rows,
            **{v.id: rows for (v, _), (_, rows) in zip(added, prints, strict=True) if rows},
        },
        outputs=outputs,
        output_arrays=arrays,
        arrays=None if new.arrays is None else Appended(new.arrays, [a for _, a in added]),
    )


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def prove(
    new: Recording,
    old: Recording,
    keys: Iterable[str],
    *,
    against: str = "the old program",
    exact: Alignment | None = None,
    stack: Sequence[StackRule] = (),
    rename: Sequence[Rename] = (),
) -> dict[str, Proof]:
    """Prove `keys` of `new` against `old`, op by op (module docstring).

    **Arguments:**

    - `new`, `old`: recordings of both programs on the same inputs (`record`,
      `record_programs`); `old` may be a summary (equality is then read from each value's
      digest of its bytes).
    - `keys`: output keys of `new`.
    - `against`: what `old` is, for the reasons (`"the base commit"`).
    - `exact`: `align(new, old, 0.0)` where the caller has it (of the recordings as
      `answering` gives them; another is not used).
    - `stack`: stack rules (`parity.judge._stacking`): a per-layer key either program does
      not output is its row of the stacked output that holds it, and a stacked key the
      rows it holds per layer (`answering`).
    - `rename`: rename rules (`parity.judge._renames`): a key `new` outputs under its new
      name is proved under the name `old` gave it.

    **Returns:** key -> its `Proof`.
    """
    keys = list(keys)
    new = answering(new, keys, stack=stack, rename=rename)
    old = answering(old, keys, stack=stack)
    if exact is None or exact.new is not new or exact.old is not old:
        exact = align(new, old, 0.0)  # an alignment of the recordings as answered
    out: dict[str, Proof] = {}
    for key in keys:
        if key not in new.outputs or key not in old.output_arrays:
            why = f"the recorded programs do not both output {key!r}"
            out[key] = Proof(key, False, why)
            continue
        target = new.outputs[key]
        reads = upstream(new, target) if target >= 0 else set()
        unequal = sorted(i for i in reads if not exact.matched[i])
        if unequal:
            v = new.values[unequal[0]]
            where = f"{v.file}:{v.line} in {v.function}" if v.file else "<no source>"
            out[key] = Proof(
                key,
                False,
                (
                    f"run op by op, {count(len(unequal), 'value')} it is computed from "
                    f"{'equals' if len(unequal) == 1 else 'equal'} no value of {against}'s; the "
                    f"first is {v.primitive} at {where}"
                ),
                len(reads) - len(unequal),
            )
        elif not _same(np.asarray(new.output_arrays[key]), np.asarray(old.output_arrays[key])):
            out[key] = Proof(
                key,
                False,
                (
                    f"run op by op, every value it is computed from equals one of {against}'s, "
                    f"yet it is not {against}'s {key} (it reads another value)"
                ),
                len(reads),
            )
        else:
            out[key] = Proof(key, True, "", len(reads))
    return out


def proved_note(finding: Finding, how: str = "") -> str:
    """The note a proved key carries: how it was proved where not op by op (`how`), and
    how far its compiled values moved."""
    return f"{how or PROVED}; {compiled_difference(finding)}"


def settle(comparison: Comparison, proofs: Mapping[str, Proof]) -> Comparison:
    """`comparison` with each `provable` failure whose key `proofs` holds settled: a pass
    with `proved_note`, or a failure whose reason ends with why it was not proved."""
    findings = []
    for f in comparison.findings:
        proof = proofs.get(f.key)
        if proof is not None and provable(f):
            if proof.proved:
                f = dataclasses.replace(
                    f,
                    verdict="pass",
                    reason="",
                    n_violating=0,
                    note=proved_note(f, proof.how),
                    basis="rounding" if proof.rounding else "proved",
                    proof_clause="",
                )
            else:  # the clause about the proof replaced whole (it is kept apart)
                reason = f.reason[: len(f.reason) - len(f.proof_clause)]
                clause = f"; not proved {proof.words}: {proof.reason}"
                f = dataclasses.replace(f, reason=reason + clause, proof_clause=clause)
        findings.append(f)
    return dataclasses.replace(comparison, findings=tuple(findings))


def unproved(comparison: Comparison, reason: str) -> dict[str, Proof]:
    """A failed `Proof` for each `provable` failure of `comparison`, all for one `reason`
    (the programs could not be recorded, the base cannot be re-produced)."""
    return {f.key: Proof(f.key, False, reason) for f in comparison.findings if provable(f)}
