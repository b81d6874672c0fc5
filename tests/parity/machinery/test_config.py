"""`[tool.parity]`: found by walking up, defaults, flags over keys, one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from parity.machinery._config import ConfigError, find_pyproject, load_config


def _project(tmp_path: Path, table: str, *, src: bool = True) -> Path:
    (tmp_path / "pyproject.toml").write_text(f"[project]\nname = 'x'\n\n{table}")
    if src:
        (tmp_path / "src").mkdir()
    (tmp_path / "a" / "b").mkdir(parents=True)
    return tmp_path


def test_found_by_walking_up_and_paths_resolve_against_the_pyproject_folder(tmp_path):
    root = _project(tmp_path, '[tool.parity]\nproducers = "tests/p.py"\ngoldens = "g"\n')
    assert find_pyproject(root / "a" / "b") == root / "pyproject.toml"
    cfg = load_config(root / "a" / "b")
    assert cfg.root == root.resolve()
    assert cfg.producers == (root / "tests" / "p.py").resolve()
    assert cfg.goldens == (root / "g").resolve()
    assert cfg.src == ((root / "src").resolve(),)
    assert (cfg.isa, cfg.devices) == ("AVX2", 1)
    assert cfg.explicit == {"producers", "goldens"}


def test_defaults_without_a_table_and_src_falls_back_to_the_root(tmp_path):
    root = _project(tmp_path, "", src=False)
    cfg = load_config(root)
    assert cfg.goldens == (root / "goldens").resolve()
    assert cfg.src == (root.resolve(),)
    assert cfg.src_relative() == (".",)
    assert cfg.producers is None
    with pytest.raises(ConfigError, match="no producers file configured"):
        cfg.need_producers()


def test_several_src_roots_and_isa_none(tmp_path):
    root = _project(tmp_path, '[tool.parity]\nsrc = ["src", "lib"]\nisa = "none"\ndevices = 4\n')
    cfg = load_config(root)
    assert cfg.src_relative() == ("src", "lib")
    assert (cfg.isa, cfg.devices) == (None, 4)


def test_flags_override_keys(tmp_path, monkeypatch):
    root = _project(tmp_path, '[tool.parity]\ndevices = 4\nisa = "AVX"\n')
    monkeypatch.chdir(root / "a")
    cfg = load_config().with_overrides(devices=2, isa=None, goldens="here")
    assert cfg.devices == 2
    assert cfg.isa == "AVX"  # not given: the table's
    assert cfg.goldens == (root / "a" / "here").resolve()  # flags resolve against the cwd


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ('goldens = "g"\nproducer = "p.py"\n', "unknown key 'producer'"),
        ("devices = 0\n", "devices must be a whole number"),
        ('devices = "four"\n', "devices must be a whole number"),
        ("goldens = 3\n", "goldens must be a folder path"),
        ("src = []\n", "src must be a folder or a list"),
        ("isa = 2\n", "isa must be an ISA name"),
    ],
)
def test_unknown_keys_and_wrong_types_name_the_file_and_key(tmp_path, table, needle):
    root = _project(tmp_path, "[tool.parity]\n" + table)
    with pytest.raises(ConfigError, match=needle) as info:
        load_config(root)
    assert str(root / "pyproject.toml") in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("key", ["devices", "processes"])
def test_a_quoted_number_is_a_wrong_type_not_a_number(tmp_path, key):
    root = _project(tmp_path, f'[tool.parity]\n{key} = "2"\n')
    with pytest.raises(ConfigError) as info:
        load_config(root)
    text = str(info.value)
    assert str(root / "pyproject.toml") in text and "\n" not in text
    assert f"{key} must be a whole number of {key}" in text and f"{key} = 2" in text, text
    assert "'2'" in text


def test_cli_reports_a_bad_table_in_one_line_and_exits_2(tmp_path):
    root = _project(tmp_path, "[tool.parity]\ncolour = 1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "parity", "check"], cwd=root, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("parity: error: ")
    assert "unknown key 'colour'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_this_repository_configures_itself_the_same_way():
    root = Path(__file__).resolve().parents[3]
    cfg = load_config(root / "tests")
    assert cfg.producers == root / "tests" / "equivalence" / "producers.py"
    assert cfg.goldens == root / "goldens"
    assert cfg.src == (root / "src",)


def test_the_baseline_and_its_cache_folder_are_settings(tmp_path, monkeypatch):
    from parity.run._baseline import ENV_VAR, cache_dir

    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = _project(tmp_path, "[tool.parity]\n")
    cfg = load_config(root)
    assert cfg.baseline == "auto"
    assert cache_dir(cfg) == tmp_path / "xdg" / "parity" / "baselines"
    (tmp_path / "p").mkdir()
    root = _project(tmp_path / "p", '[tool.parity]\nbaseline = "off"\nbaseline_cache = "c"\n')
    cfg = load_config(root)
    assert cfg.baseline == "off"
    assert cache_dir(cfg) == (root / "c").resolve()  # against the pyproject's folder
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env"))
    assert cache_dir(cfg) == (tmp_path / "env").resolve()  # the variable moves it again
    with pytest.raises(ConfigError, match='baseline must be "auto" or "off"'):
        (tmp_path / "q").mkdir()
        load_config(_project(tmp_path / "q", '[tool.parity]\nbaseline = "on"\n'))
