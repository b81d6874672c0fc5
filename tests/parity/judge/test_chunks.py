"""Chunked comparison: the plan, file sources, and findings identical to the whole-array path.

The figures of a finding are reductions (counts, maxima, first and worst elements) that
must combine across chunks exactly; these tests compare the finding of one whole chunk with
findings over chunks that cut the arrays anywhere, and the figures with a direct numpy
computation over the whole arrays.
"""

from __future__ import annotations

import math
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import h5py
import ml_dtypes
import numpy as np
import pytest
from _damage import flip_stored_byte
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from parity._cli import run_diff
from parity.judge._chunks import ArraySource, Block, elements_per_chunk, plan
from parity.judge._classes import REGISTRY, ToleranceClass
from parity.judge._compare import compare_arrays
from parity.judge._fixed_rules import Close, RelativeToMax, Ulp
from parity.judge._ulp import to_float64, ulp_distance
from parity.report import format_table
from parity.store import GoldenCorruptError, open_goldens, write_goldens

CLASSES = [
    REGISTRY["bitwise"],
    REGISTRY["fp32_reassoc"],
    REGISTRY["device_count"],  # rtol: the golden's scale read in the same pass
    REGISTRY["fp32_reassoc_scaled"],  # relative to max|b|: a scale pre-pass
    ToleranceClass("ulp2", Ulp(max_ulp=2), meaning="test"),
    ToleranceClass("ulps_of_max", Close(atol_ulps=64.0), meaning="test"),
    ToleranceClass("tight_rel", RelativeToMax(k=1e-7), meaning="test"),
]


def _budget_for(n_elements: int, itemsize: int) -> int:
    """A budget that fits exactly `n_elements` per chunk."""
    return n_elements * (2 * itemsize + 128)


@pytest.mark.parametrize(
    ("shape", "max_elements"),
    [((7,), 3), ((4, 5), 7), ((4, 5), 5), ((3, 4, 5), 6), ((3, 4, 5), 2), ((2, 3), 100), ((), 1)],
)
def test_plan_covers_the_array_once_in_order(shape: tuple[int, ...], max_elements: int) -> None:
    blocks = list(plan(shape, max_elements))
    flat = np.arange(math.prod(shape)).reshape(shape)
    seen: list[int] = []
    start = 0
    for block in blocks:
        assert block.start == start and 1 <= block.size <= max_elements
        piece = flat[block.index].reshape(-1)
        assert piece.size == block.size
        assert list(piece) == list(range(start, start + block.size))  # consecutive, C order
        seen.extend(piece)
        start += block.size
    assert seen == list(range(math.prod(shape)))


def test_plan_keeps_last_axis_rows_whole_when_they_fit() -> None:
    for block in plan((3, 4, 10), 25):
        assert block.counts[-1] == 10
    assert [b.size for b in plan((3, 4, 10), 25)] == [20, 20, 20, 20, 20, 20]
    assert list(plan((0, 5), 3)) == []


def _figures(a: np.ndarray, g: np.ndarray) -> dict[str, Any]:
    """The figures of a float comparison computed directly over the whole arrays."""
    bits_a = a.reshape(-1).view(np.dtype(f"u{a.dtype.itemsize}"))
    bits_g = g.reshape(-1).view(np.dtype(f"u{g.dtype.itemsize}"))
    differ = bits_a != bits_g
    a64, g64 = to_float64(a.reshape(-1)), to_float64(g.reshape(-1))
    finite = np.isfinite(a64) & np.isfinite(g64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(finite, np.abs(a64 - g64), 0.0)
    ulp = np.where(finite, ulp_distance(a.reshape(-1), g.reshape(-1)), 0)
    first = int(np.argmax(differ)) if differ.any() else None
    return {
        "n_differ": int(differ.sum()),
        "max_abs": float(diff.max()) if differ.any() else 0.0,
        "max_ulp": int(ulp.max()) if differ.any() else 0,
        "first_differ": None if first is None else np.unravel_index(first, a.shape),
    }


_DTYPES = [np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)]


