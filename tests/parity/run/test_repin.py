"""Repin on a throwaway git repository: base values, untouched checkout, cleanup, errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parity.machinery._launcher import ProducerRunError
from parity.machinery._worktree import GitError
from parity.run._repin import RepinError, repin
from parity.store import open_goldens

ROOT = Path(__file__).resolve().parents[3]


def _write_lib(repo: Path, body: str) -> None:
    pkg = repo / "src" / "tinylib"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(body))


@pytest.fixture
def repo(tmp_path: Path, git, git_project) -> tuple[Path, str, str]:
    """A repository with two commits of a tiny library, and a dirty working tree."""
    lib = {"src/tinylib/__init__.py": "VALUE = 1.0\n"}
    repo = git_project(tmp_path, table=None, files=lib, pin=None, message="first")
    first = git(repo, "rev-parse", "HEAD")
    _write_lib(repo, "VALUE = 2.0\nNEW_THING = 5\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "second")
    second = git(repo, "rev-parse", "HEAD")
    # Uncommitted work the tool must neither use nor touch.
    _write_lib(repo, "VALUE = 3.0\nNEW_THING = 6\n")
    (repo / "untracked.txt").write_text("mine")
    return repo, first, second


def _producers(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "producers.py"
    path.write_text(textwrap.dedent(body))
    return path


PLAIN = """
    import ml_dtypes
    import numpy as np
    import tinylib

    def _group():
        return {
            "x": np.full(3, tinylib.VALUE, np.float32),
            "b": np.full((2, 2), tinylib.VALUE, ml_dtypes.bfloat16),
            "s": np.float32(tinylib.VALUE),
        }

    GROUPS = {"g": _group}
    CLASS_MAP = [("*", "bitwise")]
