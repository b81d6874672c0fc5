"""Every golden group: produce on the current code, check under the pinned classes.

The goldens are pinned on 1 device. On 4 devices and on 2 processes x 2 devices the same
pinned class maps judge them: `parity.check` knows the pin's environment from the golden's
provenance, and where the layout differs it judges each key by the looser of its pinned
class and its calibrated bound for that layout (the spread `parity calibrate --write`
recorded: goldens/README.md, "Calibration"). The persistent sources stay bitwise on 4
devices, on every addressable shard: the group check compares the assembled arrays,
`test_sources_match_their_goldens_on_every_shard` each shard against the slice of the golden
it holds (so the golden file stays the same whatever the device count).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from producers import GROUPS, TRAIN_STEPS, branches_config, sources_arrays


def _group_param(group: str) -> object:
    """Each remat trajectory runs on the xdist worker of its live differential against the
    per-site step (`test_live.py`), which reads the same per-process cached trajectory
    (`producers.train_group`) instead of compiling the step again; `train_remat_nothing`'s
    worker also runs the remat modes' agreement (`test_remat.py`), which loads the program
    from the persistent compilation cache, and `eval` runs beside the eval step's live
    differential. The groups that compile a train or eval step are `slow` (scheduled first:
    tests/conftest.py)."""
    if group in ("train_remat_nothing", "train_remat_dots"):
        marks = [pytest.mark.xdist_group(f"trajectory.{group}"), pytest.mark.slow]
        return pytest.param(group, marks=marks)
    if group == "train_branches":
        return pytest.param(group, marks=pytest.mark.slow)
    if group == "eval":
        # On the worker of the live differential of the eval step (`test_live.py`), which
        # compiles the same stacked eval step: there it is a hit in the compilation cache
        # instead of a second compile on the other worker.
        return pytest.param(group, marks=[pytest.mark.xdist_group("eval"), pytest.mark.slow])
    if group == "compile_budget":
        # Its programs are built on a 1-device mesh whatever the process's device count
        # (tools/compile_entries.py), and calibration measured zero spread at 4 devices and
        # at 2x2: another layout compiles and measures the same programs again.
        return pytest.param(group, marks=[pytest.mark.slow, pytest.mark.one_layout])
    return group


@pytest.mark.parametrize("group", [_group_param(g) for g in GROUPS])
def test_group_matches_its_goldens(group, parity_check):
    t0 = time.perf_counter()
    actual = GROUPS[group]()
    parity_check(actual, group, produce_s=time.perf_counter() - t0)


def test_every_golden_file_has_a_producer(parity_goldens):
    orphans = [g for g in parity_goldens.groups() if g not in GROUPS]
    assert not orphans, (
        f"golden files {orphans} in {parity_goldens.path} have no producer group in "
        f"tests/equivalence/producers.py (producers define {sorted(GROUPS)}); delete them or "
        "restore their producers, then repin: python tools/repin_goldens.py --base <SHA>"
    )


def test_sources_match_their_goldens_on_every_shard(parity_check, parity_goldens):
    gf = parity_goldens.open("sources")
    arrays = sources_arrays()
    assert sorted(arrays) == sorted(gf), "the sources producer and its golden disagree on keys"
    actual, reference = {}, {}
    for key, array in arrays.items():
        for i, shard in enumerate(array.addressable_shards):
            actual[f"{key}.shard{i}"] = np.asarray(shard.data)
            reference[f"{key}.shard{i}"] = np.asarray(gf[key])[shard.index]
    parity_check(actual, reference, name="sources.every_shard", class_map="bitwise")


def test_the_branches_trajectory_takes_every_branch(parity_goldens):
    """Read from the pinned file: gradient clipping is active in some step (pre-clip norm
    above the threshold) and idle in another, the importance exponent is strictly between
    its ends in some step, and PGD moved a source by more than one Adam step can (`pgd_lr`)
    in every step, so it took more than one ascent step."""
    gf = parity_goldens.open("train_branches")
    spd = branches_config()

    def at(step: int, name: str) -> float:
        return float(np.asarray(gf[f"traj.branches.step{step}.{name}"]))

    steps = range(1, TRAIN_STEPS + 1)
    norms = {i: at(i, "metrics.grad_norm_components") for i in steps}
    clip = {i: at(i, "evidence.grad_clip") for i in steps}
    assert all(c == np.float32(spd.grad_clip) for c in clip.values())
    assert any(norms[i] > clip[i] for i in steps), f"clipping never active: {norms} vs {clip}"
    assert any(norms[i] <= clip[i] for i in steps), f"clipping always active: {norms} vs {clip}"
    ps = [at(i, "metrics.p") for i in steps]
    assert any(spd.p_end < p < spd.p_start for p in ps), f"p never mid-anneal: {ps}"
    moves = [at(i, "evidence.pgd_max_move_in_lr") for i in steps]
    assert spd.pgd_warmup_steps > 1
    assert all(m > 1 for m in moves), f"PGD moved no source beyond one step's reach: {moves}"


#: The bf16 forward against the fp32 forward, where bitwise is impossible: logits as
#: distributions, taps (the fp32 ones rounded to bf16) within a bf16 reduction of the
#: length of the last contraction (d_model 32 for MLP-inner, d_mlp 64 into the residual).
BF16_AGAINST_FP32 = [
    ("logits.*", "bf16_logits"),
    ("taps.*.mlp.down_proj", "reduction[K=32]"),
    ("taps.*", "reduction[K=64]"),
]


def test_the_bf16_forward_is_within_bf16_classes_of_the_fp32_forward(parity_check, parity_goldens):
    import ml_dtypes

    bf16, fp32 = parity_goldens.open("forward_bf16"), parity_goldens.open("forward_llama")
    actual, expected = {}, {}
    for key in bf16:
        ref = np.asarray(fp32[key.replace(".bf16.", ".", 1)])
        if key.startswith("logits."):
            actual[key], expected[key] = np.asarray(bf16[key]).astype(np.float32), ref
        else:
            actual[key], expected[key] = np.asarray(bf16[key]), ref.astype(ml_dtypes.bfloat16)
    from parity.judge._tolerance import ClassMap

    cmap = ClassMap(tuple(BF16_AGAINST_FP32))
    parity_check(actual, expected, name="forward_bf16.against_fp32", class_map=cmap,
                 order=bf16.ordered_keys())  # fmt: skip


def test_the_bf16_forward_is_the_llama_forward_in_bf16(parity_goldens):
    """Read from the pinned files: the bf16 group holds the same keys as the fp32 llama
    forward (prefixed `bf16`), every array bfloat16, and its logits are not the fp32 logits
    rounded to bf16 (the forward ran in bf16, not in fp32 then cast down)."""
    import ml_dtypes

    bf16, fp32 = parity_goldens.open("forward_bf16"), parity_goldens.open("forward_llama")
    assert sorted(k.replace(".bf16.", ".", 1) for k in bf16) == sorted(fp32)
    assert {bf16.info(k).dtype for k in bf16} == {np.dtype(ml_dtypes.bfloat16)}
    for key in ("logits.bf16.llama.clean", "logits.bf16.llama.fused_full_depth"):
        rounded = np.asarray(fp32[key.replace(".bf16.", ".", 1)]).astype(ml_dtypes.bfloat16)
        assert not np.array_equal(bf16[key].view(np.uint16), rounded.view(np.uint16)), key