@st.composite
def _pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """A golden and an actual near it: some elements moved by a few ulps or by a lot,
    NaN, inf and signed zeros sprinkled in, on either side."""
    dtype = draw(st.sampled_from(_DTYPES))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=9))
    n = math.prod(shape)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    g = (rng.standard_normal(n) * draw(st.sampled_from([1e-3, 1.0, 300.0]))).astype(dtype)
    a = g.copy()
    bits = a.view(np.dtype(f"u{dtype.itemsize}"))
    moved = rng.random(n) < draw(st.sampled_from([0.0, 0.05, 0.5, 1.0]))
    bits[moved] += rng.integers(1, 4, size=int(moved.sum())).astype(bits.dtype)
    for arr in (a, g):
        special = rng.random(n) < draw(st.sampled_from([0.0, 0.05]))
        arr[special] = rng.choice(
            np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype), int(special.sum())
        )
    if draw(st.booleans()):
        a[rng.integers(0, n)] = g.reshape(-1)[0] * 3  # one large violation
    return a.reshape(shape), g.reshape(shape)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(pair=_pairs(), per_chunk=st.integers(1, 40), tol=st.sampled_from(CLASSES))
def test_chunked_finding_equals_the_whole_array_finding(
    pair: tuple[np.ndarray, np.ndarray], per_chunk: int, tol: ToleranceClass
) -> None:
    a, g = pair
    whole = compare_arrays("k", a, g, tol)
    chunked = compare_arrays("k", a, g, tol, budget=_budget_for(per_chunk, a.dtype.itemsize))
    assert chunked.to_dict() == whole.to_dict()
    expected = _figures(a, g)
    assert whole.n_differ == expected["n_differ"]
    assert whole.max_abs == expected["max_abs"]
    assert whole.max_ulp == expected["max_ulp"]
    if tol.name == "bitwise" and expected["first_differ"] is not None:
        assert whole.worst_index == tuple(int(i) for i in expected["first_differ"])


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_])
def test_chunked_integer_findings_equal_whole(dtype: type) -> None:
    rng = np.random.default_rng(3)
    g = rng.integers(0, 2, size=(6, 7)).astype(dtype)
    a = g.copy()
    a[1, 3] = not a[1, 3] if dtype is np.bool_ else a[1, 3] + 1
    a[4, 6] = not a[4, 6] if dtype is np.bool_ else a[4, 6] + 1
    whole = compare_arrays("i", a, g, REGISTRY["fp32_reassoc"])
    for per_chunk in (1, 5, 7, 13):
        budget = _budget_for(per_chunk, np.dtype(dtype).itemsize)
        assert compare_arrays("i", a, g, REGISTRY["fp32_reassoc"], budget=budget) == whole
    assert whole.n_differ == 2 and whole.worst_index == (1, 3)


class _Recording:
    """A source that records the size of every block read from it."""

    def __init__(self, inner: Any):
        self.inner, self.sizes = inner, []

    @property
    def shape(self) -> tuple[int, ...]:
        return self.inner.shape

    @property
    def dtype(self) -> np.dtype:
        return self.inner.dtype

    def read(self, block: Block) -> np.ndarray:
        self.sizes.append(block.size)
        return self.inner.read(block)

    def finish(self) -> None:
        self.inner.finish()


def _flipped_pair(
    shape: tuple[int, ...], dtype: Any, *, seed: int, every: int, bits: int
) -> tuple[np.ndarray, np.ndarray]:
    """`(actual, golden)`: a seeded normal golden of `dtype`, and a copy with `bits` XORed
    into every `every`-th element's bit pattern."""
    g = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    a = g.copy()
    a.view(f"u{g.itemsize}").reshape(-1)[::every] ^= bits
    return a, g


