"""What a user installs: the distribution carries the harness (`parity`) alone. The subject
codebase (`src/decomp`) and its dependencies (equinox, optax) stay in this repository's
development install. The wheel is built the way `pip install /path/to/checkout` builds it,
offline (hatchling comes with the `test` extra)."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SUBJECT_ONLY = {"equinox", "optax"}


def _name(requirement: str) -> str:
    """`'jax>=0.4.35; extra == "x"'` -> `'jax'`."""
    for stop in "<>=!~;[ @":
        requirement = requirement.split(stop, 1)[0]
    return requirement.strip().lower().replace("_", "-")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    offline = ("--no-deps", "--no-build-isolation", "--no-index", "--quiet")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", *offline, "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = out.glob("*.whl")
    return built


def test_the_wheel_carries_parity_and_no_decomp(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"parity"}, sorted(tops)
    assert not [n for n in names if "decomp/" in n]
    for module in (
        "__init__",
        "_cli",
        "pytest_plugin/__init__",
        "machinery/_producer_runner",
        "_compile_stats",
    ):
        assert f"parity/{module}.py" in names, (module, names)
    # the public names, which `parity/__init__.py` reads at import (lazy_loader.attach_stub)
    assert "parity/__init__.pyi" in names, names


def test_the_wheel_requires_no_subject_dependency(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        dist_info = next(n.split("/", 1)[0] for n in z.namelist() if ".dist-info/" in n)
        meta = Parser().parsestr(z.read(f"{dist_info}/METADATA").decode())
        entry_points = z.read(f"{dist_info}/entry_points.txt").decode()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert (meta["Name"], meta["Version"]) == ("parity-harness", version)
    requires = meta.get_all("Requires-Dist") or []
    required = {_name(r) for r in requires if "extra ==" not in r}
    harness = {"jax", "jaxlib", "numpy", "h5py", "ml-dtypes", "filelock", "lazy-loader"}
    assert required == harness, requires
    # equinox and optax only under this repository's own extras (its tests run decomp):
    # `test`, and `dev`, which includes it.
    subject = [r for r in requires if _name(r) in SUBJECT_ONLY]
    extras = {re.sub(r"""^.*extra == ["']([^"']+)["'].*$""", r"\1", r) for r in subject}
    assert subject and extras == {"test", "dev"}, subject
    assert "parity = parity.pytest_plugin" in entry_points
    assert "parity = parity._cli:script" in entry_points


def test_the_sdist_carries_parity_and_no_decomp(tmp_path: Path) -> None:
    code = f"import hatchling.build as b; print(b.build_sdist({str(tmp_path)!r}))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with tarfile.open(tmp_path / proc.stdout.strip().splitlines()[-1]) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    assert {"src/parity/__init__.py", "src/parity/__init__.pyi", "pyproject.toml"} <= set(names)
    assert not [n for n in names if n.startswith(("src/decomp", "tests", "goldens"))], names
