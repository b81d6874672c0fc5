"""Provenance: what is recorded (how drift is graded is `test_environment.py`'s)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from parity.store._provenance import collect_provenance, digest_sources

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
    assert set(prov) == _FIELDS
    assert prov["jax"] == importlib.metadata.version("jax")
    assert prov["numpy"] == importlib.metadata.version("numpy")
    assert prov["device_count"] == 4
    assert prov["base_sha"] == "abc123" and prov["producer_digest"] == "d" * 64
    assert json.loads(json.dumps(prov)) == prov


def test_provenance_reads_flags_and_env_without_importing_jax(tmp_path):
    # A fresh process: whatever this pytest worker has imported does not leak in.
    script = textwrap.dedent(
        """
        import json, sys
        import parity, parity.store
        from parity.store._provenance import collect_provenance
        prov = collect_provenance()
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