def _bf16_pair(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    return _flipped_pair(shape, ml_dtypes.bfloat16, seed=0, every=5, bits=1)


def test_file_sources_read_at_most_the_budget_and_give_the_whole_finding(tmp_path: Path) -> None:
    a, g = _bf16_pair((6, 50, 33))
    write_goldens(tmp_path / "g.h5", {"logits": g})
    write_goldens(tmp_path / "a.h5", {"logits": a})
    tol = REGISTRY["fp32_reassoc_scaled"]  # two passes over the golden
    budget = _budget_for(400, 2)
    whole = compare_arrays("logits", a, g, tol)
    with open_goldens(tmp_path / "g.h5") as gf, open_goldens(tmp_path / "a.h5") as af:
        src_a, src_g = _Recording(af.source("logits")), _Recording(gf.source("logits"))
        finding = compare_arrays("logits", src_a, src_g, tol, budget=budget)
    assert finding == whole
    assert max(src_a.sizes + src_g.sizes) <= elements_per_chunk(2, budget) == 400
    assert sum(src_a.sizes) == a.size and sum(src_g.sizes) == 2 * g.size


def test_a_damaged_chunk_is_caught_by_the_checksum(tmp_path: Path) -> None:
    _, g = _bf16_pair((40, 64))
    path = tmp_path / "g.h5"
    write_goldens(path, {"x": g})
    flip_stored_byte(path, "x/%value", g.nbytes - 3, 0x10)  # a byte of its last chunk
    with open_goldens(path) as gf, pytest.raises(GoldenCorruptError, match="sha256"):
        compare_arrays("x", g, gf.source("x"), REGISTRY["bitwise"], budget=_budget_for(64, 2))
    cmd = [sys.executable, "-m", "parity", "diff", str(path), str(path), "--memory", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "corrupt" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_parity_diff_in_chunks_reports_what_the_whole_comparison_does(tmp_path: Path) -> None:
    a, g = _bf16_pair((3, 700, 300))  # 1.2 MiB: more than one chunk at --memory 1
    write_goldens(tmp_path / "g.h5", {"logits": g, "small": g[0, 0]},
                  classes={"logits": "fp32_reassoc", "small": "bitwise"})  # fmt: skip
    write_goldens(tmp_path / "a.h5", {"logits": a, "small": g[0, 0]})
    one_mib = run_diff(tmp_path / "a.h5", tmp_path / "g.h5", budget=2**20)
    default = run_diff(tmp_path / "a.h5", tmp_path / "g.h5")
    whole = compare_arrays("logits", a, g, REGISTRY["fp32_reassoc"], order=None)
    assert one_mib.comparison.to_dict() == default.comparison.to_dict()
    got = one_mib.comparison.finding("logits")
    assert got.to_dict() | {"order": None} == whole.to_dict()
    assert elements_per_chunk(2, 2**20) < a.size


def _f32_pair(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    return _flipped_pair(shape, np.float32, seed=1, every=7, bits=3)


def _write_plain(path: Path, arrays: dict[str, np.ndarray], **kwargs: Any) -> Path:
    """A plain HDF5 file (no parity attributes): one dataset per key, '.' -> '/'."""
    with h5py.File(path, "w") as f:
        for key, value in arrays.items():
            f.create_dataset(key.replace(".", "/"), data=value, **kwargs)
    return path


def test_plain_file_sources_read_at_most_the_budget_and_give_the_whole_finding(
    tmp_path: Path,
) -> None:
    a, g = _f32_pair((40, 100, 64))  # 1 MB a file, against a budget of 1000 elements
    _write_plain(tmp_path / "g.h5", {"logits": g})
    _write_plain(tmp_path / "a.h5", {"logits": a})
    tol = REGISTRY["fp32_reassoc_scaled"]  # two passes over the golden
    budget = _budget_for(1000, 4)
    whole = compare_arrays("logits", a, g, tol)
    with open_goldens(tmp_path / "g.h5") as gf, open_goldens(tmp_path / "a.h5") as af:
        assert not gf.is_parity_file and not af.is_parity_file
        tracemalloc.start()
        try:
            src_a, src_g = _Recording(af.source("logits")), _Recording(gf.source("logits"))
            finding = compare_arrays("logits", src_a, src_g, tol, budget=budget)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert finding == whole
    assert max(src_a.sizes + src_g.sizes) <= elements_per_chunk(4, budget) == 1000
    assert sum(src_a.sizes) == a.size and sum(src_g.sizes) == 2 * g.size
    # Neither file was loaded whole (a whole load is one array of 1 MB per file).
    assert peak < g.nbytes / 2, (peak, g.nbytes)


def test_parity_diff_of_plain_files_in_chunks_gives_the_default_table(tmp_path: Path) -> None:
    a, g = _f32_pair((3, 700, 300))  # 2.5 MB: more than one chunk at --memory 1
    rng = np.random.default_rng(2)
    others = {
        "half": rng.standard_normal((50, 33)).astype(np.float16),
        "big_endian": rng.standard_normal((20, 70)).astype(">f8"),
        "counts": rng.integers(-9, 9, (30, 40)).astype(np.int16),
        "mask": rng.random((17, 19)) < 0.5,
        "z": (rng.standard_normal((8, 9)) + 1j).astype(np.complex64),
        "scalar": np.float32(0.5),
        "empty": np.zeros((0, 3), np.float32),
    }
    moved = {k: v.copy() for k, v in others.items()}
    moved["half"].reshape(-1)[::9] *= 2
    moved["counts"][3] += 1
    moved["mask"][0] = ~moved["mask"][0]
    _write_plain(tmp_path / "g.h5", {"nested.logits": g, **others})
    _write_plain(tmp_path / "a.h5", {"nested.logits": a, **moved})
    # Chunked, compressed HDF5 storage is read by hyperslab too.
    _write_plain(tmp_path / "gz.h5", {"nested.logits": a}, chunks=(1, 64, 64), compression="gzip")
    tiny = run_diff(tmp_path / "a.h5", tmp_path / "g.h5", budget=_budget_for(50, 8))
    default = run_diff(tmp_path / "a.h5", tmp_path / "g.h5")
    assert tiny.comparison.to_dict() == default.comparison.to_dict()
    assert format_table(tiny.comparison, header=tiny.header) == format_table(
        default.comparison, header=default.header
    )
    assert not default.comparison.passed and default.comparison.finding("scalar").passed
    whole = compare_arrays("nested.logits", a, g, REGISTRY["bitwise"])
    assert default.comparison.finding("nested.logits").to_dict() | {"order": None} == (
        whole.to_dict()
    )
    gz = run_diff(tmp_path / "gz.h5", tmp_path / "g.h5", budget=2**20)
    assert gz.comparison.finding("nested.logits") == default.comparison.finding("nested.logits")
    # The command line: --memory 1 prints the default's table.
    cmd = [sys.executable, "-m", "parity", "diff", str(tmp_path / "a.h5"), str(tmp_path / "g.h5")]
    one_mib = subprocess.run([*cmd, "--memory", "1"], capture_output=True, text=True)
    plain = subprocess.run(cmd, capture_output=True, text=True)
    assert one_mib.returncode == plain.returncode == 1, one_mib.stderr + plain.stderr
    assert one_mib.stdout == plain.stdout
    assert elements_per_chunk(4, 2**20) < a.size


def test_memory_flag_is_checked() -> None:
    cmd = [sys.executable, "-m", "parity", "diff", "a.h5", "b.h5", "--memory", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 2 and "positive whole number of MiB" in done.stderr


def test_array_source_reads_views_in_c_order() -> None:
    x = np.arange(24).reshape(2, 3, 4)
    src = ArraySource(x)
    pieces = [src.read(b) for b in plan(x.shape, 5)]
    assert np.array_equal(np.concatenate(pieces), x.reshape(-1))
