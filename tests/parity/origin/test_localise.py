"""`parity.localise`: recording a program's values, matching them by value, the origin rule,
and the fingerprint summary that crosses a process boundary; on hand-written programs
whose origin line is read from their source."""

from __future__ import annotations

import inspect
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import parity
from parity.judge._classes import REGISTRY
from parity.origin import (
    LocaliseError,
    Recording,
    align,
    localise,
    locate,
    matching_tolerance,
    record,
)
from parity.origin._stored import ArraysWriter, StoredArrays

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 8)).astype(np.float32)
W = (RNG.standard_normal((3, 8, 8)) / math.sqrt(8)).astype(np.float32)  # [layer, out, in]


def _line_of(fn, text: str) -> int:
    """The line of `fn`'s source that holds `text`."""
    lines, first = inspect.getsourcelines(fn)
    hits = [first + i for i, line in enumerate(lines) if text in line]
    assert len(hits) == 1, (fn, text)
    return hits[0]


def old_mlp(x, w):
    h = jnp.tanh(x @ w[0].T)
    h = h * jax.nn.sigmoid(h @ w[1].T)
    return {"hidden": h, "out": h @ w[2].T}


def new_mlp(x, w):
    h = jnp.tanh(x @ w[0].T)
    gate = jax.nn.sigmoid(h @ w[1].T + 1e-2)  # the bug
    h = h * gate
    return {"hidden": h, "out": h @ w[2].T}


def test_the_origin_is_the_changed_line_of_a_hand_written_pair(tmp_path):
    origin = localise(new_mlp, old_mlp, X, W, class_map="fp32_reassoc", root=tmp_path).origin
    assert origin is not None
    assert origin.key == "hidden"  # the first output (in dataflow order) that fails
    assert (origin.function, origin.line) == ("new_mlp", _line_of(new_mlp, "# the bug"))
    assert origin.primitive == "add" and origin.shape == (3, 8) and origin.dtype == "float32"
    assert origin.file == __file__  # outside the root: as recorded
    assert origin.max_diff == pytest.approx(1e-2, rel=1e-3)
    assert 0 < origin.matched_fraction < 1
    assert "new_mlp" in origin.describe() and origin.to_dict()["line"] == origin.line
    # the same output asked for by key; and a program against itself has no origin
    by_key = localise(new_mlp, old_mlp, X, W, class_map="fp32_reassoc", key="out").origin
    assert by_key is not None and (by_key.key, by_key.position) == ("out", origin.position)
    same = localise(old_mlp, old_mlp, X, W, class_map="fp32_reassoc")
    assert (same.status, same.origin) == ("no_failure", None)


def test_the_file_is_relative_to_the_root_when_under_it():
    from pathlib import Path

    origin = localise(
        new_mlp, old_mlp, X, W, class_map="fp32_reassoc", root=Path(__file__).parent
    ).origin
    assert origin is not None and origin.file == Path(__file__).name


def scanned(x, w):
    def layer(h, wi):
        h = jax.nn.gelu(h @ wi.T)
        return h, h

    h, hs = jax.lax.scan(layer, x, w)
    return {"hs": hs, "out": h.sum(-1)}


def unrolled(x, w):
    hs = []
    h = x
    for i in range(w.shape[0]):
        h = jax.nn.gelu(h @ w[i].T)
        hs.append(h)
    return {"hs": jnp.stack(hs), "out": h.sum(-1)}


def vmapped_layers(x, w):
    """Each layer applied to its copy of x, all layers at once: stacked `[layer, ...]` values."""
    xs = jnp.broadcast_to(x, (w.shape[0], *x.shape))
    return {"each": jax.vmap(lambda wi, xi: jax.nn.gelu(xi @ wi.T))(w, xs)}


def vmapped_layers_in_the_middle(x, w):
    """As `vmapped_layers`, but x is shared: the batched matmul puts the layer axis second."""
    return {"each": jax.vmap(lambda wi: jax.nn.gelu(x @ wi.T))(w)}


def layer_by_layer(x, w):
    return {"each": jnp.stack([jax.nn.gelu(x @ w[i].T) for i in range(w.shape[0])])}


