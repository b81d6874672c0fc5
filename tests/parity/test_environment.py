"""Whether two environments differ, and how (`parity._environment`): each field's
severity, the calibrated dimensions, the changes in words, and what each bitwise policy
does. One function decides it for every face of parity."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from parity import _environment
from parity._environment import (
    DEFAULT_RELAX_ULPS,
    PERTURBED_KINDS,
    Dimension,
    Drift,
    EnvironmentDifference,
    environment_difference,
    layout_of,
)
from parity._environment_fingerprint import environment_fingerprint
from parity.calibration._perturbations import perturbations
from parity.machinery._config import ParityConfig
from parity.store import Provenance
from parity.store._provenance import collect_provenance
from parity.store._provenance_record import FIELD_NAMES


def _drifts(pinned, current) -> list[Drift]:
    """Every drift, "bits" first, as `environment_difference` grades them."""
    return list(environment_difference(pinned, current).drifts)


# --------------------------------------------------------------------------- drift


def _prov(**changes) -> Provenance:
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
    return Provenance.from_json_dict(base | changes)


def test_identical_environments_have_no_drift():
    assert _drifts(_prov(), _prov()) == []


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
    assert _drifts(_prov(), _prov(**{field: value})) == [
        Drift(field, getattr(_prov(), field), value, severity)
    ]


def test_a_package_the_producers_imported_at_another_version_is_a_drift_that_moves_bits():
    """Issue 74: the distributions both sides record are compared, each one that moved said
    with both versions; one only a side imported, or a side that records none (goldens
    pinned before `packages` was), is no drift. A baseline's name is not keyed by them:
    the base's producers may import other packages than the tree's, in the same
    environment."""
    pinned = _prov(packages={"optax": "0.2.3", "chex": "0.1.86", "flax": "0.10.0"})
    here = _prov(packages={"optax": "0.2.4", "chex": "0.1.86", "einops": "0.8.0"})
    (drift,) = _drifts(pinned, here)
    assert drift == Drift("packages", {"optax": "0.2.3"}, {"optax": "0.2.4"}, "bits")
    assert str(drift) == "packages: optax 0.2.3 -> 0.2.4 (bits)"
    difference = environment_difference(pinned, here)
    assert difference.moves_bits and difference.changes == (str(drift),)
    assert _drifts(_prov(), here) == [] and _drifts(here, _prov()) == []
    assert _drifts(pinned, _prov(packages={"flax": "0.10.0", "einops": "1"})) == []
    fp = environment_fingerprint(_prov())
    assert environment_fingerprint(pinned) == fp == environment_fingerprint(here)


def test_processor_drift_can_change_bits_without_an_isa_cap():
    uncapped = {"isa_cap": None, "xla_flags": ""}
    found = _drifts(_prov(**uncapped), _prov(**uncapped, processor="Intel Xeon"))
    assert found == [Drift("processor", "AMD EPYC", "Intel Xeon", "bits")]


def test_reordered_xla_flags_are_not_drift_but_a_new_flag_is():
    flags = str(_prov().xla_flags)
    reordered = " ".join(reversed(flags.split()))
    assert _drifts(_prov(), _prov(xla_flags=reordered)) == []
    found = _drifts(_prov(), _prov(xla_flags=flags + " --xla_cpu_enable_fast_math=true"))
    assert [(d.field, d.severity) for d in found] == [("xla_flags", "bits")]


def test_a_check_run_without_base_sha_is_not_drift():
    assert _drifts(_prov(), _prov(base_sha=None, producer_digest=None)) == []


def test_bits_drifts_come_first():
    found = _drifts(_prov(), _prov(numpy="9", jaxlib="9", python="9"))
    assert [d.severity for d in found] == ["bits", "info", "info"]


# --------------------------------------------------------------------------- policy

_BITS = (Drift("jaxlib", "0.10.2", "0.10.3", "bits"),)
_INFO = (Drift("numpy", "2.4.6", "2.5.0", "info"),)
_BOTH = EnvironmentDifference(bits=_BITS, info=_INFO)


def test_warn_keeps_bitwise_and_says_drift_may_explain_failures():
    decision = _BOTH.policy()
    assert decision.mode == "warn"
    assert decision.bitwise_max_ulp is None and not decision.refused
    assert "may explain bitwise failures" in decision.header[0]
    assert "jaxlib" in decision.header[0] and "numpy" in decision.header[1]


def test_relax_checks_bitwise_as_ulp_only_under_bits_drift():
    decision = EnvironmentDifference(bits=_BITS).policy("relax")
    assert decision.bitwise_max_ulp == DEFAULT_RELAX_ULPS == 2 and not decision.refused
    assert EnvironmentDifference(bits=_BITS).policy("relax", relax_ulps=4).bitwise_max_ulp == 4
    assert EnvironmentDifference(info=_INFO).policy("relax").bitwise_max_ulp is None


def test_strict_makes_bits_drift_an_error_but_not_info_drift():
    decision = EnvironmentDifference(bits=_BITS).policy("strict")
    assert decision.refused and decision.bitwise_max_ulp is None
    assert "refuses to compare" in decision.header[0]
    assert not EnvironmentDifference(info=_INFO).policy("strict").refused


@pytest.mark.parametrize("mode", ["warn", "relax", "strict"])
def test_no_drift_changes_nothing_in_any_mode(mode):
    decision = EnvironmentDifference().policy(mode)
    assert (decision.bitwise_max_ulp, decision.refused, decision.header) == (None, False, ())


def test_unknown_policy_and_bad_ulps_are_refused():
    with pytest.raises(ValueError, match="'strict', 'relax' or 'warn'"):
        _BOTH.policy("lenient")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="at least 1"):
        _BOTH.policy("relax", relax_ulps=0)


def test_device_count_flag_is_not_counted_as_xla_flags_drift():
    golden = Provenance(xla_flags="--xla_force_host_platform_device_count=1 --xla_cpu_max_isa=AVX2")
    assert [d.field for d in _drifts(golden, Provenance(xla_flags="--xla_cpu_max_isa=AVX2"))] == []
    moved = _drifts(golden, Provenance(xla_flags="--xla_cpu_max_isa=SSE4_2"))
    assert [d.field for d in moved] == ["xla_flags"]


def test_a_different_cpu_under_the_same_isa_cap_is_a_bits_drift():
    # Measured: goldens pinned under --xla_cpu_max_isa=AVX2 on one "AMD EPYC" host differ in
    # their last bits on another whose model name reads the same (an AVX2-only family 25).
    golden = dataclasses.replace(
        collect_provenance(), cpu="AuthenticAMD family 25 model 17; avx avx2 avx512f"
    )
    current = collect_provenance()
    drifts = {d.field: d for d in _drifts(golden, current)}
    assert drifts["cpu"].severity == "bits"
    assert "processor" not in drifts  # the model name did not change


def test_the_dimensions_a_check_differs_in():
    pin = Provenance(device_count=1, isa_cap="AVX2", cpu="a")

    def dims(**changes):
        return environment_difference(pin, dataclasses.replace(pin, **changes)).dimensions

    assert dims() == ()
    assert [d.label for d in dims(device_count=4)] == ["devices=4"]
    two_by_two = dataclasses.replace(pin, device_count=4, processes=2)
    assert layout_of(two_by_two) == (2, 2)
    assert [d.label for d in dims(device_count=4, processes=2)] == ["processes=2x2"]
    assert [d.kind for d in dims(isa_cap="AVX")] == ["isa"]
    assert [d.kind for d in dims(cpu="b")] == ["cpu"]
    assert dims(cpu="b")[0] == Dimension("cpu", "isa", "processor (same isa cap)")


def test_the_changes_in_words_say_each_dimension_once_and_every_other_bits_drift():
    pin = _prov()
    moved = environment_difference(
        pin, _prov(device_count=4, isa_cap="AVX", xla_flags="--xla_cpu_max_isa=AVX", jax="9")
    )
    assert moved.changes == ("devices 1 -> 4", "isa cap AVX2 -> AVX", "jax: '0.10.2' -> '9' (bits)")
    assert moved.moves_bits
    same = environment_difference(pin, _prov(numpy="9"))
    assert same.changes == () and not same.moves_bits and same.info


def test_what_no_calibration_records_is_every_change_but_a_layout_and_an_isa_cap():
    pin = _prov(cpu="AuthenticAMD family 25 model 1; avx avx2")

    def unperturbed(**changes) -> tuple[str, ...]:
        return environment_difference(pin, dataclasses.replace(pin, **changes)).unperturbed

    avx = {"isa_cap": "AVX", "xla_flags": "--xla_cpu_max_isa=AVX"}
    assert unperturbed(device_count=4) == ()
    assert unperturbed(device_count=4, processes=2) == ()
    assert unperturbed(**avx) == ()
    assert unperturbed(jax="9", jaxlib="9") == (
        "jax: '0.10.2' -> '9' (bits)",
        "jaxlib: '0.10.2' -> '9' (bits)",
    )
    intel = "GenuineIntel family 6 model 85; avx avx2 avx512f"
    assert unperturbed(cpu=intel) == ("processor (same isa cap)",)
    # Under another cap the processor is no dimension of its own, and still moved.
    assert unperturbed(cpu=intel, **avx) == ("processor",)
    assert unperturbed(backend="tpu", device_kind="TPU v5 lite") == (
        "backend cpu -> tpu (TPU v5 lite)",
    )
    # The dimensions calibrate perturbs are the kinds of what it runs, a repeat aside.
    every = perturbations(["isa", "devices", "processes", "repeat"],
                          ParityConfig(root=Path("."), isa="AVX2", devices=1),
                          host_caps=["AVX", "AVX2"])  # fmt: skip
    assert {p.kind for p in every} - {"repeat"} == PERTURBED_KINDS


def test_a_file_without_provenance_is_not_compared_and_moves_no_bits():
    unknown = environment_difference(None, _prov())
    assert unknown.unknown == "GOLDEN records no provenance" and not unknown.moves_bits
    assert unknown.policy("strict").header == (
        "environment drift: not compared (GOLDEN records no provenance)",
    )
    assert not unknown.policy("strict").refused
    assert environment_difference(_prov(), None).unknown == "ACTUAL records no provenance"
    # An empty provenance is compared: every field it lacks drifted.
    assert environment_difference(Provenance(), _prov()).moves_bits


def test_the_fingerprint_changes_with_what_moves_bits_and_only_with_that():
    fp = environment_fingerprint(_prov())
    assert environment_fingerprint(_prov(numpy="9", base_sha="x")) == fp
    flags = " ".join(reversed(str(_prov().xla_flags).split()))
    assert environment_fingerprint(_prov(xla_flags=flags)) == fp
    assert environment_fingerprint(_prov(jaxlib="9")) != fp


def test_every_field_the_policy_names_is_a_provenance_field():
    named = {
        *_environment.BITS_FIELDS,
        *_environment.INFO_FIELDS,
        *_environment.NOT_ENVIRONMENT,
        *_environment.HOST_FIELDS,
        *_environment._CALIBRATED_FIELDS,  # pyright: ignore[reportPrivateUsage]
    }
    assert sorted(named - set(FIELD_NAMES)) == []
    # Every field is graded somewhere: "bits", "info", or not the environment.
    graded = {*_environment.BITS_FIELDS, *_environment.INFO_FIELDS, "processor"}
    assert sorted(set(FIELD_NAMES) - graded - _environment.NOT_ENVIRONMENT) == []


def test_a_key_only_another_parity_version_knows_is_compared_as_information():
    golden = Provenance.from_json_dict({"jax": "0.10.2", "future": 1})
    drifts = _drifts(golden, Provenance.from_json_dict({"jax": "0.10.2", "future": 2}))
    assert drifts == [Drift("future", 1, 2, "info")]
    assert _drifts(golden, golden) == []
