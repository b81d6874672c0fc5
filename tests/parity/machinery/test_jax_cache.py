"""The machine's one compilation cache (`parity.machinery._jax_cache`): keys that do not depend on
the folder, several processes on one empty cache at once, and the compile counter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parity.machinery import _jax_cache as jax_cache
from parity.machinery._devices import isolated_env

# Each process compiles the same programs in its own order, so that while one writes an
# entry another reads it; then prints its results and its compile figures. The programs
# are unrolled chains of matmuls, large enough that an entry takes a while to write.
_SCRIPT = """
import json, sys
from pathlib import Path
from parity.machinery import _compile_count as compile_count, _jax_cache as jax_cache
jax_cache.enable(Path(sys.argv[1]))
compile_count.install()
import jax, jax.numpy as jnp

def chain(n):
    def f(x):
        for i in range(n):
            x = jnp.tanh(x @ x.T * (1.0 / (i + 1)) + x)
        return x
    return jax.jit(f)

order = [int(k) for k in sys.argv[2].split(",")]
x = jnp.arange(64.0, dtype=jnp.float32).reshape(8, 8) / 64.0
out = {str(k): chain(k)(x).tolist() for k in order}
c = compile_count.counts()
print(json.dumps({"out": out, "compiled": c.compiled, "loaded": c.loaded}))
"""

_SIZES = (8, 12, 16, 20, 24, 28)


def _reference(n: int) -> np.ndarray:
    x = (np.arange(64.0, dtype=np.float32).reshape(8, 8) / 64.0).astype(np.float32)
    for i in range(n):
        x = np.tanh(x @ x.T * np.float32(1.0 / (i + 1)) + x).astype(np.float32)
    return x


def _start(root: Path, order: tuple[int, ...]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "PARITY_"))}
    return subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, str(root), ",".join(map(str, order))],
        env=env | {"JAX_PLATFORMS": "cpu"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    # jax turns an unreadable entry into a warning and compiles again: a torn read would
    # show here even where the recompiled result is right.
    assert "Error reading persistent compilation cache entry" not in err, err
    return json.loads(out.strip().splitlines()[-1])


def test_processes_on_one_empty_cache_at_once_all_get_correct_results(tmp_path: Path) -> None:
    orders = [_SIZES, _SIZES[::-1], _SIZES[1::2] + _SIZES[::2], _SIZES[::2] + _SIZES[1::2]]
    procs = [_start(tmp_path, order) for order in orders]
    runs = [_finish(p) for p in procs]
    for run in runs:
        for n in _SIZES:
            np.testing.assert_allclose(np.asarray(run["out"][str(n)]), _reference(n), rtol=2e-5)
        # every process computed the same bits, compiled or loaded
        assert run["out"] == runs[0]["out"]
    entries = list(jax_cache.folder_for(tmp_path).glob("*-cache"))
    assert len(entries) >= len(_SIZES)
    # Four writers at once kept the size tally whole: it is the bytes the entries take.
    tally = jax_cache.folder_for(tmp_path) / jax_cache.SIZE_TALLY
    assert int(tally.read_bytes()) == sum(p.stat().st_size for p in entries)
    # A second process compiles nothing: every program is in the cache now.
    again = _finish(_start(tmp_path, _SIZES))
    assert again["out"] == runs[0]["out"]
    assert (again["compiled"], again["loaded"] >= len(_SIZES)) == (0, True), again


def test_a_write_lists_the_folder_only_where_the_tally_says_the_limit_would_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jax._src.lru_cache import LRUCache

    assert jax_cache.keep_a_size_tally()
    listings: list[Path] = []
    count = jax_cache._stored_bytes

    def counted(folder: Path, suffix: str) -> int:
        listings.append(folder)
        return count(folder, suffix)

    monkeypatch.setattr(jax_cache, "_stored_bytes", counted)
    cache = LRUCache(str(tmp_path), max_size=1000)
    tally = tmp_path / jax_cache.SIZE_TALLY

    def stored() -> dict[str, int]:
        return {p.name.removesuffix("-cache"): p.stat().st_size for p in tmp_path.glob("*-cache")}

    cache.put("a", b"a" * 300)  # no tally yet: the folder is listed, then counted
    assert (len(listings), int(tally.read_bytes())) == (1, 300)
    cache.put("b", b"b" * 300)
    assert cache.get("a") == b"a" * 300  # `a` is now used more recently than `b`
    cache.put("c", b"c" * 300)
    assert (len(listings), int(tally.read_bytes())) == (1, 900)  # no listing below the limit
    cache.put("d", b"d" * 300)  # 1200 bytes would pass 1000: jax evicts, least recent first
    assert len(listings) == 2
    assert stored() == {"a": 300, "c": 300, "d": 300}
    assert int(tally.read_bytes()) == 900
    tally.write_bytes(b"not a number")  # an unreadable tally: listed and counted again
    cache.put("e", b"e" * 50)
    assert len(listings) == 3 and int(tally.read_bytes()) == sum(stored().values()) == 950


def test_a_cache_key_does_not_depend_on_the_folder(tmp_path: Path) -> None:
    """jax's default put the folder into the compile options, so two folders never shared
    an entry (the old per-worker folders): one program gives one entry name anywhere."""
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        _finish(_start(root, (8,)))
    names = [sorted(p.name for p in jax_cache.folder_for(r).glob("*-cache")) for r in (a, b)]
    assert names[0] and names[0] == names[1]


def test_a_producer_process_inherits_the_machine_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(jax_cache.RESOLVED_VAR, str(tmp_path))
    monkeypatch.setenv("JAX_ENABLE_X64", "1")  # an outer jax setting the child must not see
    env = isolated_env(2)
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(jax_cache.folder_for(tmp_path))
    assert env["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == "none"
    assert int(env["JAX_COMPILATION_CACHE_MAX_SIZE"]) > 0  # the limit is what locks
    assert "JAX_ENABLE_X64" not in env
    monkeypatch.setenv(jax_cache.RESOLVED_VAR, "none")
    off = isolated_env(2)
    assert off["JAX_ENABLE_COMPILATION_CACHE"] == "false"
    assert "JAX_COMPILATION_CACHE_DIR" not in off


_DISTRIBUTED = """
import json, sys
from pathlib import Path
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_num_cpu_devices", 2)
pid = int(sys.argv[2])
jax.distributed.initialize(sys.argv[3], 2, pid)
from parity.machinery import _compile_count as compile_count, _jax_cache as jax_cache
jax_cache.enable(Path(sys.argv[1]))
compile_count.install()
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("dp",))
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("dp")), np.full((2, 3), pid + 1.0, np.float32))
total = float(jax.jit(lambda a: (a * 2.0 + 1.0).sum())(x))
c = compile_count.counts()
print(json.dumps({"total": total, "compiled": c.compiled, "loaded": c.loaded}))
"""


def _distributed_run(root: Path) -> list[dict]:
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "PARITY_"))}
    env |= {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_cpu_max_isa=AVX2"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _DISTRIBUTED, str(root), str(pid), f"localhost:{port}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in range(2)
    ]
    return [_finish(p) for p in procs]


def test_every_process_of_a_distributed_run_loads_its_programs_the_second_time(
    tmp_path: Path,
) -> None:
    """jax writes cache entries from process 0 only, and on CPU process 1's keys differ
    from process 0's (the topology fingerprint): process 1 compiled everything on every
    run until each process wrote its own entries."""
    first = _distributed_run(tmp_path)
    second = _distributed_run(tmp_path)
    # 2 devices of process 0 hold 1.0, process 1's hold 2.0: 6 * 3 + 6 * 5
    assert [r["total"] for r in first + second] == [48.0] * 4
    assert [r["compiled"] for r in first] != [0, 0], first  # a cold run compiles
    assert [r["compiled"] for r in second] == [0, 0], second


_TIMED = """
import sys
from pathlib import Path
from parity.machinery import _compile_count as compile_count, _jax_cache as jax_cache
jax_cache.enable(Path(sys.argv[1]))
compile_count.install()
import jax, jax.numpy as jnp

