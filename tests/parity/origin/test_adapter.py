"""The recorder behind one adapter (issue 56): `parity.origin._adapter` is the only module of
the recording code that reads jax's internals; it says what this jax lets it do, puts its
hooks into jax only while a capture is open, and a hook that fails never fails the code it
wraps: the capture says why in one line and the recording refuses, naming it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

from parity.origin import LocaliseError, _adapter as adapter  # noqa: E402
from parity.origin._programs import capture  # noqa: E402
from parity.origin._record import record_programs  # noqa: E402

SRC = Path(__file__).resolve().parents[3] / "src" / "parity"


def test_only_the_adapter_reads_jax_internals_in_the_recording_code() -> None:
    readers = sorted(
        p.relative_to(SRC).as_posix()
        for p in (SRC / "origin").rglob("*.py")
        if re.search(r"\bjax\._src\b|from jax\._src\b", p.read_text())
    )
    assert readers == ["origin/_adapter.py"], readers


def test_this_jax_offers_programs_and_places_and_says_nothing_is_missing() -> None:
    # Every release of the declared range (jax 0.4.35 on) offers both: CI runs this file
    # on the oldest and the newest.
    support = adapter.support()
    assert support.jax == jax.__version__
    assert support.programs.available, support.programs.why
    assert support.places.available, support.places.why
    assert support.missing() == []


def _hooked_names() -> dict[str, Any]:
    """The jax functions the adapter replaces while open, as they are now."""
    hooks = adapter._detected()[1]
    assert hooks is not None
    return {
        "call": getattr(hooks.pjit, hooks.call_name),
        "fastpath": hooks.pjit._get_fastpath_data,
        "eager": hooks.core.EvalTrace.__dict__["process_primitive"],
    }


def test_the_hooks_are_in_jax_only_while_a_capture_is_open() -> None:
    before = _hooked_names()
    assert not adapter.installed()
    with capture() as cap:
        inside = _hooked_names()
        assert adapter.installed() and cap.status.installed
        assert all(inside[k] is not before[k] for k in before)
        with capture():  # nested: still in, and still in after the inner one closes
            pass
        assert adapter.installed()
    assert not adapter.installed()
    after = _hooked_names()
    assert all(after[k] is before[k] for k in before)


@jax.jit
def _step(x: Any) -> Any:
    return jnp.tanh(x) * 2.0


def test_every_top_level_call_and_eager_operation_is_seen_and_linked() -> None:
    x = jnp.arange(4.0)
    _step(x)  # compiled and cached in C++ before the capture opens
    with capture() as cap:
        y = _step(x)
        z = _step(y)
        w = z + 1.0  # eager
    assert cap.failure == ""
    assert len(cap.programs) == 3, [p.jaxpr for p in cap.programs]
    assert cap.link_of(y) is not None and cap.programs[1].args[0] == cap.link_of(y)
    recording, order = record_programs(cap, {"w": w, "z": z})
    assert recording is not None and order == ["z", "w"]
    np.testing.assert_array_equal(recording.output_arrays["w"], np.asarray(w))


@pytest.fixture
def raising_reader(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The adapter's reading of jax's jitted call replaced by one that raises, as a private
    name that moved in a new jax would make it."""

    def moved(*a: Any, **k: Any) -> Any:
        raise AttributeError("module 'jax._src.pjit' has no attribute 'renamed'")

    monkeypatch.setattr(adapter, "_read_after", moved)
    yield


@pytest.mark.usefixtures("raising_reader")
def test_a_hook_that_raises_never_fails_the_call_and_says_why_in_one_line() -> None:
    x = jnp.arange(4.0)
    with capture() as cap:
        y = _step(x)  # jax's own call runs once, with its own result
        z = _step(y)
    np.testing.assert_array_equal(np.asarray(z), np.asarray(_step(_step(x))))
    line = cap.failure
    assert "\n" not in line and "has no attribute 'renamed'" in line, line
    assert f"on jax {jax.__version__}" in line, line
    assert "falls back to the order the producer declared" in line, line
    assert "no origin or proof op by op" in line, line
    with pytest.raises(LocaliseError) as refused:
        record_programs(cap, {"z": z})
    assert refused.value.reason == line
    assert not adapter.installed()  # and the hooks came out all the same


def test_hooks_that_cannot_go_in_leave_jax_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    before = _hooked_names()

    def broken(original: Any) -> Any:
        raise TypeError("cannot wrap")

    # The second of the three hooks fails: the first, already in, is taken out again.
    monkeypatch.setattr(adapter, "_fastpath_hook", broken)
    with capture() as cap:
        y = _step(jnp.ones(3))
    assert not cap.status.installed and "hooks could not go into jax" in cap.failure
    np.testing.assert_array_equal(np.asarray(y), np.tanh(np.ones(3, np.float32)) * 2)
    assert _hooked_names() == before and not adapter.installed()


def test_a_jax_without_the_private_names_says_what_it_cannot_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def absent() -> Any:
        raise LookupError("jax._src.pjit has neither _run_python_pjit nor _python_pjit_helper")

    monkeypatch.setattr(adapter, "_detect_hooks", absent)
    adapter._detected.cache_clear()
    try:
        support = adapter.support()
        assert not support.programs.available and support.places.available
        (line,) = support.missing()
        assert line.startswith(f"jax {jax.__version__} lets parity not see the programs"), line
        assert "has neither _run_python_pjit" in line and "falls back to" in line, line
        with capture() as cap:
            y = _step(jnp.ones(2))
        assert cap.failure == line and not adapter.installed()
        assert y.shape == (2,)
    finally:
        adapter._detected.cache_clear()
