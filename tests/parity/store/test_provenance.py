"""Provenance: what is recorded, and how it reads and writes as JSON (how drift is graded
is `test_environment.py`'s)."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from parity.store import Provenance, open_goldens, write_goldens
from parity.store._provenance import collect_provenance, digest_sources, imported_distributions
from parity.store._provenance_record import FIELD_NAMES

GOLDENS = Path(__file__).resolve().parents[3] / "goldens"

_FIELDS = {
    "python",
    "jax",
    "jaxlib",
    "numpy",
    "h5py",
    "ml_dtypes",
    "platform",
    "machine",
    "cpu",
    "processor",
    "device_count",
    "processes",
    "xla_flags",
    "isa_cap",
    "x64",
    "backend",
    "device_kind",
    "matmul_precision",
    "base_sha",
    "producer_digest",
}


def test_provenance_records_every_field_and_is_json():
    prov = collect_provenance(base_sha="abc123", producer_digest="d" * 64, device_count=4)
    recorded = prov.to_json_dict()
    assert set(recorded) == _FIELDS  # each one, a None as null
    assert prov.jax == importlib.metadata.version("jax")
    assert prov.numpy == importlib.metadata.version("numpy")
    assert prov.device_count == 4
    assert prov.base_sha == "abc123" and prov.producer_digest == "d" * 64
    assert json.loads(json.dumps(recorded)) == recorded
    assert Provenance.from_json_dict(recorded) == prov


def test_the_fields_are_what_the_collector_records_and_the_harness_adds():
    # `packages`: what a producer run passes the collector (the distributions it imported)
    assert set(FIELD_NAMES) == _FIELDS | {"order", "calibration", "packages"}


def test_provenance_reads_flags_and_env_without_importing_jax(tmp_path):
    # A fresh process: whatever this pytest worker has imported does not leak in.
    script = textwrap.dedent(
        """
        import json, sys
        import parity, parity.store
        from parity.store._provenance import collect_provenance
        prov = collect_provenance().to_json_dict()
        leaked = sorted(m for m in ("jax", "parity._compile_stats") if m in sys.modules)
        print(json.dumps({"prov": prov, "leaked": leaked}))
        """
    )
    flags = "--xla_force_host_platform_device_count=4 --xla_cpu_max_isa=AVX2"
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_ENABLE_X64": "1"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True
    )
    result = json.loads(out.stdout)
    assert result["leaked"] == []
    prov = result["prov"]
    assert prov["device_count"] == 4
    assert prov["isa_cap"] == "AVX2"
    assert prov["xla_flags"] == flags
    assert prov["x64"] is True


def test_source_digest_depends_on_bytes_and_names_not_on_location(tmp_path):
    tree = tmp_path / "a" / "producers"
    (tree / "sub").mkdir(parents=True)
    (tree / "one.py").write_text("x = 1\n")
    (tree / "sub" / "two.py").write_text("y = 2\n")
    (tree / "__pycache__").mkdir()
    (tree / "__pycache__" / "one.cpython-311.pyc").write_bytes(b"\x00junk")
    d0 = digest_sources([tree])

    moved = tmp_path / "elsewhere" / "producers"
    shutil.copytree(tree, moved)
    (moved / "__pycache__" / "one.cpython-311.pyc").write_bytes(b"\x00other junk")
    assert digest_sources([moved]) == d0

    (moved / "one.py").write_text("x = 2\n")
    assert digest_sources([moved]) != d0
    (moved / "one.py").write_text("x = 1\n")
    (moved / "one.py").rename(moved / "uno.py")
    assert digest_sources([moved]) != d0


def test_source_digest_ignores_argument_order_and_refuses_missing_paths(tmp_path):
    (tmp_path / "a.py").write_text("a\n")
    (tmp_path / "b.py").write_text("b\n")
    files = [tmp_path / "a.py", tmp_path / "b.py"]
    assert digest_sources(files) == digest_sources(files[::-1])
    assert digest_sources(files) == digest_sources([tmp_path])
    with pytest.raises(FileNotFoundError, match="cannot digest"):
        digest_sources([tmp_path / "missing.py"])


# --------------------------------------------------------------------------- as JSON

#: What another parity version may write: a key this one does not know, a known key recorded
#: as null, one of another type than this one reads, and a nested calibration.
_FOREIGN: dict[str, Any] = {
    "jax": "0.4.30",
    "device_count": 4,
    "x64": False,
    "isa_cap": None,
    "processes": "2",
    "calibration": {"summary": "s", "spread": {"labels": ["repeat"], "keys": {"a": [0.5]}}},
    "order": "dataflow",
    "a_key_of_the_future": {"nested": [1, None, 2.5]},
}


def test_a_provenance_reads_what_it_knows_and_keeps_the_rest_as_recorded():
    prov = Provenance.from_json_dict(_FOREIGN)
    assert prov.jax == "0.4.30" and prov.device_count == 4 and prov.x64 is False
    assert prov.order == "dataflow" and prov.calibration == _FOREIGN["calibration"]
    assert prov.isa_cap is None and prov.base_sha is None
    assert prov.processes is None  # "2" is no count: kept as recorded, not read
    assert prov.unknown == {"processes": "2", "a_key_of_the_future": {"nested": [1, None, 2.5]}}
    assert prov.to_json_dict() == _FOREIGN
    # What a field-by-field comparison walks: every field, and the raw values kept.
    walked = prov.by_name()
    assert set(walked) == {*FIELD_NAMES, "a_key_of_the_future"} and walked["processes"] == "2"


def test_an_edit_is_a_replace_and_a_field_set_wins_over_its_raw_value():
    prov = Provenance.from_json_dict(_FOREIGN)
    edited = dataclasses.replace(prov, base_sha="b" * 40, processes=2, isa_cap="AVX2")
    assert edited.to_json_dict() == _FOREIGN | {
        "base_sha": "b" * 40,
        "processes": 2,
        "isa_cap": "AVX2",
    }
    assert prov.to_json_dict() == _FOREIGN  # frozen: the original stays as read
    assert Provenance().is_empty and Provenance().to_json_dict() == {}
    assert not Provenance(isa_cap=None, nulls=frozenset({"isa_cap"})).is_empty


def test_a_header_with_unknown_keys_writes_back_byte_for_byte(tmp_path: Path):
    first = write_goldens(
        tmp_path / "a.h5", {"w": np.zeros(3)}, provenance=Provenance.from_json_dict(_FOREIGN)
    )
    with open_goldens(first) as gf:
        read = gf.provenance
    assert read.to_json_dict() == _FOREIGN
    again = write_goldens(tmp_path / "b.h5", {"w": np.zeros(3)}, provenance=read)
    with h5py.File(first, "r") as f, h5py.File(again, "r") as g:
        assert f.attrs["provenance"] == g.attrs["provenance"]
        assert json.loads(f.attrs["provenance"]) == _FOREIGN  # pyright: ignore[reportArgumentType]


def _committed_goldens() -> list[Path]:
    return sorted(GOLDENS.glob("*.h5"))


@pytest.mark.parametrize("path", _committed_goldens(), ids=lambda p: p.name)
def test_every_committed_golden_reads_into_a_provenance_that_writes_its_json(path: Path):
    # The other path: the root attribute read with h5py and json, not through the store.
    # Without HDF5's file locking, as the store opens goldens: a process that holds a file
    # open (a golden check in this worker) cannot open it again under other locking flags.
    with h5py.File(path, "r", locking=False) as f:
        raw = json.loads(f.attrs["provenance"])  # pyright: ignore[reportArgumentType]
    with open_goldens(path) as gf:
        prov = gf.provenance
    assert prov.to_json_dict() == raw
    assert json.dumps(prov.to_json_dict(), sort_keys=True) == json.dumps(raw, sort_keys=True)
    assert prov.base_sha == raw["base_sha"] and prov.device_count == raw["device_count"]
    assert prov.unknown == {}  # every key a committed golden records is a field


def test_the_committed_goldens_are_there_to_read():
    assert len(_committed_goldens()) >= 5


def test_the_distributions_imported_since_are_the_producers_with_their_versions() -> None:
    """Issue 74: what a producer run records as `packages`: each distribution whose module
    was imported after the snapshot, with its version (as the package says it), never a
    standard-library module nor the harness itself."""
    import hypothesis

    before = set(sys.modules) - {"hypothesis", "json", "parity"}
    found = imported_distributions(before)
    assert found.get("hypothesis") == hypothesis.__version__, found
    assert "parity-harness" not in found and "json" not in found, found
    assert imported_distributions(set(sys.modules)) == {}
    recorded = collect_provenance(packages=found).to_json_dict()
    assert recorded["packages"] == found
    assert "packages" not in collect_provenance().to_json_dict()  # only a producer run knows