def double(x):
    return 2.0 * x

def shift(x):
    return x + 1.0

x = jnp.zeros((3,), jnp.float32)
jax.jit(double)(x).block_until_ready()
jax.jit(shift)(x).block_until_ready()
"""


def test_the_compile_log_names_each_compiled_program_and_its_test_but_no_cache_load(
    tmp_path: Path,
) -> None:
    """`PARITY_COMPILE_LOG` keeps, per compiled program, its name and the test that ran it
    (`PYTEST_CURRENT_TEST`); a second process on the same cache loads both programs and adds
    no compile under its test."""
    from parity.machinery._compile_count import LOG_VAR, read_compiles, read_log

    log = tmp_path / "log"
    for test in ("a.py::first (call)", "a.py::second (call)"):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "PARITY_"))}
        env |= {"JAX_PLATFORMS": "cpu", LOG_VAR: str(log), "PYTEST_CURRENT_TEST": test}
        done = subprocess.run([sys.executable, "-c", _TIMED, str(tmp_path / "cache")],
                              env=env, capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr
    by_program = {r.name: r for r in read_compiles(log, by="program")}
    assert by_program["jit(double)"].programs == 1 and by_program["jit(shift)"].programs == 1
    assert all(r.processes == 1 and r.seconds > 0 for r in by_program.values())
    by_test = read_compiles(log, by="test")
    assert [r.name for r in by_test] == ["a.py::first"]
    assert by_test[0].programs == read_log(log).compiled
    assert read_log(log).loaded >= 2
