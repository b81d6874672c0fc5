"""The golden store: exact round trips, reproducible bytes, atomic writes, refusals."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import h5py
import ml_dtypes
import numpy as np
import pytest
from _damage import flip_stored_byte
from hypothesis import given, strategies as st

from parity import store
from parity.store import (
    SCHEMA_VERSION,
    ArrayInfo,
    GoldenCorruptError,
    GoldenFormatError,
    GoldenKeyError,
    GoldenMissingError,
    GoldenSchemaError,
    GoldenStoreError,
    GoldenUnsafeError,
    Provenance,
    UnsupportedDtypeError,
    _writer as writer,
    open_goldens,
    write_goldens,
)
from parity.store._format import meta_digest


def _bits(a: np.ndarray) -> bytes:
    """The raw bytes of `a`, comparable for any dtype (NaN payloads and -0.0 included)."""
    a = np.require(a, requirements="C")
    return a.reshape(-1).view(np.uint8).tobytes()


def _assert_exact(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert _bits(got) == _bits(want)


def _dir_listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


_RNG = np.random.default_rng(0)

_DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
    ml_dtypes.bfloat16,
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e5m2,
    ml_dtypes.float8_e4m3fnuz,
    ml_dtypes.float8_e5m2fnuz,
    ml_dtypes.int4,
]


def _sample(dtype, shape) -> np.ndarray:
    dt = np.dtype(dtype)
    # Random raw bits cover every pattern of the type (NaNs, infs, subnormals, -0.0) for
    # float kinds; for sub-byte ints, values in range.
    if dt == np.dtype(ml_dtypes.int4):
        return _RNG.integers(-8, 8, size=shape).astype(dt)
    if dt == np.bool_:
        return _RNG.integers(0, 2, size=shape).astype(bool)
    raw = _RNG.integers(0, 256, size=(*shape, dt.itemsize), dtype=np.uint8)
    return np.ascontiguousarray(raw).view(dt).reshape(shape)


@pytest.mark.parametrize("dtype", _DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (0, 3), (5,), (2, 3, 4)], ids=str)
def test_every_dtype_and_shape_round_trips_bit_for_bit(tmp_path, dtype, shape):
    want = _sample(dtype, shape)
    path = write_goldens(tmp_path / "g.h5", {"x.y": want}, classes={"x.y": "bitwise"})
    with open_goldens(path) as g:
        got = g["x.y"]
        info = g.info("x.y")
    _assert_exact(got, want)
    assert info == ArrayInfo("x.y", shape, np.dtype(dtype), "bitwise", info.sha256, -1)


def test_nan_payloads_signed_zeros_and_infs_survive(tmp_path):
    f32 = np.array([0x7FC00001, 0xFFC12345, 0x7F800001, 0x80000000, 0x7F800000], np.uint32)
    f64 = np.array([0x7FF8000000000001, 0xFFF0000000000002, 0x8000000000000000], np.uint64)
    bf16 = np.array([0x7FC1, 0xFF81, 0x8000, 0x7F80], np.uint16)
    f16 = np.array([0x7E01, 0xFC01, 0x8000], np.uint16)
    arrays = {
        "f32": f32.view(np.float32),
        "f64": f64.view(np.float64),
        "bf16": bf16.view(ml_dtypes.bfloat16),
        "f16": f16.view(np.float16),
    }
    path = write_goldens(tmp_path / "g.h5", arrays)
    with open_goldens(path) as g:
        for key, want in arrays.items():
            _assert_exact(g[key], want)


def test_large_array_round_trips(tmp_path):
    want = np.arange(4 * 1024 * 1024, dtype=np.float32).reshape(2048, 2048)
    path = write_goldens(tmp_path / "big.h5", {"big": want})
    with open_goldens(path) as g:
        _assert_exact(g["big"], want)


_TRICKY_KEYS = [
    "a.b",
    "a.b.c",  # a key that extends another key
    "a",
    "logits.llama",
    "taps.llama.set0.layers.3.mlp.down_proj",
    "traj.remat.step1.components.layers.0.self_attn.q_proj.V",
    "x/y",
    "pct%2F",
    "%value",
    "%value.%value",
    "ünï.cødé",
    "sp ace.tab\tbed",
]


def test_keys_round_trip_exactly_including_prefixes_and_escapes(tmp_path):
    arrays = {k: np.full((2,), i, np.int32) for i, k in enumerate(_TRICKY_KEYS)}
    path = write_goldens(tmp_path / "g.h5", arrays)
    with open_goldens(path) as g:
        assert g.keys() == sorted(_TRICKY_KEYS)
        assert g.is_parity_file
        for k, want in arrays.items():
            assert k in g
            _assert_exact(g[k], want)


_segment = st.text(st.characters(blacklist_characters=".\x00", codec="utf-8"), min_size=1)


@given(st.lists(_segment, min_size=1, max_size=4))
def test_encode_decode_is_the_identity_on_valid_keys(segments):
    key = ".".join(segments)
    path = store.encode_key(key)
    assert store.decode_path(path) == key
    assert store.VALUE_NAME not in path.split("/")


@pytest.mark.parametrize("key", ["", "a..b", ".a", "a.", "nul\x00here"])
def test_keys_hdf5_cannot_hold_are_refused(tmp_path, key):
    with pytest.raises(GoldenKeyError, match="golden key"):
        write_goldens(tmp_path / "g.h5", {key: np.zeros(1)})
    assert _dir_listing(tmp_path) == []


def test_root_and_dataset_attributes_follow_the_schema(tmp_path):
    arrays = {"b": np.zeros(2, ml_dtypes.bfloat16), "a": np.ones(3), "c": np.int8(4)}
    prov = {"z": 1, "a": [1, 2], "m": None, "jax": "0.10.2", "isa_cap": None}
    path = write_goldens(
        tmp_path / "g.h5",
        arrays,
        classes={"a": "fp32_reassoc"},
        class_map_json='{"taps.*": "fp32_reassoc"}',
        provenance=Provenance.from_json_dict(prov),
        order=["c", "a"],
    )
    with h5py.File(path, "r") as h5:
        f: Any = h5  # h5py's stubs type every item as Dataset | Group | Datatype
        assert int(f.attrs["schema_version"]) == SCHEMA_VERSION
        assert int(f.attrs["n_arrays"]) == 3
        # Text is stored as fixed-length UTF-8 strings, which h5py reads as bytes.
        assert f.attrs["provenance"] == json.dumps(prov, sort_keys=True).encode()
        b = f["b/%value"]
        assert b.dtype == np.uint16 and b.attrs["dtype"] == b"bfloat16"
        assert b.attrs["class"] == b"" and int(b.attrs["order"]) == -1
        assert f["a/%value"].attrs["class"] == b"fp32_reassoc"
        assert f["a/%value"].chunks is None and f["a/%value"].compression is None
    with open_goldens(path) as g:
        assert g.schema_version == SCHEMA_VERSION
        assert g.provenance.to_json_dict() == prov
        assert g.provenance.jax == "0.10.2" and g.provenance.isa_cap is None
        assert g.class_map_json == '{"taps.*": "fp32_reassoc"}'
        assert [g.info(k).order for k in ("a", "b", "c")] == [1, -1, 0]
        loaded = g.load_all()
    assert list(loaded) == ["a", "b", "c"]
    _assert_exact(loaded["c"], np.array(4, np.int8))


def test_jax_arrays_are_accepted(tmp_path):
    jnp = pytest.importorskip("jax.numpy")
    want = jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3)
    path = write_goldens(tmp_path / "g.h5", {"j": want})
    with open_goldens(path) as g:
        _assert_exact(g["j"], np.asarray(want))


def test_unknown_keys_in_classes_or_order_are_refused(tmp_path):
    with pytest.raises(GoldenKeyError, match="classes names keys"):
        write_goldens(tmp_path / "g.h5", {"a": np.zeros(1)}, classes={"typo": "bitwise"})
    with pytest.raises(GoldenKeyError, match="order names keys"):
        write_goldens(tmp_path / "g.h5", {"a": np.zeros(1)}, order=["a", "typo"])
    with pytest.raises(GoldenKeyError, match="more than once"):
        write_goldens(tmp_path / "g.h5", {"a": np.zeros(1)}, order=["a", "a"])


# --------------------------------------------------------------------------- determinism

_CONTENT = textwrap.dedent(
    """
    import numpy as np, ml_dtypes
    from parity.store import Provenance
    arrays = {
        "taps.l.0": np.arange(12, dtype=np.float32).reshape(3, 4),
        "taps.l": np.linspace(-1, 1, 7).astype(ml_dtypes.bfloat16),
        "z.scalar": np.float64(3.5),
        "e": np.zeros((0, 3), np.int16),
        "b": np.array([True, False]),
    }
    kwargs = dict(
        classes={"taps.l.0": "fp32_reassoc"},
        class_map_json='{"taps.*": "fp32_reassoc"}',
        provenance=Provenance(jax="0.10.2", base_sha="abc"),
        order=["taps.l", "taps.l.0"],
    )
    """
)


def _write_content(path: Path) -> None:
    ns: dict = {}
    exec(_CONTENT, ns)
    write_goldens(path, ns["arrays"], **ns["kwargs"])


def test_same_content_gives_identical_bytes_even_a_second_later(tmp_path):
    _write_content(tmp_path / "one.h5")
    # HDF5 timestamps have one-second resolution: cross a second so any would show.
    time.sleep(1.1)
    _write_content(tmp_path / "two.h5")
    assert (tmp_path / "one.h5").read_bytes() == (tmp_path / "two.h5").read_bytes()


def test_same_content_gives_identical_bytes_in_another_process(tmp_path):
    _write_content(tmp_path / "here.h5")
    script = _CONTENT + textwrap.dedent(
        f"""
        from parity.store import write_goldens
        write_goldens({str(tmp_path / "there.h5")!r}, arrays, **kwargs)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert (tmp_path / "here.h5").read_bytes() == (tmp_path / "there.h5").read_bytes()