@pytest.mark.parametrize(("new", "old"), [(scanned, unrolled), (unrolled, scanned),
                                          (vmapped_layers, layer_by_layer),
                                          (layer_by_layer, vmapped_layers)])  # fmt: skip
def test_a_loop_and_its_scan_or_vmap_match_at_every_value(new, old):
    new_rec, old_rec = record(new, X, W), record(old, X, W)
    rho = matching_tolerance(REGISTRY["fp32_reassoc"], next(iter(old_rec.output_arrays.values())))
    alignment = align(new_rec, old_rec, rho)
    assert alignment.unmatched() == [], alignment.unmatched()
    assert localise(new, old, X, W, class_map="fp32_reassoc").origin is None


def test_a_layer_axis_that_is_not_leading_is_unmatched_but_no_origin():
    new, old = record(vmapped_layers_in_the_middle, X, W), record(layer_by_layer, X, W)
    alignment = align(
        new, old, matching_tolerance(REGISTRY["fp32_reassoc"], old.output_arrays["each"])
    )
    # rows are taken along the leading axis only: the `[x row, layer, out]` values of the
    # batched matmul and the gelu over them match nothing; their transpose to `[layer, ...]`
    # matches again, so nothing reaches the output unmatched
    assert {v.shape for v in alignment.unmatched()} == {(X.shape[0], W.shape[0], W.shape[1])}
    assert alignment.origin("each") is None


def test_each_iteration_of_a_scan_is_a_value_of_its_own():
    rec = record(scanned, X, W)
    dots = [v for v in rec.values if v.primitive == "dot_general"]
    assert len(dots) == W.shape[0]
    assert {v.line for v in dots} == {_line_of(scanned, "jax.nn.gelu(h @ wi.T)")}
    assert {v.function for v in dots} == {"scanned.<locals>.layer"}


def bugged_scan(x, w):
    def layer(h, wi):
        h = jax.nn.gelu(h @ wi.T)
        h = jnp.where(jnp.abs(h) > 0.5, h, 0.0)  # the bug
        return h, h

    h, hs = jax.lax.scan(layer, x, w)
    return {"hs": hs, "out": h.sum(-1)}


def test_a_bug_in_a_scan_body_is_named_in_its_first_iteration():
    origin = localise(bugged_scan, unrolled, X, W, class_map="fp32_reassoc").origin
    assert origin is not None and origin.function == "bugged_scan.<locals>.layer"
    assert origin.line == _line_of(bugged_scan, "# the bug")
    rec = record(bugged_scan, X, W)
    first = min(v.id for v in rec.values if v.line == origin.line)
    assert origin.position < [v.id for v in rec.values if v.primitive == "dot_general"][1]
    assert origin.position >= first


def attention_split(x, w):
    q, k, v = x @ w[0].T, x @ w[1].T, x @ w[2].T
    return {"y": jax.nn.softmax(q @ k.T, axis=-1) @ v}


def attention_fused(x, w):
    qkv = x @ jnp.concatenate([w[0], w[1], w[2]]).T
    q, k, v = jnp.split(qkv, 3, axis=-1)
    return {"y": jax.nn.softmax(q @ k.T, axis=-1) @ v}


def attention_fused_bug(x, w):
    qkv = x @ jnp.concatenate([w[0], w[1], w[2]]).T
    q, k, v = jnp.split(qkv, 3, axis=-1)
    return {"y": jax.nn.softmax(q @ k.T / 2.0, axis=-1) @ v}  # the bug


def test_a_fused_projection_split_back_into_q_k_v_is_not_an_origin():
    new, old = record(attention_fused, X, W), record(attention_split, X, W)
    alignment = align(
        new, old, matching_tolerance(REGISTRY["fp32_reassoc"], old.output_arrays["y"])
    )
    # the fused weight and matmul are the values the old program never computed...
    unmatched = alignment.unmatched()
    assert [v.primitive for v in unmatched] == ["concatenate", "transpose", "dot_general"]
    assert unmatched[-1].shape == (3, 24)
    # ...but q, k, v split from it match again, so it is no origin
    assert alignment.origin("y") is None
    assert localise(attention_fused, attention_split, X, W, class_map="fp32_reassoc").origin is None
    # With a bug after the split, the fused weight and matmul differ from every old value
    # too (the old program never computed them), but they are values of a new kind, and
    # their split parts are within the class's tolerance again: the bug is named, at its
    # line, not the (earlier) fused matmul.
    found = localise(attention_fused_bug, attention_split, X, W, class_map="fp32_reassoc")
    assert found.origin is not None and found.origin.primitive == "div"
    assert found.origin.line == _line_of(attention_fused_bug, "# the bug")
    assert found.beyond is None  # the first beyond the tolerance is the origin itself


