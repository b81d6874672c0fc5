"""A verdict's basis is data (issue 57): how a key passed (proved op by op, by calibration)
is `Finding.basis`, set where the verdict is made and read by everything after it; no
verdict reads a finding's words, so rewording every note and reason changes none."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from parity._results import BaselineUnavailable
from parity.check._conclusion import inexact
from parity.judge._classes import REGISTRY
from parity.judge._compare import compare_arrays
from parity.judge._findings import Comparison, Finding
from parity.origin._proof import Proof, settle
from parity.report._jsondoc import to_json

A = np.linspace(-1, 1, 16, dtype=np.float32)
B = np.nextafter(A, np.float32(2))  # every element one ulp away


def _reworded(comparison: Comparison) -> Comparison:
    return Comparison(
        tuple(
            dataclasses.replace(f, note=f"reworded {n}", reason=f"reworded {n}" if f.reason else "")
            for n, f in enumerate(comparison.findings)
        )
    )


def _comparison() -> Comparison:
    """Three keys under `op_by_op`: equal, moved and proved, moved and not proved."""
    tol = REGISTRY["op_by_op"]
    found = (
        compare_arrays("same", A, A, tol),
        compare_arrays("proved", B, A, tol),
        compare_arrays("unproved", B, A, tol),
    )
    proofs = {"proved": Proof("proved", True), "unproved": Proof("unproved", False, "why not")}
    return settle(Comparison(found), proofs)


def test_a_proved_key_is_proved_by_its_basis_not_by_its_note() -> None:
    settled = _comparison()
    verdicts = [(f.key, f.verdict, f.basis) for f in settled.findings]
    assert verdicts == [
        ("same", "pass", ""),
        ("proved", "pass", "proved"),
        ("unproved", "fail", ""),
    ]
    reworded = _reworded(settled)
    assert [f.key for f in reworded.proved] == ["proved"]
    assert [(f.key, f.verdict, f.basis) for f in reworded.findings] == verdicts
    assert json.loads(json.dumps(to_json(reworded)))["proved"] == ["proved"]
    # and a note that merely says the words proves nothing
    posing = dataclasses.replace(settled.findings[0], note=settled.findings[1].note)
    assert Comparison((posing,)).proved == ()


def test_a_key_passed_by_calibration_is_told_by_its_basis_not_by_its_note() -> None:
    moved = compare_arrays("k", B, A, REGISTRY["fp32_reassoc"])
    assert moved.passed and not moved.bitwise_equal
    by_calibration = dataclasses.replace(moved, basis="calibration", note="reworded")
    posing = dataclasses.replace(
        compare_arrays("j", B, A, REGISTRY["fp32_reassoc"]),
        note="judged by calibration (isa=AVX): bitwise alone fails",
    )
    why = BaselineUnavailable("the baseline is off", "turn it on")
    said = inexact(Comparison((by_calibration, posing)), why, "the goldens")
    assert "1 key (k) failed their pinned class and passed by calibration alone" in said, said
    assert Comparison((by_calibration, posing)).by_calibration == (by_calibration,)


def test_the_basis_survives_the_json_round_trip() -> None:
    for f in _comparison().findings:
        assert Finding.from_dict(json.loads(json.dumps(f.to_dict()))) == f


def test_a_proof_replaces_its_clause_whole_however_the_reason_is_worded() -> None:
    """The clause about the proof is kept apart (`Finding.proof_clause`): settling replaces
    it, not words found in the reason, so a reworded reason and a second settling each
    leave one clause, the last one."""
    tol = REGISTRY["op_by_op"]
    found = compare_arrays("moved", B, A, tol)
    assert found.proof_clause and found.reason.endswith(found.proof_clause)
    reworded = dataclasses.replace(
        found, reason="reworded" + found.proof_clause, proof_clause=found.proof_clause
    )
    once = settle(Comparison((reworded,)), {"moved": Proof("moved", False, "first")})
    twice = settle(once, {"moved": Proof("moved", False, "second")})
    (f,) = twice.findings
    assert f.reason == "reworded; not proved op by op: second", f.reason
    assert f.reason.endswith(f.proof_clause)