def test_other_processes_can_read_while_a_file_is_open(tmp_path):
    path = tmp_path / "g.h5"
    _write_content(path)
    script = textwrap.dedent(
        f"""
        from parity.store import open_goldens
        with open_goldens({str(path)!r}) as g:
            print(sorted(g.load_all()))
        """
    )
    with open_goldens(path) as g:
        g.load_all()
        out = subprocess.run(
            [sys.executable, "-c", script], check=True, timeout=60, capture_output=True, text=True
        )
    assert "taps.l.0" in out.stdout


# --------------------------------------------------------------------------- atomic writes


@pytest.mark.parametrize(
    "bad",
    [np.array([object(), 1], dtype=object), np.array(["a", "b"]), np.array(["2020"], "M8[D]")],
    ids=["object", "str", "datetime"],
)
def test_a_failed_write_leaves_the_destination_and_no_temp_files(tmp_path, bad):
    dest = tmp_path / "g.h5"
    _write_content(dest)
    before = dest.read_bytes()
    # "m" sorts between the valid keys, so the failure happens mid-write.
    arrays = {"a": np.ones(3), "m": bad, "z": np.zeros(2)}
    with pytest.raises(UnsupportedDtypeError, match="cannot be stored exactly"):
        write_goldens(dest, arrays)
    assert dest.read_bytes() == before
    assert _dir_listing(tmp_path) == ["g.h5"]


