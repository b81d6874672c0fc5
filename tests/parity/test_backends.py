"""On any backend (docs/design.md, "On any backend"): the backend is part of an environment;
across backends the baseline re-produced here judges every key, and how far it lies from
the goldens is information; headers name both sides; calibrate runs what exists here and
skips the rest in one line each; a machine without sockets is one line, never a traceback.

CI has no accelerator: the goldens of a throwaway numpy project are marked as pinned on a
TPU (their provenance says so, and their arrays are moved as another backend's bits would
be), and checked on this CPU, the direction a CI machine checks an accelerator's goldens in.
The other direction ran on a TPU v5e (tools/accelerator_check.py; docs/adopting.md)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from parity._environment import (
    backend_note,
    describe_backend,
    environment_difference,
)
from parity._environment_fingerprint import environment_fingerprint
from parity.calibration._perturbations import Here, Perturbation, available
from parity.machinery._processes import NoSockets, WorkerFailed, free_port
from parity.store import Provenance, open_goldens, write_goldens

PRODUCERS = """\
import numpy as np

import model

BASE = np.linspace(1.0, 2.0, 8)


def group():
    return {
        "taps.x": (2 * BASE).astype(np.float32),
        "logits": (BASE + model.BUG).astype(np.float32),
    }


GROUPS = {"g": group}
CLASS_MAP = [("logits", "bitwise"), ("taps.*", "fp32_reassoc")]
"""
PYTHONPATH = os.environ.get("PYTHONPATH", "")
TABLE = 'producers = "producers.py"\nsrc = "src"\n'
#: How far the goldens pinned "on the TPU" lie from what this CPU produces: far beyond
#: every class, as a TPU's bfloat16 passes move a float32 result.
TPU_BITS = 1e-3

AMD = Provenance(
    processor="AMD EPYC 7B13",
    cpu="AuthenticAMD family 25 model 1; avx avx2 fma",
    isa_cap="AVX2",
    device_count=1,
    jax="0.10.2",
)
TPU = replace(
    AMD,
    processor="unknown",
    cpu="AuthenticAMD family 175 model 1; avx avx2 fma",
    backend="tpu",
    device_kind="TPU v5 lite",
)


@pytest.fixture
def project(tmp_path: Path, git_project) -> Path:
    """A project whose goldens say they were pinned on a TPU."""
    repo = git_project(tmp_path, PRODUCERS, TABLE, files={"src/model.py": "BUG = 0.0\n"})
    path = repo / "goldens" / "g.h5"
    with open_goldens(path) as gf:
        arrays = {k: np.asarray(gf[k]) + np.float32(TPU_BITS) for k in gf}
        classes = {k: gf.info(k).class_name for k in gf}
        prov, cmap, order = gf.provenance, gf.class_map_json, gf.ordered_keys()
    prov = replace(prov, backend="tpu", device_kind="TPU v5 lite")
    write_goldens(path, arrays, classes=classes, class_map_json=cmap, provenance=prov,
                  order=order)  # fmt: skip
    return repo


def _line(stdout: str, name: str) -> str:
    lines = [" ".join(ln.split()) for ln in stdout.splitlines() if ln.strip().startswith(name)]
    assert lines, stdout
    return lines[0]


def test_a_file_without_a_backend_reads_as_a_cpu_and_keeps_its_baseline_name() -> None:
    here = replace(AMD, backend="cpu", device_kind="cpu", matmul_precision=None)
    assert not environment_difference(AMD, here).drifts
    assert environment_fingerprint(AMD) == environment_fingerprint(here)
    assert environment_fingerprint(TPU) != environment_fingerprint(replace(TPU, backend="gpu"))


def test_another_backend_is_a_dimension_and_the_host_processor_only_information() -> None:
    diff = environment_difference(AMD, TPU)
    assert diff.across_backends and diff.moves_bits
    assert [d.kind for d in diff.dimensions] == ["backend"]
    assert diff.changes == ("backend cpu -> tpu (TPU v5 lite)",)
    assert [d.field for d in diff.bits] == ["backend"]
    assert {d.field for d in diff.info} == {"cpu", "processor"}
    # The same host processor under another backend's pin: still across backends.
    assert environment_difference(TPU, AMD).changes == ("backend tpu (TPU v5 lite) -> cpu",)
    # Another precision moves bits on the same backend.
    highest = environment_difference(TPU, replace(TPU, matmul_precision="highest"))
    assert not highest.across_backends and [d.field for d in highest.bits] == ["matmul_precision"]


def test_each_side_is_named_in_words_with_an_isa_cap_only_on_a_cpu() -> None:
    assert describe_backend(AMD) == "cpu (AuthenticAMD family 25 model 1, isa AVX2, 1 device)"
    assert describe_backend(replace(AMD, cpu=None)) == "cpu (AMD EPYC 7B13, isa AVX2, 1 device)"
    assert describe_backend(TPU) == "tpu (TPU v5 lite, 1 device)"
    four = replace(TPU, device_count=4, processes=2, matmul_precision="highest")
    assert describe_backend(four) == (
        "tpu (TPU v5 lite, 2 processes x 2 devices, matmul precision highest)"
    )
    assert backend_note(AMD) == ""
    assert "bfloat16 passes" in backend_note(TPU) and "JAX_PLATFORMS=cpu" in backend_note(TPU)


def test_goldens_pinned_on_a_tpu_are_judged_here_by_the_baseline(project, run_parity) -> None:
    proc = run_parity(project, "check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("parity: PASS (0 of 2 arrays fail)\n"), proc.stdout
    assert _line(proc.stdout, "pinned on") == "pinned on (g) tpu (TPU v5 lite, 1 device)"
    checked = _line(proc.stdout, "checked on")
    assert checked.startswith("checked on (g) cpu (") and ", isa AVX2, 1 device)" in checked
    reference = _line(proc.stdout, "reference")
    assert "the baseline re-produced here" in reference
    assert "on this backend (backend tpu (TPU v5 lite) -> cpu)" in reference
    assert "for information" in reference and "2 keys beyond their pinned class" in reference
    assert "outside the recorded noise" not in proc.stdout + proc.stderr
    # No calibration measures another backend: a repin on this one adopts it.
    assert "adopt this environment with `parity repin --base " in reference
    assert "parity calibrate" not in proc.stdout + proc.stderr
    # A change far below the goldens' distance from this backend: the baseline catches it,
    # bit for bit on the bitwise key.
    (project / "src" / "model.py").write_text("BUG = 1e-7\n")
    bug = run_parity(project, "check")
    assert bug.returncode == 1, bug.stdout + bug.stderr
    assert "first breaking its class: logits [bitwise, fail]" in bug.stdout
    assert "vs baseline" in bug.stdout


def test_without_a_baseline_across_backends_the_verdict_is_not_exact_and_require_exits_2(
    project, run_parity
) -> None:
    shutil.rmtree(project / ".git")
    proc = run_parity(project, "check")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdict = proc.stdout.splitlines()[0]
    assert "not exact" in verdict and "judged against goldens pinned on tpu" in verdict
    assert "is not in a git repository" in verdict
    assert "pinned on another backend, under their pinned classes" in _line(
        proc.stdout, "reference"
    )
    required = run_parity(project, "check", "--baseline", "require")
    assert required.returncode == 2, required.stdout + required.stderr
    err = required.stderr.strip().splitlines()[-1]
    assert err.startswith("parity: error: group 'g': the baseline is required"), err
    assert "judged against goldens pinned on another backend" in err


def test_calibrate_across_backends_measures_against_a_run_here_and_never_writes(
    project, run_parity
) -> None:
    before = (project / "goldens" / "g.h5").read_bytes()
    written = run_parity(project, "calibrate", "--perturb", "repeat", "--write")
    assert written.returncode == 2, written.stdout + written.stderr
    err = written.stderr.strip().splitlines()
    assert len(err) == 1 and "pinned on another backend" in err[0] and "drop --write" in err[0]
    proc = run_parity(project, "calibrate", "--perturb", "repeat")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "measured against a run of the pinned environment here, on cpu (" in proc.stdout
    assert "repeat               0 (0)" in proc.stdout, proc.stdout
    assert (project / "goldens" / "g.h5").read_bytes() == before


def test_perturbations_that_do_not_exist_here_are_skipped_in_one_line_each() -> None:
    asked = [
        Perturbation("isa=AVX", "AVX", 1),
        Perturbation("devices=4", "AVX2", 4),
        Perturbation("processes=2x2", "AVX2", 2, 2),
        Perturbation("repeat", "AVX2", 1),
    ]
    tpu = Here("tpu", 1, "TPU v5 lite", sockets=False)
    kept, skipped = available(asked, tpu)
    assert [p.label for p in kept] == ["repeat"]
    assert [s.partition(":")[0] for s in skipped] == ["isa=AVX", "devices=4", "processes=2x2"]
    assert "XLA's CPU compiler only" in skipped[0] and "tpu (TPU v5 lite" in skipped[0]
    kept, skipped = available(asked, Here(sockets=False))
    assert [p.label for p in kept] == ["isa=AVX", "devices=4", "repeat"]
    assert skipped == [
        "processes=2x2: skipped: this machine allows no TCP socket, so jax.distributed cannot "
        "start (a run of several processes is not possible here)"
    ]
    assert available(asked, Here()) == (asked, [])


def test_a_machine_without_sockets_is_one_line(monkeypatch) -> None:
    def refuse(*args: object, **kwargs: object) -> socket.socket:
        raise OSError(97, "Address family not supported by protocol")

    monkeypatch.setattr(socket, "socket", refuse)
    with pytest.raises(NoSockets) as err:
        free_port()
    assert isinstance(err.value, WorkerFailed) and err.value.worker is None
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(
        "this machine allows no TCP socket (Address family not supported by protocol), so "
        "jax.distributed cannot start"
    )


SITE = textwrap.dedent(
    """\
    import socket


    class _Refusing(socket.socket):  # as a sandbox without internet sockets (a TPU VM here)
        def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
            if fileno is None and family in (-1, socket.AF_INET, socket.AF_INET6):
                raise OSError(97, "Address family not supported by protocol")
            super().__init__(family, type, proto, fileno)


    socket.socket = _Refusing
    """
)


def test_without_sockets_calibrate_skips_processes_and_a_2_process_check_is_one_line(
    tmp_path, git_project, run_parity, monkeypatch
) -> None:
    repo = git_project(tmp_path, PRODUCERS, TABLE, files={"src/model.py": "BUG = 0.0\n"})
    site = tmp_path / "nosockets"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), PYTHONPATH])))
    proc = run_parity(repo, "calibrate", "--perturb", "processes,repeat")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "processes=2x2: skipped: this machine allows no TCP socket" in proc.stdout
    assert "Traceback" not in proc.stderr
    only = run_parity(repo, "calibrate", "--perturb", "processes")
    assert only.returncode == 2 and "Traceback" not in only.stderr, only.stderr
    assert only.stderr.strip().count("\n") == 0, only.stderr
    assert "nothing to calibrate on this backend" in only.stderr
    check = run_parity(repo, "check", "--processes", "2", "--devices", "1")
    assert check.returncode == 2 and "Traceback" not in check.stderr, check.stderr
    assert "this machine allows no TCP socket" in check.stderr


NO_CACHE_LOAD = """\
import json
import jax
import jax.numpy as jnp
from jax import monitoring
from parity._compile_stats import compile_stats

