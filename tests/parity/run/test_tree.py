"""`parity.run._tree`: the current tree checked from a typed request, the workflow `parity
check` hands its flags to. On a numpy-only project pinned by `parity repin`: what the
workflow returns is what the command reports, a changed tree fails by the workflow as by the
command, and a request the flags cannot make run is refused before any producer runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parity.machinery._config import load_config
from parity.run._tree import CheckedTree, TreeCheck, check_tree

PRODUCERS = """\
import numpy as np
import treelib

GROUPS = {"g": lambda: {"w": np.full(4, treelib.VALUE, np.float32), "b": np.arange(3.0)}}
"""


@pytest.fixture
def project(tmp_path: Path, git_project, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Pinned at its one commit; the baseline cache and logs private to the test."""
    monkeypatch.setenv("PARITY_BASELINE_CACHE", str(tmp_path / "baselines"))
    monkeypatch.setenv("PARITY_LOGS", str(tmp_path / "logs"))
    monkeypatch.delenv("PARITY_DEVICES", raising=False)
    return git_project(tmp_path, PRODUCERS, files={"src/treelib/__init__.py": "VALUE = 1.0\n"})


def _checked(project: Path) -> CheckedTree:
    return check_tree(TreeCheck(config=load_config(project)), progress=lambda _: None)


def test_what_the_workflow_returns_is_what_parity_check_reports(
    project: Path, tmp_path: Path, run_parity
) -> None:
    checked = _checked(project)
    assert checked.passed and [r.name for r in checked.results] == ["g"]
    assert checked.produced.groups["g"].keys() == {"w", "b"}

    reported = run_parity(project, "check", "--json", str(tmp_path / "c.json"))
    assert reported.returncode == 0, reported.stdout + reported.stderr
    header = json.loads((tmp_path / "c.json").read_text())["header"]
    ours = checked.header()
    # the same lines (the JSON's sorted); the producers' seconds differ from run to run
    assert ours.keys() == header.keys()
    assert {k: v for k, v in ours.items() if k != "produce"} == {
        k: v for k, v in header.items() if k != "produce"
    }
    assert ours["goldens"] == str(project / "goldens")


def test_a_changed_tree_fails_by_the_workflow_as_by_the_command(project: Path, run_parity) -> None:
    (project / "src" / "treelib" / "__init__.py").write_text("VALUE = 2.0\n")
    checked = _checked(project)
    assert not checked.passed
    (result,) = checked.results
    first = result.comparison.first_failure
    assert first is not None and first.key == "w"
    assert run_parity(project, "check").returncode == 1


def test_a_cluster_cannot_require_a_baseline_and_is_refused_before_any_producer_runs(
    project: Path, run_parity
) -> None:
    marker = project / "ran"
    (project / "producers.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n" + PRODUCERS
    )
    refused = run_parity(
        project,
        *("check", "--baseline", "require", "--processes", "2"),
        *("--coordinator", "localhost:1", "--process-id", "0"),
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "--baseline require cannot be met on a cluster" in refused.stderr
    assert not marker.exists()


def test_a_run_on_an_accelerator_is_not_kept_for_its_recording(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process holds a GPU or TPU at a time, and the base's run needs it: where a group
    ran on one (its provenance's backend), the run ends once its groups are saved (it exits
    0 on its closed stdin) and none is kept; on the CPU it is kept while the block runs."""
    import dataclasses

    from parity.machinery._launcher import KeptRun
    from parity.run import _produced as module

    config = load_config(project)
    with module.producing(config, keep=True) as (_, kept):
        assert kept is not None  # the CPU
    real_loaded, real_close = module._loaded, KeptRun.close
    exits: list[int | None] = []

    def on_a_tpu(*args, **kwargs):
        made = real_loaded(*args, **kwargs)
        runs = {
            g: dataclasses.replace(r, provenance=dataclasses.replace(r.provenance, backend="tpu"))
            for g, r in made.runs.items()
        }
        return dataclasses.replace(made, runs=runs)

    def close(self: KeptRun) -> None:
        live = self._live
        real_close(self)
        exits.append(None if live is None else live._procs[0].poll())

    monkeypatch.setattr(module, "_loaded", on_a_tpu)
    monkeypatch.setattr(KeptRun, "close", close)
    with module.producing(config, keep=True) as (produced, kept):
        assert kept is None and produced.groups["g"].keys() == {"w", "b"}
        assert exits == [0]