def test_a_failing_rename_leaves_the_destination_and_no_temp_files(tmp_path, monkeypatch):
    dest = tmp_path / "g.h5"
    _write_content(dest)
    before = dest.read_bytes()

    def refuse(*_args):
        raise OSError("disk on fire")

    monkeypatch.setattr(writer.os, "replace", refuse)
    with pytest.raises(OSError, match="disk on fire"):
        write_goldens(dest, {"a": np.ones(3)})
    assert dest.read_bytes() == before
    assert _dir_listing(tmp_path) == ["g.h5"]


def test_written_files_are_readable_by_others(tmp_path):
    path = write_goldens(tmp_path / "g.h5", {"a": np.ones(1)})
    assert path.stat().st_mode & 0o777 == 0o644


# --------------------------------------------------------------------------- refusals


def test_a_missing_file_is_refused_with_the_repin_command(tmp_path):
    with pytest.raises(GoldenMissingError, match="parity repin"):
        open_goldens(tmp_path / "nope.h5")


def test_a_file_that_is_not_hdf5_is_refused(tmp_path):
    path = tmp_path / "g.h5"
    path.write_text("not hdf5 at all\n")
    with pytest.raises(GoldenFormatError, match="not a readable HDF5 file"):
        open_goldens(path)


def test_a_truncated_file_is_refused_and_left_alone(tmp_path):
    path = write_goldens(tmp_path / "g.h5", {"a": np.arange(100_000, dtype=np.float64)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    before = path.read_bytes()
    with pytest.raises(GoldenFormatError, match="truncated"):
        open_goldens(path)
    assert path.read_bytes() == before


def test_a_flipped_byte_in_the_data_is_reported_as_corrupt(tmp_path):
    want = np.arange(64, dtype=np.float32)
    path = write_goldens(tmp_path / "g.h5", {"good": np.ones(4), "taps.x": want})
    with h5py.File(path, "r") as f:
        digest = f["taps/x/%value"].attrs["sha256"].decode()  # pyright: ignore[reportAttributeAccessIssue]
    flip_stored_byte(path, "taps/x/%value", 17, 0x01)
    with open_goldens(path) as g:
        _assert_exact(g["good"], np.ones(4))  # other arrays still load
        with pytest.raises(GoldenCorruptError) as err:
            g["taps.x"]
    msg = str(err.value)
    assert str(path) in msg and "'taps.x'" in msg and digest in msg and "repin" in msg


def test_a_newer_schema_is_refused(tmp_path):
    path = write_goldens(tmp_path / "g.h5", {"a": np.ones(1)})
    with h5py.File(path, "r+") as f:
        f.attrs["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(GoldenSchemaError, match="newer parity; upgrade"):
        open_goldens(path)


def test_an_external_link_is_refused(tmp_path):
    other = write_goldens(tmp_path / "other.h5", {"a": np.ones(1)})
    path = tmp_path / "g.h5"
    with h5py.File(path, "w") as f:
        f["local"] = np.zeros(2)
        f["far"] = h5py.ExternalLink(other.name, "/a/%value")
    with pytest.raises(GoldenUnsafeError, match="external link 'far'"):
        open_goldens(path)


def test_a_dataset_with_external_storage_is_refused(tmp_path):
    raw = tmp_path / "raw.bin"
    raw.write_bytes(np.arange(4, dtype=np.float64).tobytes())
    path = tmp_path / "g.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("ext", shape=(4,), dtype="<f8", external=[(str(raw), 0, 32)])
    with pytest.raises(GoldenUnsafeError, match="external storage"):
        open_goldens(path)


def test_a_virtual_dataset_is_refused(tmp_path):
    src = tmp_path / "src.h5"
    with h5py.File(src, "w") as f:
        f["data"] = np.arange(4.0)
    layout = h5py.VirtualLayout(shape=(4,), dtype="f8")
    layout[:] = h5py.VirtualSource(str(src), "data", shape=(4,))
    path = tmp_path / "g.h5"
    with h5py.File(path, "w") as f:
        f.create_virtual_dataset("virt", layout)
    with pytest.raises(GoldenUnsafeError, match="virtual dataset 'virt'"):
        open_goldens(path)


def test_a_dangling_soft_link_is_refused_but_a_resolvable_one_is_not(tmp_path):
    path = tmp_path / "g.h5"
    with h5py.File(path, "w") as f:
        f["grp/x"] = np.zeros(2)
        f["alias"] = h5py.SoftLink("/grp/x")
    with open_goldens(path) as g:
        assert g.keys() == ["grp.x"]
    with h5py.File(path, "r+") as f:
        f["lost"] = h5py.SoftLink("/nowhere")
    with pytest.raises(GoldenUnsafeError, match="resolves to nothing"):
        open_goldens(path)


def test_all_refusals_share_a_base_class():
    for exc in (
        GoldenMissingError,
        GoldenFormatError,
        GoldenSchemaError,
        GoldenUnsafeError,
        GoldenCorruptError,
        GoldenKeyError,
        UnsupportedDtypeError,
    ):
        assert issubclass(exc, GoldenStoreError)


def test_an_unknown_key_says_what_is_there(tmp_path):
    path = write_goldens(tmp_path / "g.h5", {"taps.a": np.ones(1), "taps.b": np.ones(1)})
    with open_goldens(path) as g, pytest.raises(KeyError, match=r"taps\.a"):
        g["taps.c"]


# --------------------------------------------------------------------------- plain HDF5


def test_plain_hdf5_files_are_readable_with_dotted_keys(tmp_path):
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        f["logits"] = np.arange(3, dtype=np.float32)
        f.create_group("taps/layers").create_dataset("0", data=np.ones((2, 2)))
        f["scalar"] = np.int64(7)
    with open_goldens(path) as g:
        assert not g.is_parity_file
        assert g.schema_version is None and g.class_map_json == ""
        assert g.provenance == Provenance() and g.provenance.is_empty
        assert g.keys() == ["logits", "scalar", "taps.layers.0"]
        assert g.info("taps.layers.0") == ArrayInfo(
            "taps.layers.0", (2, 2), np.dtype("float64"), "", None, -1
        )
        _assert_exact(g["taps.layers.0"], np.ones((2, 2)))
        _assert_exact(g["scalar"], np.array(7, np.int64))


def test_a_parity_file_edited_by_hand_is_refused(tmp_path):
    path = write_goldens(tmp_path / "g.h5", {"a": np.ones(1)})
    with h5py.File(path, "r+") as f:
        f["stray"] = np.zeros(1)
    with pytest.raises(GoldenFormatError, match="edited by hand"):
        open_goldens(path)


# --------------------------------------------------------------------------- the index


def _index(path: Path) -> list[dict[str, Any]]:
    with h5py.File(path, "r") as f:
        return json.loads(f.attrs[store.INDEX_ATTR])


def _reseal(f: h5py.File) -> None:
    """Recompute the metadata checksum after an edit, as a deliberate forger would, so a
    test reaches the checks behind it."""
    a: Any = f.attrs
    meta = meta_digest(
        int(a["schema_version"]),
        a["class_map"].decode(),
        a["provenance"].decode(),
        int(a["n_arrays"]),
        a["index"].decode(),
    )
    _set_text(f, store.META_ATTR, meta)


def _set_text(f: h5py.File, name: str, text: str) -> None:
    writer.set_text(f.attrs, name, text)


def _rewrite_index(path: Path, rows: Any, *, reseal: bool = True) -> None:
    with h5py.File(path, "r+") as f:
        _set_text(f, store.INDEX_ATTR, rows if isinstance(rows, str) else json.dumps(rows))
        if reseal:
            _reseal(f)


def _as_schema_1(f: h5py.File, *, keep_index: bool = True) -> None:
    """Turn a file into what parity wrote before the metadata checksum (and the index)."""
    f.attrs["schema_version"] = np.int64(1)
    del f.attrs[store.META_ATTR]
    for name in ("class_map", "provenance", store.INDEX_ATTR):  # variable-length, as then
        f.attrs[name] = f.attrs[name].decode()  # pyright: ignore[reportAttributeAccessIssue]
    if not keep_index:
        del f.attrs[store.INDEX_ATTR]


def _indexed_file(tmp_path: Path) -> Path:
    arrays = {
        "taps.b": np.arange(6, dtype=np.float32).reshape(2, 3),
        "taps.a": np.linspace(0, 1, 4).astype(ml_dtypes.bfloat16),
        "taps.a.c": np.int8(3),
    }
    return write_goldens(
        tmp_path / "g.h5", arrays, classes={"taps.b": "fp32_reassoc"}, order=["taps.b"]
    )


def test_the_index_repeats_every_dataset_attribute_in_key_order(tmp_path):
    path = _indexed_file(tmp_path)
    rows = _index(path)
    assert [r["key"] for r in rows] == ["taps.a", "taps.a.c", "taps.b"]
    with h5py.File(path, "r") as f:
        for row in rows:
            dset: Any = f[row["path"]]
            assert row["path"] == store.encode_key(row["key"]) + "/" + store.VALUE_NAME
            assert row["shape"] == list(dset.shape)
            for name in ("class", "dtype", "sha256"):
                assert row[name] == dset.attrs[name].decode(), name
            assert row["order"] == dset.attrs["order"]
    with open_goldens(path) as g:
        assert g.info("taps.b") == ArrayInfo(
            "taps.b", (2, 3), np.dtype("float32"), "fp32_reassoc", rows[2]["sha256"], 0
        )
        assert g.verify() == 3


def test_a_changed_sha256_in_the_index_is_corrupt_on_load(tmp_path):
    path = _indexed_file(tmp_path)
    rows = _index(path)
    rows[2]["sha256"] = "0" * 64
    _rewrite_index(path, rows)
    with open_goldens(path) as g:
        _assert_exact(g["taps.a.c"], np.array(3, np.int8))  # other arrays still load
        with pytest.raises(GoldenCorruptError, match=r"'taps\.b' is corrupt: expected sha256 0+,"):
            g["taps.b"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("shape", [3, 2]), ("dtype", "int32"), ("dtype", "float16")],
    ids=["shape", "same-width-dtype", "other-width-dtype"],
)
def test_an_index_that_misdescribes_the_stored_data_is_corrupt_on_load(tmp_path, field, value):
    path = _indexed_file(tmp_path)
    rows = _index(path)
    rows[2][field] = value
    _rewrite_index(path, rows)
    with open_goldens(path) as g, pytest.raises(GoldenCorruptError, match="but the index says"):
        g["taps.b"]


def test_an_index_that_relabels_arrays_is_refused_on_open(tmp_path):
    path = _indexed_file(tmp_path)
    rows = _index(path)
    # Swap two keys' paths (and digests, so each digest still matches the data it points at).
    rows[0]["path"], rows[2]["path"] = rows[2]["path"], rows[0]["path"]
    rows[0]["sha256"], rows[2]["sha256"] = rows[2]["sha256"], rows[0]["sha256"]
    _rewrite_index(path, rows)
    with pytest.raises(GoldenCorruptError, match=r"puts golden 'taps\.a' at 'taps/b/%value'"):
        open_goldens(path)


def test_an_index_that_drops_or_invents_a_key_is_refused_on_open(tmp_path):
    path = _indexed_file(tmp_path)
    rows = _index(path)
    _rewrite_index(path, rows[1:])
    with pytest.raises(GoldenCorruptError, match=r"not in the index: \['taps\.a'\]"):
        open_goldens(path)
    _rewrite_index(path, [*rows, {**rows[0], "key": "ghost", "path": "ghost/%value"}])
    with pytest.raises(GoldenCorruptError, match=r"in the index, no dataset: \['ghost'\]"):
        open_goldens(path)


@pytest.mark.parametrize(
    "bad",
    ["{not json", json.dumps({"key": "taps.a"}), "MISSING_FIELD", "BOOL_ORDER", "DUPLICATE"],
)
def test_a_malformed_index_is_refused_on_open(tmp_path, bad):
    path = _indexed_file(tmp_path)
    rows = _index(path)
    if bad == "MISSING_FIELD":
        del rows[0]["sha256"]
        bad = rows
    elif bad == "BOOL_ORDER":
        rows[0]["order"] = True
        bad = rows
    elif bad == "DUPLICATE":
        bad = [*rows, rows[0]]
    _rewrite_index(path, bad)
    with pytest.raises(GoldenFormatError, match="index"):
        open_goldens(path)


@pytest.mark.parametrize(
    ("attr", "value"),
    [("class", "bitwise"), ("order", np.int64(7)), ("sha256", "f" * 64), ("dtype", "int32")],
)
def test_verify_catches_a_dataset_attribute_that_disagrees_with_the_index(tmp_path, attr, value):
    path = _indexed_file(tmp_path)
    with h5py.File(path, "r+") as f:
        f["taps/b/%value"].attrs[attr] = value
    with open_goldens(path) as g:
        g.load_all()  # loading trusts the index, whose digests match the data
        with pytest.raises(GoldenCorruptError, match=rf"'taps\.b' disagree on {attr}"):
            g.verify()


def test_parity_show_verify_catches_a_dataset_attribute_that_disagrees(tmp_path, capsys):
    from parity import _cli as cli

    path = _indexed_file(tmp_path)
    assert cli.main(["show", str(path), "--verify"]) == cli.EXIT_OK
    with h5py.File(path, "r+") as f:
        f["taps/b/%value"].attrs["class"] = "bitwise"
    assert cli.main(["show", str(path)]) == cli.EXIT_OK  # show alone reads no attributes
    assert cli.main(["show", str(path), "--verify"]) == cli.EXIT_UNUSABLE
    assert "disagree on class_name" in capsys.readouterr().err


def test_a_file_without_an_index_is_read_through_the_dataset_attributes(tmp_path):
    path = _indexed_file(tmp_path)
    with open_goldens(path) as g:
        want = {k: (g.info(k), g[k]) for k in g}
    with h5py.File(path, "r+") as f:
        _as_schema_1(f, keep_index=False)
    with open_goldens(path) as g:
        assert g.schema_version == 1
        for key, (info, array) in want.items():
            assert g.info(key) == info
            _assert_exact(g[key], array)
        assert g.verify() == 3
    with h5py.File(path, "r+") as f:
        f["taps/b/%value"].attrs["sha256"] = "0" * 64
    with open_goldens(path) as g, pytest.raises(GoldenCorruptError, match=r"'taps\.b'"):
        g.verify()


def test_arrays_load_again_after_their_first_load(tmp_path):
    path = _indexed_file(tmp_path)
    with open_goldens(path) as g:
        first = g.load_all()
        for key, array in g.load_all().items():
            _assert_exact(array, first[key])


def test_every_hard_link_to_a_dataset_is_a_key(tmp_path):
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        f["grp/x"] = np.arange(3)
        f["alias"] = f["grp/x"]  # a second hard link to the same dataset
    with open_goldens(path) as g:
        assert g.keys() == ["alias", "grp.x"]
        _assert_exact(g["alias"], g["grp.x"])
        assert g.verify() == 2


def test_links_and_storage_outside_the_file_are_refused_in_indexed_files_too(tmp_path):
    raw = tmp_path / "raw.bin"
    raw.write_bytes(np.zeros(4, np.float32).tobytes())
    for edit, match in [
        (lambda f: f.__setitem__("taps/far", h5py.ExternalLink("x.h5", "/a")), "external link"),
        (lambda f: f.__setitem__("taps/lost", h5py.SoftLink("/nowhere")), "resolves to nothing"),
        (
            lambda f: f["taps"].create_dataset(
                "e/%value", shape=(4,), dtype="<f4", external=[(str(raw), 0, 16)]
            ),
            "external storage",
        ),
    ]:
        path = _indexed_file(tmp_path)
        with h5py.File(path, "r+") as f:
            edit(f)
        with pytest.raises(GoldenUnsafeError, match=match):
            open_goldens(path)


def test_ordered_keys_follow_the_pinned_order_and_leave_out_unordered_keys(tmp_path):
    from parity.store import open_goldens as _open, write_goldens as _write

    arrays = {k: np.zeros(1) for k in ("a", "b", "c", "free")}
    path = _write(tmp_path / "g.h5", arrays, order=["c", "a", "b"])
    with _open(path) as g:
        assert g.ordered_keys() == ["c", "a", "b"]


# --------------------------------------------------------------------------- metadata checksum


@pytest.mark.parametrize(
    ("attr", "value"),
    [
        ("provenance", json.dumps({"numpy": "2.0.0", "x64": True})),
        ("class_map", '{"rules": [["*", "close"]]}'),
        ("index", "SWAP_CLASS"),
        ("n_arrays", np.int64(2)),
    ],
)
def test_any_edited_root_attribute_breaks_the_metadata_checksum(tmp_path, attr, value):
    path = _indexed_file(tmp_path)
    with h5py.File(path, "r+") as f:
        if value == "SWAP_CLASS":
            rows = json.loads(f.attrs["index"])  # pyright: ignore[reportArgumentType]
            rows[0]["class"] = "bitwise"
            value = json.dumps(rows, sort_keys=True, separators=(",", ":"))
        if isinstance(value, str):
            _set_text(f, attr, value)
        else:
            f.attrs[attr] = value
    with pytest.raises(GoldenCorruptError, match="does not match its checksum meta_sha256"):
        open_goldens(path)


@pytest.mark.parametrize("edit", ["drop-meta", "extra-attr", "int-as-float", "renamed-version"])
def test_a_root_attribute_missing_added_or_retyped_is_refused(tmp_path, edit):
    path = _indexed_file(tmp_path)
    with h5py.File(path, "r+") as f:
        if edit == "drop-meta":
            del f.attrs[store.META_ATTR]
        elif edit == "extra-attr":
            f.attrs["note"] = "hi"
        elif edit == "int-as-float":
            f.attrs["schema_version"] = np.float64(2)
        else:  # a flipped byte in a name must not make the file a plain, unchecked one
            f.attrs["schema_versiom"] = f.attrs["schema_version"]
            del f.attrs["schema_version"]
    with pytest.raises(GoldenFormatError):
        open_goldens(path)


def test_schema_1_files_are_read_but_a_checksum_in_one_is_refused(tmp_path):
    path = _indexed_file(tmp_path)
    with open_goldens(path) as g:
        want = g.load_all()
    with h5py.File(path, "r+") as f:
        _as_schema_1(f)
    with open_goldens(path) as g:
        assert g.schema_version == 1
        assert g.verify() == 3
        for key, array in g.load_all().items():
            _assert_exact(array, want[key])
    with h5py.File(path, "r+") as f:  # a version of 2 damaged into 1 keeps its checksum
        f.attrs[store.META_ATTR] = "0" * 64
    with pytest.raises(GoldenFormatError, match=r"unknown.*meta_sha256"):
        open_goldens(path)


def test_a_plain_file_with_parity_dataset_names_is_refused(tmp_path):
    path = _indexed_file(tmp_path)
    with h5py.File(path, "r+") as f:
        for name in list(f.attrs):
            del f.attrs[name]
    with pytest.raises(GoldenFormatError, match="parity names arrays"):
        open_goldens(path)


def test_names_that_are_not_utf8_are_printed_escaped(tmp_path):
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(b"ok\xffname", data=np.arange(2))
    with open_goldens(path) as g:
        assert g.keys() == ["ok\\xffname"]
        _assert_exact(g["ok\\xffname"], np.arange(2))
        err = g._missing("x\udcff\n")  # pyright: ignore[reportPrivateUsage]
        assert str(err).encode("utf-8") and "\n" not in str(err)


def test_every_hdf5_failure_while_reading_is_a_golden_read_error(tmp_path, monkeypatch):
    path = _indexed_file(tmp_path)
    with open_goldens(path) as g:

        def boom(*args: Any, **kwargs: Any) -> None:
            raise OSError("Can't synchronously read data (incorrect metadata checksum)")

        monkeypatch.setattr(g, "_read_indexed", boom)
        with pytest.raises(store.GoldenReadError, match=r"g\.h5: golden 'taps\.b': reading"):
            g["taps.b"]