def f(x):
    return jnp.tanh(x @ x.T).sum()

x = jnp.ones((64, 64))
jax.jit(f)(x).block_until_ready()  # compiled once: the persistent cache holds it now
hits = []
monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name.endswith("cache_hits") else None
)
stats = compile_stats(jax.jit(f), x)
print(json.dumps({"hits": len(hits), "backend": stats.backend}))
"""


def test_a_fresh_compile_is_timed_as_a_compile_never_a_cache_load(tmp_path) -> None:
    # jax decides once per process whether it uses its persistent cache, and here the first
    # compile decided "yes": a fresh measurement must still compile, and name its backend.
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "JAX_ENABLE_COMPILATION_CACHE": "true",
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
    done = subprocess.run(
        [sys.executable, "-c", NO_CACHE_LOAD], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"hits": 0, "backend": "cpu"}
    assert any((tmp_path / "cache").iterdir())  # the cache was on, and held the program


def test_a_cached_baseline_of_a_tpu_is_listed_by_its_backend_not_an_isa_cap(tmp_path) -> None:
    from parity.run._baseline import BaselineCache

    cache = BaselineCache(tmp_path)
    for name, prov in (("cpu", AMD), ("tpu", TPU)):
        path = cache.path_for("a" * 40, environment_fingerprint(prov), "d" * 64, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_goldens(path, {"x": np.zeros(2, np.float32)}, classes={"x": "bitwise"},
                      provenance=prov)  # fmt: skip
    listed = {e.group: e for e in cache.entries()}
    assert (listed["cpu"].isa, listed["cpu"].cpu) == ("AVX2", "AuthenticAMD family 25 model 1")
    assert (listed["tpu"].isa, listed["tpu"].cpu) == ("-", "tpu (TPU v5 lite, 1 device)")


def test_cached_baselines_are_listed_in_an_order_no_host_decides(tmp_path) -> None:
    # The environment's fingerprint names each entry's folder; it is a hash of the host's
    # processor among others, so the folders' order differs from host to host. The listing
    # is by commit, group, layout, then ISA cap from the widest.
    from parity.run._baseline import BaselineCache

    cache = BaselineCache(tmp_path)
    caps = ["SSE4_2", "AVX", "AVX512", "AVX2"]
    for n, cap in enumerate(caps):
        prov = replace(AMD, isa_cap=cap)
        # folder names in the opposite order of the widths
        path = cache.path_for("a" * 40, f"{9 - n}{cap.lower()}", "d" * 64, "forward")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_goldens(path, {"x": np.zeros(2, np.float32)}, classes={"x": "bitwise"},
                      provenance=prov)  # fmt: skip
    assert [e.isa for e in cache.entries()] == ["AVX512", "AVX2", "AVX", "SSE4_2"]