def test_the_matching_tolerance_follows_the_class():
    out = np.array([0.5, -4.0], dtype=np.float32)
    assert matching_tolerance(REGISTRY["bitwise"], out) == 0.0
    assert matching_tolerance(REGISTRY["fp32_reassoc"], out) == pytest.approx(2e-5 / 4.0)
    assert matching_tolerance(REGISTRY["fp32_reassoc_scaled"], out) == pytest.approx(4e-6)
    assert matching_tolerance(REGISTRY["device_count"], out) == pytest.approx(1e-7 / 4 + 1e-4)
    assert matching_tolerance(REGISTRY["fp32_reassoc"], np.array([3], np.int32)) == 0.0
    with pytest.raises(LocaliseError, match="judges in 'kl'"):
        matching_tolerance(REGISTRY["bf16_logits"], out)


def test_bitwise_matching_is_exact_and_a_tolerance_lets_reassociation_through():
    def sum_forward(x):
        return {"s": jnp.sum(x, axis=-1)}

    def sum_backward(x):
        return {"s": jnp.sum(x[:, ::-1], axis=-1)}  # the same sum, in another order

    x = RNG.standard_normal((4, 1000)).astype(np.float32)
    new, old = record(sum_backward, x), record(sum_forward, x)
    assert not np.array_equal(new.output_arrays["s"], old.output_arrays["s"])
    assert locate(new, old, class_map="fp32_reassoc").status == "no_failure"
    # Under bitwise the sum fails; its operand reversed is the first value the old program
    # never had (a reversal arranges values anew: it matches by value only)
    origin = locate(new, old, class_map="bitwise").origin
    assert origin is not None and origin.primitive == "rev"


def test_fill_values_do_not_set_the_scale_of_a_tolerance():
    def masked(x, scale):
        scores = jnp.where(jnp.tril(jnp.ones((8, 8), bool)), x * scale, jnp.finfo(jnp.float32).min)
        return {"p": jax.nn.softmax(scores, axis=-1)}

    x = RNG.standard_normal((8, 8)).astype(np.float32)
    origin = localise(
        lambda x: masked(x, 0.5), lambda x: masked(x, 1.0), x, class_map="fp32_reassoc"
    ).origin
    assert origin is not None and origin.primitive == "mul"  # not a later op of the softmax


def test_a_summary_round_trips_through_numpy_arrays_and_names_the_same_origin(tmp_path):
    new, old = record(new_mlp, X, W), record(old_mlp, X, W)
    full = locate(new, old, class_map="fp32_reassoc").origin
    path = tmp_path / "old.npz"
    np.savez(path, allow_pickle=False, **old.summary().to_arrays())
    with np.load(path) as data:
        summary = Recording.from_arrays(dict(data))
    assert summary.arrays is None and summary.values == old.values
    assert list(summary.outputs) == list(old.outputs)
    assert summary.rows.keys() == old.rows.keys()
    from_summary = locate(new, summary, class_map="fp32_reassoc").origin
    assert full is not None and from_summary is not None
    assert (from_summary.line, from_summary.primitive) == (full.line, full.primitive)
    assert from_summary.max_diff is not None and from_summary.max_diff <= full.max_diff  # type: ignore[operator]
    back = Recording.from_arrays(old.to_arrays())  # with the arrays
    assert back.arrays is not None
    assert all(np.array_equal(a, b) for a, b in zip(back.arrays, old.arrays or (), strict=True))
    # Written a value at a time (as a producer's recording is, issue 76) and read back
    # lazily: the same numbers, no file at the path until the last member is written.
    spilled = tmp_path / "spilled.npz"
    writer = ArraysWriter(spilled)
    for i, a in enumerate(old.arrays or ()):
        writer.value(i, a)
    assert not spilled.exists()
    writer.commit(old.summary().to_arrays())
    lazy = Recording.read(spilled)
    assert isinstance(lazy.arrays, StoredArrays) and lazy.nbytes >= old.nbytes
    assert all(np.array_equal(lazy.arrays[i], a) for i, a in enumerate(old.arrays or ()))
    assert [(f.digest, f.stats.tolist()) for fs in lazy.rows.values() for f in fs] == [
        (f.digest, f.stats.tolist()) for fs in old.rows.values() for f in fs
    ]
    again = locate(new, lazy, class_map="fp32_reassoc").origin
    assert again is not None and (again.line, again.max_diff) == (full.line, full.max_diff)
    dropped = ArraysWriter(tmp_path / "dropped.npz")
    dropped.value(0, np.zeros(3))
    dropped.abandon()
    assert list(tmp_path.glob("dropped*")) == []


