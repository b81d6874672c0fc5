"""The one door every face settles a failing comparison through (issue 72,
`parity.origin._settling.settle_by`): what it asks of a face's sides, in which order, and
what it makes of a side that could not be recorded, said once for every face."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from parity.judge._compare import Comparison, compare_trees
from parity.origin import record
from parity.origin._hunks import Diff, sources_diff
from parity.origin._recording import Recording
from parity.origin._settling import LiveSides, NotRecorded, Pair, Rules, settle_by

X = jnp.linspace(-1.0, 1.0, 48, dtype=jnp.float32).reshape(6, 8)


def old(x: Any) -> Any:
    return {"h": jnp.tanh(x) * 2.0, "y": jnp.sum(jnp.tanh(x) * 2.0, axis=1)}


def bug(x: Any) -> Any:  # a changed constant: every output moves
    return {"h": jnp.tanh(x) * 2.5, "y": jnp.sum(jnp.tanh(x) * 2.5, axis=1)}


def _failing(cls: str) -> Comparison:
    comparison = compare_trees(
        jax.tree.map(np.asarray, bug(X)), jax.tree.map(np.asarray, old(X)), class_map=cls
    )
    assert not comparison.passed, "the bug moved nothing: the test proves nothing"
    return comparison


@dataclass
class _Sides:
    """A face's sides that say what the door asked of them, and when."""

    pairs: Mapping[str, Pair]
    refused: Mapping[str, NotRecorded] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    against: str = "the fake base"
    root: Path | None = None

    def refuse(self, names: Sequence[str]) -> Mapping[str, NotRecorded]:
        self.events.append(f"refuse {sorted(names)}")
        return {n: why for n, why in self.refused.items() if n in names}

    def record(self, wanted: Mapping[str, Sequence[str]]) -> Iterator[tuple[str, Pair]]:
        self.events.append(f"record {sorted(wanted)}")
        for name in wanted:
            self.events.append(f"made {name}")
            yield name, self.pairs[name]

    def diff(self, name: str) -> Diff | None:
        self.events.append(f"diff {name}")
        return sources_diff(bug, old)  # the two functions' own lines stand in for a commit's


def test_a_face_that_can_record_gets_its_proofs_and_origin_and_a_refused_one_costs_no_run() -> None:
    new_rec, old_rec = record(bug, X), record(old, X)
    failing = {"a": _failing("op_by_op"), "b": _failing("op_by_op"), "c": _failing("bitwise")}
    sides = _Sides(
        pairs={"a": Pair(new_rec, old_rec), "b": Pair(new_rec, old_rec)},
        refused={"c": NotRecorded("numpy computed it on the host")},
    )
    done = settle_by(failing, sides)
    # Refused before any recording; the rest recorded once, each pair settled as it came;
    # the diff asked only of those whose origin was named.
    assert sides.events == [
        "refuse ['a', 'b', 'c']", "record ['a', 'b']", "made a", "made b", "diff a", "diff b",
    ]  # fmt: skip
    constant = next(n for n, t in enumerate(Path(__file__).read_text().splitlines(), 1)
                    if t.startswith("    return") and "* 2.5" in t)  # fmt: skip
    for name in ("a", "b"):
        origin = done[name].origin
        assert origin is not None and origin.origin is not None, origin
        assert origin.origin.primitive == "mul" and origin.against == "the fake base"
        # The edit: the two functions' differing lines, which the operation runs on (the
        # functions' names differ, so no operation of the base's pairs with it by place).
        edit = origin.edit
        assert edit is not None and edit.evidence == "frame", origin.line
        assert [h.holds(constant) for h in edit.hunks] == [True], edit
        assert f"it holds {__file__}:{constant} in bug" in origin.line, origin.line
        assert {f.key: f.verdict for f in done[name].comparison.findings} == {
            "h": "fail",
            "y": "fail",
        }
        assert all(not p.proved for p in done[name].proofs.values())
    refused = done["c"].origin
    assert refused is not None and refused.status == "not_named"
    assert refused.line == "origin: not named: numpy computed it on the host"
    assert refused.key == done["c"].comparison.first_failure.key  # type: ignore[union-attr]


def test_a_side_not_recorded_leaves_the_keys_unproved_for_its_reason_with_its_traceback() -> None:
    why = NotRecorded("recording raised ValueError in the operation mul at m.py:3", "Traceback")
    done = settle_by({"g": _failing("op_by_op")}, _Sides({"g": Pair(record(bug, X), why)}))["g"]
    assert done.origin is not None and done.origin.traceback == "Traceback"
    assert done.origin.reason == why.reason
    for f in done.comparison.findings:
        assert f.verdict == "fail" and why.reason in f.reason, f.reason
    assert {k: p.reason for k, p in done.proofs.items()} == dict.fromkeys(["h", "y"], why.reason)


def test_what_recording_cannot_change_is_never_recorded() -> None:
    """A passing comparison, and a failing one with nothing to prove where no origin is
    asked, reach no side at all."""
    passing = compare_trees({"h": np.ones(3)}, {"h": np.ones(3)}, class_map="bitwise")
    sides = _Sides({})
    assert settle_by({"p": passing}, sides) == {}
    assert settle_by({"b": _failing("bitwise")}, sides, origin=False) == {}
    assert sides.events == []


def test_live_sides_record_both_functions_once_and_prove_a_reorder_up_to_rounding() -> None:
    """`assert_equivalent`'s sides: the old function first, the new one replayed on its
    values where a key is to be proved up to rounding; a function that cannot be recorded
    is said with the operation and its traceback."""
    x = jax.random.normal(jax.random.PRNGKey(0), (64, 64))

    def whole(a: Any) -> Any:
        return {"y": a @ a}

    def halves(a: Any) -> Any:  # the same products, summed in two halves
        return {"y": a[:, :32] @ a[:32] + a[:, 32:] @ a[32:]}

    comparison = compare_trees(halves(x), whole(x), class_map="up_to_rounding")
    assert not comparison.passed, "the halves summed moved no bit: the test proves nothing"
    pairs = list(LiveSides(halves, whole, (x,)).record({"a": ["y"], "b": ["y"]}))
    assert [n for n, _ in pairs] == ["a", "b"] and pairs[0][1].new is pairs[1][1].new  # once
    assert isinstance(pairs[0][1].new, Recording) and pairs[0][1].shadow is not None
    done = settle_by({"a": comparison}, LiveSides(halves, whole, (x,)), rules=Rules())["a"]
    assert done.comparison.passed, done.comparison.findings[0].reason
    assert done.proofs["y"].rounding and done.proofs["y"].proved

    def raises(a: Any) -> Any:
        return {"y": jax.pure_callback(_refuse, jax.ShapeDtypeStruct(a.shape, a.dtype), a)}

    failed = settle_by({"a": comparison}, LiveSides(raises, whole, (x,)))["a"]
    assert failed.origin is not None and failed.origin.status == "not_named"
    reason = failed.origin.reason
    assert "in the operation pure_callback at " in reason and "refuses to run" in reason, reason
    assert "refuses to run alone" in failed.origin.traceback, failed.origin.traceback
    assert "refuses to run alone" in failed.comparison.findings[0].reason


def _refuse(a: Any) -> Any:
    raise RuntimeError("this callback refuses to run alone")
