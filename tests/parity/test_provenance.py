"""Provenance: what is recorded, how drift is graded, and what each bitwise policy does."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from parity.store.provenance import (
    DEFAULT_RELAX_ULPS,
    Drift,
    bitwise_policy,
    collect_provenance,
    digest_sources,
    drift,
)

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
        from parity.store.provenance import collect_provenance
        prov = collect_provenance()
        leaked = sorted(m for m in ("jax", "parity.compile_stats") if m in sys.modules)
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


# --------------------------------------------------------------------------- drift


def _prov(**changes):
    base = {
        "python": "3.11.7",
        "jax": "0.10.2",
        "jaxlib": "0.10.2",
        "numpy": "2.4.6",
        "h5py": "3.16.0",
        "ml_dtypes": "0.6.0",
        "platform": "Linux-6.1-x86_64",
        "machine": "x86_64",
        "processor": "AMD EPYC",
        "device_count": 1,
        "xla_flags": "--xla_force_host_platform_device_count=1 --xla_cpu_max_isa=AVX2",
        "isa_cap": "AVX2",
        "x64": False,
        "base_sha": "abc",
        "producer_digest": "p1",
    }
    base.update(changes)
    return base


def test_identical_environments_have_no_drift():
    assert drift(_prov(), _prov()) == []


@pytest.mark.parametrize(
    ("field", "value", "severity"),
    [
        ("jax", "0.10.3", "bits"),
        ("jaxlib", "0.10.3", "bits"),
        ("isa_cap", "SSE4_2", "bits"),
        ("machine", "aarch64", "bits"),
        ("x64", True, "bits"),
        ("device_count", 4, "bits"),
        ("python", "3.12.1", "info"),
        ("numpy", "2.5.0", "info"),
        ("h5py", "3.17.0", "info"),
        ("platform", "Linux-6.8-x86_64", "info"),
        ("producer_digest", "p2", "info"),
        # Under the same ISA cap the CPU model cannot pick other kernels.
        ("processor", "Intel Xeon", "info"),
    ],
)
def test_each_field_drifts_with_its_severity(field, value, severity):
    assert drift(_prov(), _prov(**{field: value})) == [
        Drift(field, _prov()[field], value, severity)
    ]


def test_processor_drift_can_change_bits_without_an_isa_cap():
    uncapped = {"isa_cap": None, "xla_flags": ""}
    found = drift(_prov(**uncapped), _prov(**uncapped, processor="Intel Xeon"))
    assert found == [Drift("processor", "AMD EPYC", "Intel Xeon", "bits")]


def test_reordered_xla_flags_are_not_drift_but_a_new_flag_is():
    flags = _prov()["xla_flags"]
    reordered = " ".join(reversed(flags.split()))
    assert drift(_prov(), _prov(xla_flags=reordered)) == []
    found = drift(_prov(), _prov(xla_flags=flags + " --xla_cpu_enable_fast_math=true"))
    assert [(d.field, d.severity) for d in found] == [("xla_flags", "bits")]


def test_a_check_run_without_base_sha_is_not_drift():
    assert drift(_prov(), _prov(base_sha=None, producer_digest=None)) == []


def test_bits_drifts_come_first():
    found = drift(_prov(), _prov(numpy="9", jaxlib="9", python="9"))
    assert [d.severity for d in found] == ["bits", "info", "info"]


# --------------------------------------------------------------------------- policy

_BITS = [Drift("jaxlib", "0.10.2", "0.10.3", "bits")]
_INFO = [Drift("numpy", "2.4.6", "2.5.0", "info")]


def test_warn_keeps_bitwise_and_says_drift_may_explain_failures():
    decision = bitwise_policy(_BITS + _INFO)
    assert decision.mode == "warn"
    assert decision.bitwise_max_ulp is None and not decision.error
    assert decision.bits_drifts == tuple(_BITS)
    assert "may explain bitwise failures" in decision.header[0]
    assert "jaxlib" in decision.header[0] and "numpy" in decision.header[1]


def test_relax_checks_bitwise_as_ulp_only_under_bits_drift():
    decision = bitwise_policy(_BITS, "relax")
    assert decision.bitwise_max_ulp == DEFAULT_RELAX_ULPS == 2 and not decision.error
    assert bitwise_policy(_BITS, "relax", relax_ulps=4).bitwise_max_ulp == 4
    assert bitwise_policy(_INFO, "relax").bitwise_max_ulp is None


def test_strict_makes_bits_drift_an_error_but_not_info_drift():
    decision = bitwise_policy(_BITS, "strict")
    assert decision.error and decision.bitwise_max_ulp is None
    assert "refuses to compare" in decision.header[0]
    assert not bitwise_policy(_INFO, "strict").error


@pytest.mark.parametrize("mode", ["warn", "relax", "strict"])
def test_no_drift_changes_nothing_in_any_mode(mode):
    decision = bitwise_policy([], mode)
    assert (decision.bitwise_max_ulp, decision.error, decision.header) == (None, False, ())


def test_unknown_policy_and_bad_ulps_are_refused():
    with pytest.raises(ValueError, match="'strict', 'relax' or 'warn'"):
        bitwise_policy(_BITS, "lenient")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="at least 1"):
        bitwise_policy(_BITS, "relax", relax_ulps=0)


def test_device_count_flag_is_not_counted_as_xla_flags_drift():
    from parity.store.provenance import drift as _drift

    golden = {"xla_flags": "--xla_force_host_platform_device_count=1 --xla_cpu_max_isa=AVX2"}
    assert [d.field for d in _drift(golden, {"xla_flags": "--xla_cpu_max_isa=AVX2"})] == []
    moved = _drift(golden, {"xla_flags": "--xla_cpu_max_isa=SSE4_2"})
    assert [d.field for d in moved] == ["xla_flags"]


def test_a_different_cpu_under_the_same_isa_cap_is_a_bits_drift():
    # Measured: goldens pinned under --xla_cpu_max_isa=AVX2 on one "AMD EPYC" host differ in
    # their last bits on another whose model name reads the same (an AVX2-only family 25).
    golden = collect_provenance() | {"cpu": "AuthenticAMD family 25 model 17; avx avx2 avx512f"}
    current = collect_provenance()
    drifts = {d.field: d for d in drift(golden, current)}
    assert drifts["cpu"].severity == "bits"
    assert "processor" not in drifts  # the model name did not change