def test_a_function_that_does_not_trace_is_named():
    def to_numpy(x):
        return {"y": np.asarray(x) * 2}

    with pytest.raises(LocaliseError, match="to_numpy does not trace"):
        record(to_numpy, X)


#: Whether `_refusing` raises: a callback that ran once and cannot run again (issue 72's
#: "setting an array element with a sequence", raised only while recording).
REFUSE = {"now": False}


def _refusing(x):
    if REFUSE["now"]:
        raise ValueError("setting an array element with a sequence.")
    return x


def new_with_a_callback(x, w):
    h = jnp.tanh(x @ w[0].T)
    h = jax.pure_callback(_refusing, jax.ShapeDtypeStruct(h.shape, h.dtype), h)  # the callback
    return {"out": h @ w[2].T * 1.001}


def test_a_recording_that_raises_names_the_operation_and_keeps_its_traceback(monkeypatch):
    """Issue 72: a recording that raised said one line, with no traceback anywhere."""
    new = new_with_a_callback(X, W)
    monkeypatch.setitem(REFUSE, "now", True)
    with pytest.raises(AssertionError) as info:
        parity.assert_equivalent(new, old_mlp(X, W), new_fn=new_with_a_callback,
                                 old_fn=old_mlp, args=(X, W))  # fmt: skip
    (line,) = [ln for ln in str(info.value).splitlines() if ln.startswith("origin:")]
    where = f"{__file__}:{_line_of(new_with_a_callback, '# the callback')} in new_with_a_callback"
    said = "in the operation pure_callback at"
    assert f"recording raised ValueError {said} {where}: " in line, line
    assert "setting an array element with a sequence." in line
    origin = info.value.origin  # type: ignore[attr-defined]
    assert origin.status == "not_named" and origin.reason in line
    # The whole traceback, down to the callback's own raise, on the error's message.
    assert origin.traceback.startswith("Traceback (most recent call last)")
    assert "in _refusing" in origin.traceback and origin.traceback in str(info.value)


def test_a_producer_s_recording_that_raises_keeps_its_traceback_in_the_log_it_names(
    monkeypatch, tmp_path
):
    """The producer process's side (`_runner_groups`): the group's `.origin.json` line names
    the operation and the log holding the traceback (`PARITY_LOGS`, which a producer run
    is handed)."""
    from parity.judge._dataflow import numpy_conversions
    from parity.judge._trees import flatten
    from parity.machinery._runner_groups import ORIGIN_REASON, _recorded_order
    from parity.origin._programs import capture

    monkeypatch.setenv("PARITY_LOGS", str(tmp_path / "logs"))
    step = jax.jit(new_with_a_callback)
    with numpy_conversions() as converted, capture() as programs:
        result = step(X, W)
    monkeypatch.setitem(REFUSE, "now", True)
    returned = flatten(result, to_array=lambda x: x)
    _recorded_order("g", returned, converted, programs, tmp_path)
    reason = json.loads((tmp_path / f"g{ORIGIN_REASON}").read_text())["reason"]
    where = f":{_line_of(new_with_a_callback, '# the callback')} in new_with_a_callback"
    # Compiled, the callback's error reaches the recorder as XLA's (JaxRuntimeError here),
    # whose message ends with the callback's own.
    said = "in the operation pure_callback at "
    assert reason.startswith("recording raised ") and said in reason and where in reason
    assert "ValueError: setting an array element with a sequence." in reason, reason
    (log,) = (tmp_path / "logs").glob("recording-*.log")
    assert reason.endswith(f"(traceback in {log})"), reason
    assert "Traceback (most recent call last)" in log.read_text()
    assert "in _refusing" in log.read_text()
    # A producer run is handed the folder its command writes logs to.
    from parity.machinery._devices import isolated_env

    assert isolated_env(1)["PARITY_LOGS"] == str(tmp_path / "logs")