"""


def test_repin_pins_the_base_commit_values_not_the_head_or_dirty_tree(
    repo, tmp_path, checkout_snapshot
):
    repo_dir, first, _ = repo
    producers = _producers(tmp_path, PLAIN)
    before = checkout_snapshot(repo_dir)
    result = repin(
        first,
        producers=producers,
        out_dir=tmp_path / "goldens",
        repo=repo_dir,
        progress=lambda _: None,
    )
    assert result.sha == first
    with open_goldens(tmp_path / "goldens" / "g.h5") as g:
        np.testing.assert_array_equal(g["x"], np.full(3, 1.0, np.float32))
        assert g["b"].dtype.name == "bfloat16"
        assert g["s"].shape == ()  # 0-d stays 0-d through the subprocess hand-off
        assert g.provenance.base_sha == first
        assert "--xla_cpu_max_isa=AVX2" in str(g.provenance.xla_flags)
    assert checkout_snapshot(repo_dir) == before


def test_provenance_describes_the_producer_process_not_the_callers_shell(
    repo, tmp_path, monkeypatch
):
    """x64 mode, XLA flags and device count are collected where the arrays are made: the
    caller's JAX_ENABLE_X64 and XLA_FLAGS never reach the producers, so they must not be
    recorded; a producer that turns x64 on is recorded with it."""
    repo_dir, first, _ = repo
    producers = _producers(
        tmp_path,
        """
        import jax
        import numpy as np

        def _plain():
            return {"x64": np.bool_(jax.config.jax_enable_x64), "n": np.int64(jax.device_count())}

        def _x64():
            jax.config.update("jax_enable_x64", True)
            return {"x64": np.bool_(jax.config.jax_enable_x64)}

        GROUPS = {"a_plain": _plain, "b_x64": _x64}
        CLASS_MAP = [("*", "bitwise")]
        """,
    )
    monkeypatch.setenv("JAX_ENABLE_X64", "1")
    monkeypatch.setenv(
        "XLA_FLAGS", "--xla_bogus_shell_flag=1 --xla_force_host_platform_device_count=7"
    )
    out = tmp_path / "goldens"
    repin(first, producers=producers, out_dir=out, repo=repo_dir, progress=lambda _: None)
    with open_goldens(out / "a_plain.h5") as g:
        made = {"x64": bool(g["x64"]), "n": int(g["n"])}
        prov = g.provenance
    assert made == {"x64": False, "n": 1}
    assert prov.x64 is False and prov.device_count == 1
    flags = str(prov.xla_flags)
    assert "bogus" not in flags and "device_count=1" in flags
    assert prov.isa_cap == "AVX2" and prov.base_sha == first and prov.producer_digest
    with open_goldens(out / "b_x64.h5") as g:
        assert bool(g["x64"]) is True and g.provenance.x64 is True


def test_repin_twice_gives_byte_identical_files_and_reports_changes(repo, tmp_path):
    repo_dir, first, second = repo
    producers = _producers(tmp_path, PLAIN)
    out = tmp_path / "goldens"
    repin(first, producers=producers, out_dir=out, repo=repo_dir, progress=lambda _: None)
    once = (out / "g.h5").read_bytes()
    again = repin(first, producers=producers, out_dir=out, repo=repo_dir, progress=lambda _: None)
    assert (out / "g.h5").read_bytes() == once
    assert all(c.unchanged for c in again.changes)
    moved = repin(second, producers=producers, out_dir=out, repo=repo_dir, progress=lambda _: None)
    (change,) = moved.changes
    assert {k for k, _ in change.changed} == {"x", "b", "s"}
    assert "max abs 1" in dict(change.changed)["x"]


def test_unknown_sha_is_a_clear_error(repo, tmp_path):
    repo_dir, _, _ = repo
    with pytest.raises(GitError, match="not a commit"):
        repin(
            "0123456789abcdef0123456789abcdef01234567",
            producers=_producers(tmp_path, PLAIN),
            out_dir=tmp_path / "g",
            repo=repo_dir,
        )


def test_base_lacking_a_symbol_is_named(repo, tmp_path, git):
    repo_dir, first, _ = repo
    producers = _producers(
        tmp_path,
        """
        import numpy as np
        from tinylib import NEW_THING

        GROUPS = {"g": lambda: {"x": np.array([NEW_THING])}}
        CLASS_MAP = [("*", "bitwise")]
    """,
    )
    with pytest.raises(ProducerRunError, match="NEW_THING") as info:
        repin(
            first,
            producers=producers,
            out_dir=tmp_path / "g",
            repo=repo_dir,
            progress=lambda _: None,
        )
    # One sentence that reads: the base lacks the name, in its module (not "lacks cannot
    # import name ...", Python's message pasted in).
    assert f"the base commit {first[:12]}" in str(info.value)
    assert "lacks 'NEW_THING' in the module 'tinylib', which the producers need" in str(info.value)
    assert "lacks cannot" not in str(info.value)
    assert git(repo_dir, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_crashing_producer_shows_its_traceback_and_leaves_old_goldens(repo, tmp_path):
    repo_dir, first, _ = repo
    out = tmp_path / "goldens"
    repin(
        first,
        producers=_producers(tmp_path, PLAIN),
        out_dir=out,
        repo=repo_dir,
        progress=lambda _: None,
    )
    old = (out / "g.h5").read_bytes()
    crash = _producers(
        tmp_path,
        """
        def _boom():
            raise RuntimeError("producer exploded on purpose")

        GROUPS = {"g": _boom}
        CLASS_MAP = [("*", "bitwise")]
    """,
    )
    with pytest.raises(ProducerRunError, match="producer exploded on purpose") as info:
        repin(first, producers=crash, out_dir=out, repo=repo_dir, progress=lambda _: None)
    assert "Traceback" in str(info.value)
    assert (out / "g.h5").read_bytes() == old
    assert sorted(p.name for p in out.iterdir()) == ["g.h5"]


# Where a repin is paused for the signal: each pause writes the marker (with the pid of the
# process that should be left running no longer) and sleeps in the main thread.
_PAUSES = {
    "before-worktree": """
        import os, pathlib, time
        import parity.machinery._worktree as worktree
        _real_git = worktree.git
        def _git(repo, *args):
            if args[:2] == ("worktree", "add"):
                pathlib.Path(MARKER).write_text(str(os.getpid()))
                time.sleep(60)
            return _real_git(repo, *args)
        worktree.git = _git
    """,
    "staging": """
        import os, pathlib, time
        import parity.store._staging as staging
        def _checkpoint(step):
            if step == "staged":
                pathlib.Path(MARKER).write_text(str(os.getpid()))
                time.sleep(60)
        staging._checkpoint = _checkpoint
    """,
}

# A thread that is not the main one and blocks no signal, as OpenBLAS's and jax's are: the
# test sends the signal to it (tgkill) to reproduce the delivery that made repin miss it.
_BYSTANDER = """
    import threading, time
    def _stand_by():
        pathlib.Path(MARKER + ".tid").write_text(str(threading.get_native_id()))
        time.sleep(600)
    threading.Thread(target=_stand_by, daemon=True).start()