def test_localise_is_public_and_assert_equivalent_names_the_origin():
    assert parity.localise is localise
    with pytest.raises(AssertionError) as info:
        parity.assert_equivalent(new_mlp(X, W), old_mlp(X, W), class_map="fp32_reassoc",
                                 new_fn=new_mlp, old_fn=old_mlp, args=(X, W))  # fmt: skip
    line = [ln for ln in str(info.value).splitlines() if ln.startswith("origin:")]
    assert line == [line[0]] and f":{_line_of(new_mlp, '# the bug')} in new_mlp" in line[0]
    with pytest.raises(AssertionError) as info:  # without the functions: no origin line
        parity.assert_equivalent(new_mlp(X, W), old_mlp(X, W), class_map="fp32_reassoc")
    assert "origin:" not in str(info.value)


def test_localise_tells_no_failure_from_every_value_matched_and_its_types_are_public():
    """No output failing (nothing to explain) and a failing output whose every upstream
    value matched (a difference of compilation: a check names the key) are two answers,
    and the typed answer crosses JSON and back whole."""
    new, old = record(new_mlp, X, W), record(old_mlp, X, W)
    same = locate(old, old, class_map="bitwise")
    assert (same.status, same.origin, same.key) == ("no_failure", None, "")
    asked = locate(old, old, class_map="bitwise", key="out")
    assert (asked.status, asked.origin, asked.key) == ("matched", None, "out")
    assert "equal bit for bit when run op by op" in asked.line

    # A sum in another order: equal within the class, not bit for bit; the origin is
    # looked for at equality first, so the line says where the arithmetic differs.
    def forward(x):
        return {"s": jnp.sum(x, axis=-1)}

    def backward(x):
        return {"s": jnp.sum(x[:, ::-1], axis=-1)}

    x = RNG.standard_normal((4, 1000)).astype(np.float32)
    reordered = locate(record(backward, x), record(forward, x), class_map="fp32_reassoc", key="s")
    assert reordered.origin is not None and reordered.origin.primitive == "rev"
    assert reordered.within and "run op by op, s is within the class's tolerance" in reordered.line
    named = locate(new, old, class_map="fp32_reassoc")
    assert named.status == "named" and named.origin is not None and named.profile
    assert parity.Localisation.from_dict(json.loads(json.dumps(named.to_dict()))) == named
    assert named.json_origin() is not None and named.json_origin()["function"] == "new_mlp"
    assert parity.Origin is type(named.origin)
    with pytest.raises(parity.LocaliseError):
        locate(new, old, class_map="fp32_reassoc", key="no such key")


def test_an_origin_equal_in_value_but_not_in_bits_says_so_not_0_from() -> None:
    """A negated zero: the new value equals the old program's in every element (`-0.0 ==
    0.0`) but not bit for bit, so under `bitwise` it is the origin; its line says there is
    no measured difference and the bits differ, not "0 from" an old value."""
    x = jnp.arange(1.0, 4.0)

    def old(x):
        return {"y": jnp.tanh(x) * 0.0}

    def new(x):
        return {"y": -(jnp.tanh(x) * 0.0)}

    a, b = np.asarray(new(x)["y"]), np.asarray(old(x)["y"])
    assert np.array_equal(a, b) and a.tobytes() != b.tobytes()  # equal values, other bits
    with pytest.raises(AssertionError) as e:
        parity.assert_equivalent(new(x), old(x), new_fn=new, old_fn=old, args=(x,))
    line = next(ln for ln in str(e.value).splitlines() if ln.startswith("origin:"))
    assert line.startswith("origin: neg at "), line
    assert (
        "no measured difference from the nearest old value of its shape, yet not its bits" in line
    )
    assert "0 from the nearest" not in line, line