"""


def _tgkill(pid: int, tid: int, signum: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    sys_tgkill = 234  # x86-64
    assert libc.syscall(sys_tgkill, pid, tid, signum) == 0, ctypes.get_errno()


@pytest.mark.parametrize("delivery", ["process", "other-thread"])
@pytest.mark.parametrize("where", ["before-worktree", "producing", "staging"])
def test_sigint_anywhere_leaves_old_goldens_no_worktree_and_no_process(
    repo, tmp_path, git, where, delivery
):
    """SIGINT at three points of a repin, sent to the process (the kernel picks the thread)
    or to a thread other than the main one: exit status 130, old goldens, no staged file,
    no worktree, no temporary folder, no producer left running."""
    if delivery == "other-thread" and os.uname().machine != "x86_64":
        pytest.skip("tgkill's syscall number is x86-64's")
    repo_dir, first, _ = repo
    out = tmp_path / "goldens"
    quiet = {"out_dir": out, "repo": repo_dir, "progress": lambda _: None}
    repin(first, producers=_producers(tmp_path, PLAIN), **quiet)
    old = (out / "g.h5").read_bytes()
    marker = tmp_path / "paused"
    producers = _producers(tmp_path, PLAIN)
    if where == "producing":
        producers = _producers(
            tmp_path,
            PLAIN.replace(
                "def _group():\n",
                "def _group():\n"
                "        import os, pathlib, time\n"
                f"        pathlib.Path({str(marker)!r}).write_text(str(os.getpid()))\n"
                "        time.sleep(120)\n",
            ),
        )
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    # SIGINT raising KeyboardInterrupt, as in the user's terminal: a CI job started in the
    # background of a non-interactive shell hands its children SIGINT ignored.
    prelude = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
    prelude += f"import pathlib\nMARKER = {str(marker)!r}\n" + textwrap.dedent(_BYSTANDER)
    prelude += textwrap.dedent(_PAUSES.get(where, ""))
    code = prelude + textwrap.dedent(
        f"""
        import faulthandler, signal, sys
        faulthandler.register(signal.SIGUSR1)  # a stack dump if the test finds it stuck
        from parity.run._repin import repin
        try:
            repin({first!r}, producers={str(producers)!r}, out_dir={str(out)!r},
                  repo={str(repo_dir)!r})
        except KeyboardInterrupt:
            sys.exit(130)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "TMPDIR": str(tmpdir)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    tid_file = Path(f"{marker}.tid")
    while not (marker.exists() and tid_file.exists() and marker.read_text()):
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, f"the repin never reached {where}"
        time.sleep(0.05)
    paused_pid = int(marker.read_text())
    if delivery == "process":
        proc.send_signal(signal.SIGINT)
    else:
        _tgkill(proc.pid, int(tid_file.read_text()), signal.SIGINT)
    try:
        # A few seconds normally; every pause sleeps 60 s or more, so a signal that is not
        # acted on shows as a run still going at the bound.
        proc.wait(timeout=50)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1)
        proc.kill()
        printed = proc.stdout.read().decode("utf-8", "replace") if proc.stdout else ""
        pytest.fail(f"repin went on for 50 s after SIGINT at {where}; its stack:\n{printed}")
    printed = proc.stdout.read().decode("utf-8", "replace") if proc.stdout else ""
    assert proc.returncode == 130, printed
    assert (out / "g.h5").read_bytes() == old
    assert sorted(p.name for p in out.iterdir()) == ["g.h5"]
    assert git(repo_dir, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert list(tmpdir.iterdir()) == []
    if paused_pid != proc.pid:  # the producer process: stopped with the repin
        with pytest.raises(ProcessLookupError):
            os.kill(paused_pid, 0)


def test_repin_tool_is_parity_repin_exit_code_and_message_for_unknown_sha(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "repin_goldens.py"), "--base", "no-such-rev",
         "--goldens", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2  # parity repin's: unusable input, old goldens untouched
    assert "not a commit" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_project_modules_named_like_parity_modules_are_not_shadowed(tmp_path, git_project):
    # `config` and `report` are also modules of parity's own folder, where the runner runs.
    files = {"src/config.py": "VALUE = 7.0\n", "src/report.py": "SCALE = 2.0\n"}
    repo = git_project(tmp_path, table=None, files=files, pin=None)
    producers = _producers(
        tmp_path,
        """
        import numpy as np
        import config
        import report

        GROUPS = {"g": lambda: {"x": np.float32(config.VALUE * report.SCALE)}}
        """,
    )
    repin("HEAD", producers=producers, out_dir=tmp_path / "g", repo=repo, progress=lambda _: None)
    with open_goldens(tmp_path / "g" / "g.h5") as g:
        assert float(g["x"]) == 14.0


# --------------------------------------------------------------------------- crash safety

TWO_GROUPS = """
    import numpy as np
    import tinylib

    GROUPS = {
        "g1": lambda: {"x": np.full(3, tinylib.VALUE, np.float32)},
        "g2": lambda: {"y": np.arange(4) * tinylib.VALUE},
    }
    CLASS_MAP = [("*", "bitwise")]
"""


def _repin_in_child(
    base: str, producers: Path, out: Path, repo_dir: Path, tmpdir: Path, prelude: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run a repin in a fresh process (TMPDIR=`tmpdir`), after `prelude` (which may patch
    parity to misbehave); exit 1 with the message on RepinError."""
    code = textwrap.dedent(prelude) + textwrap.dedent(
        f"""
        import sys
        from parity.run._repin import RepinError, repin
        try:
            repin({base!r}, producers={str(producers)!r}, out_dir={str(out)!r},
                  repo={str(repo_dir)!r}, progress=lambda line: print(line, flush=True))
        except RepinError as e:
            print(f"repin failed: {{e}}", flush=True)
            sys.exit(1)
        """
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "TMPDIR": str(tmpdir)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _kill_at(step: str) -> str:
    return f"""
        import os, signal
        import parity.store._staging as staging

        def _checkpoint(step):
            if step == {step!r}:
                os.kill(os.getpid(), signal.SIGKILL)

        staging._checkpoint = _checkpoint
    """


def _bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.fixture
def pinned(repo, tmp_path) -> dict[str, Any]:
    """Goldens of two groups pinned at the first commit, and those the second commit gives
    (pinned into another folder: repins are byte-reproducible)."""
    repo_dir, first, second = repo
    producers = _producers(tmp_path, TWO_GROUPS)
    out, ref = tmp_path / "goldens", tmp_path / "reference"
    quiet = {"producers": producers, "repo": repo_dir, "progress": lambda _: None}
    repin(first, out_dir=out, **quiet)
    repin(second, out_dir=ref, **quiet)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    return {
        "repo": repo_dir,
        "first": first,
        "second": second,
        "producers": producers,
        "out": out,
        "old": _bytes(out),
        "new": _bytes(ref),
        "tmpdir": tmpdir,
    }


@pytest.mark.parametrize(
    ("step", "committed"),
    [
        ("producing", False),
        ("staged", False),
        ("journal", True),
        ("replaced-1", True),
        ("done", True),
    ],
)
def test_sigkill_at_any_step_leaves_old_or_complete_new_goldens(
    pinned, git, monkeypatch, step, committed
):
    from parity.run._repin import recover_folder
    from parity.store import GoldenBusyError

    p = pinned
    assert p["old"] != p["new"]
    marker = p["tmpdir"].parent / "producing"
    prelude = _kill_at(step)
    if step == "producing":  # killed while the producer process runs
        prelude = f"""
            import os, pathlib, signal, threading, time
            def _watch():
                while not pathlib.Path({str(marker)!r}).exists():
                    time.sleep(0.05)
                os.kill(os.getpid(), signal.SIGKILL)
            threading.Thread(target=_watch, daemon=True).start()
        """
        p["producers"].write_text(
            p["producers"]
            .read_text()
            .replace(
                '"g2": lambda:',
                f'"g2": lambda: (open({str(marker)!r}, "w").close(), __import__("time").sleep(60))'
                " and {} or",
            )
        )
    proc = _repin_in_child(p["second"], p["producers"], p["out"], p["repo"], p["tmpdir"], prelude)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    on_disk = {k: v for k, v in _bytes(p["out"]).items() if not k.startswith(".")}
    pending = (p["out"] / ".parity-repin.journal").exists()
    assert pending == (committed and step != "done")
    if pending:  # mid-replace: reading is refused, whatever mix is on disk
        with pytest.raises(GoldenBusyError, match="mid-replace"):
            open_goldens(p["out"] / "g1.h5")
    else:
        assert on_disk == (p["new"] if committed else p["old"])
    if step == "producing":  # the producer process died with its parent
        time.sleep(0.5)
        assert git(p["repo"], "worktree", "list").count("\n") == 1  # ours and the leftover
    # The next repin (here its first step alone) finishes or discards, and cleans up.
    monkeypatch.setattr(tempfile, "tempdir", str(p["tmpdir"]))
    recover_folder(p["out"], repo=p["repo"])
    assert _bytes(p["out"]) == (p["new"] if committed else p["old"])
    assert git(p["repo"], "worktree", "list", "--porcelain").count("worktree ") == 1
    assert list(p["tmpdir"].iterdir()) == []
    with open_goldens(p["out"] / "g1.h5") as g:
        assert g.verify() == 1


def test_a_second_repin_refuses_while_the_first_holds_the_lock(pinned):
    p = pinned
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom pathlib import Path\n"
            "from parity.store._staging import folder_lock\n"
            f"with folder_lock(Path({str(p['out'])!r})):\n"
            "    print('locked', flush=True)\n    time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with pytest.raises(RepinError, match=rf"another repin \(pid {holder.pid}\) holds the lock"):
            repin(
                p["second"],
                producers=p["producers"],
                out_dir=p["out"],
                repo=p["repo"],
                progress=lambda _: None,
            )
    finally:
        holder.kill()
        holder.wait()
    left = _bytes(p["out"])
    assert left.pop(".parity-repin.lock") == f"{holder.pid}\n".encode()  # killed: not removed
    assert left == p["old"]
    # The kernel released the dead holder's lock: the next repin runs (and removes the file).
    repin(p["second"], producers=p["producers"], out_dir=p["out"], repo=p["repo"])
    assert _bytes(p["out"]) == p["new"]


def test_a_full_disk_is_a_clear_error_and_leaves_the_old_goldens(pinned):
    p = pinned
    # RLIMIT_FSIZE, set only once the producers ran, fails the writes of the new goldens
    # (Python ignores SIGXFSZ, so the write returns EFBIG) as a full disk would.
    prelude = """
        import resource
        import parity.run._goldens as r

        real = r.write_goldens

        def write_goldens(*args, **kwargs):
            resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
            return real(*args, **kwargs)

        r.write_goldens = write_goldens
    """
    proc = _repin_in_child(p["second"], p["producers"], p["out"], p["repo"], p["tmpdir"], prelude)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("repin failed: cannot write the new golden g1.h5 in ")
    assert "old goldens are untouched" in last
    assert _bytes(p["out"]) == p["old"]
    assert list(p["tmpdir"].iterdir()) == []


def test_a_read_only_or_unusable_golden_folder_is_a_clear_error(pinned, tmp_path):
    p = pinned
    quiet = {"producers": p["producers"], "repo": p["repo"], "progress": lambda _: None}
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    with pytest.raises(RepinError, match=r"cannot use .*file as the golden folder"):
        repin(p["second"], out_dir=not_a_folder, **quiet)
    # We run as root, for whom chmod cannot make a folder read-only; the immutable flag
    # can (creating files in it fails with EPERM, as on a read-only mount).
    if subprocess.run(["chattr", "+i", str(p["out"])], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here to make the folder read-only")
    try:
        with pytest.raises(
            RepinError, match=r"must be a writable folder\. Old goldens are untouched"
        ):
            repin(p["second"], out_dir=p["out"], **quiet)
    finally:
        subprocess.run(["chattr", "-i", str(p["out"])], check=True)
    assert _bytes(p["out"]) == p["old"]
