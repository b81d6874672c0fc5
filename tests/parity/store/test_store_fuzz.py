"""Corruption fuzzer over the committed goldens: damaged files are refused, never misread.

For each file in `goldens/`, hypothesis draws one corruption (a byte xor-ed with a random
mask at any offset, a zeroed range, a truncation or appended junk), writes the damaged copy
and runs `parity diff` (the copy as GOLDEN, or as ACTUAL) or `parity show --verify` on it
in-process. The property: the command exits 2 with one `parity: error: ...` line, or the
file's content, read independently with plain h5py (every object, every attribute, every
dataset's bytes), is what it was and the command prints and exits as on the undamaged file.
No exception escapes, and everything printed is valid UTF-8.

The example count per file is small for CI; set `PARITY_FUZZ_EXAMPLES` to run more (the
runs behind the note in `goldens/README.md` used thousands). Examples are derandomized, so
a CI run is reproducible.
"""

from __future__ import annotations

import io
import os
import pickle
import select
import shutil
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from parity import _cli as cli

ROOT = Path(__file__).resolve().parents[3]
GOLDENS = sorted((ROOT / "goldens").glob("*.h5"))
EXAMPLES = int(os.environ.get("PARITY_FUZZ_EXAMPLES", "6"))


def _content(path: Path) -> Any:
    """Everything an HDF5 reader sees in `path`, read with plain h5py; or the error."""
    try:
        out: dict[str, Any] = {}
        with h5py.File(path, "r", locking=False) as f:

            def attrs(obj: Any) -> list[tuple[str, str, str]]:
                return [
                    (name, type(v).__name__, repr(v.tolist() if isinstance(v, np.ndarray) else v))
                    for name, v in sorted(obj.attrs.items())
                ]

            def visit(name: str, obj: Any) -> None:
                if isinstance(obj, h5py.Dataset):
                    data = obj[()]
                    out[name] = ("dataset", obj.dtype.str, obj.shape, data.tobytes(), attrs(obj))
                else:
                    out[name] = ("group", attrs(obj))

            out["/"] = ("root", attrs(f))
            f.visititems(visit)
        return out
    except Exception as e:  # any failure is "not the original content"
        return f"unreadable: {type(e).__name__}: {e}"


@dataclass(frozen=True)
class _Run:
    rc: int
    out: str
    err: str


def _run(argv: list[str]) -> _Run:
    """`parity._cli.main(argv)` with stdout and stderr captured as strict UTF-8."""
    out_b, err_b = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(out_b, encoding="utf-8", errors="strict", newline="\n")
    err = io.TextIOWrapper(err_b, encoding="utf-8", errors="strict", newline="\n")
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        rc = cli.main(argv)
        out.flush()
        err.flush()
    finally:
        sys.stdout, sys.stderr = old
    return _Run(rc, out_b.getvalue().decode("utf-8"), err_b.getvalue().decode("utf-8"))


def forked(fn: Callable[[], Any], timeout: float = 60.0) -> Any:
    """`fn()` run in a forked child; its result, or a string saying how the child died.

    The HDF5 C library reads damaged files in C, where a crash would take pytest down and a
    hang could not be interrupted; in a child both become a reportable failure. (Found by
    this fuzzer: a zeroed range inside HDF5's global heap made a variable-length string
    read loop forever. parity no longer writes variable-length strings; see
    `parity.store._writer.set_text`.)
    """
    r, w = os.pipe()
    with warnings.catch_warnings():
        # jax, if another test imported it, warns about forking its threads; the child
        # touches only h5py and numpy and never returns into pytest.
        warnings.simplefilter("ignore", RuntimeWarning)
        pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 0
        try:
            os.close(r)
            try:
                payload = pickle.dumps(("ok", fn()))
            except BaseException:
                payload = pickle.dumps(("raised", traceback.format_exc()))
            with os.fdopen(w, "wb") as fh:
                fh.write(payload)
        except BaseException:
            code = 70
        finally:
            os._exit(code)
    os.close(w)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    with os.fdopen(r, "rb") as fh:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fh], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return f"the command hung (killed after {timeout:.0f} s)"
            chunk = os.read(fh.fileno(), 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"the process died of signal {os.WTERMSIG(status)}"
    kind, value = pickle.loads(b"".join(chunks))
    return value if kind == "ok" else f"an exception escaped:\n{value}"


def _commands(damaged: Path, clean: Path) -> dict[str, list[str]]:
    return {
        "diff-golden": ["diff", str(clean), str(damaged)],
        "diff-actual": ["diff", str(damaged), str(clean)],
        "show-verify": ["show", "--verify", str(damaged)],
    }


@st.composite
def _corruptions(draw: st.DrawFn, size: int) -> tuple[str, int, int]:
    kind = draw(st.sampled_from(["flip", "flip", "flip", "zero", "truncate", "append"]))
    if kind == "flip":
        return kind, draw(st.integers(0, size - 1)), draw(st.integers(1, 255))
    if kind == "zero":
        return kind, draw(st.integers(0, size - 1)), draw(st.integers(1, 256))
    if kind == "truncate":
        return kind, draw(st.integers(0, size - 1)), 0
    return kind, size, draw(st.integers(1, 512))


def corrupt(data: bytes, kind: str, offset: int, arg: int) -> bytes:
    """`data` damaged as `_corruptions` describes it."""
    if kind == "flip":
        return data[:offset] + bytes([data[offset] ^ arg]) + data[offset + 1 :]
    if kind == "zero":
        return data[:offset] + bytes(len(data[offset : offset + arg])) + data[offset + arg :]
    if kind == "truncate":
        return data[:offset]
    return data + bytes((i * 37 + arg) & 0xFF for i in range(arg))


def check_one(damaged: Path, clean: Path, command: str, want_content: Any, want: _Run) -> Any:
    """None if `command` on `damaged` holds the property, else what went wrong."""

    def run() -> str | None:
        got = _run(_commands(damaged, clean)[command])
        if got.rc == cli.EXIT_UNUSABLE:
            lines = got.err.splitlines()
            if len(lines) == 1 and lines[0].startswith("parity: error: "):
                return None
            return f"exit 2 without one error line: {got.err!r}"
        if _content(damaged) != want_content:
            return f"{command} exited {got.rc} on a file whose content changed: {got.err!r}"
        if (got.rc, got.out, got.err) != (want.rc, want.out, want.err):
            return f"{command} behaved differently on the same content: {got}"
        return None

    return forked(run)


@pytest.mark.parametrize("golden", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_a_damaged_golden_is_refused_or_reads_as_the_original(golden: Path, tmp_path: Path):
    assert GOLDENS, "no committed goldens to fuzz"
    clean = tmp_path / "clean.h5"
    damaged = tmp_path / "damaged.h5"
    shutil.copyfile(golden, clean)
    shutil.copyfile(golden, damaged)
    original = golden.read_bytes()
    want_content = _content(damaged)
    assert not isinstance(want_content, str), want_content
    baseline = {name: _run(argv) for name, argv in _commands(damaged, clean).items()}
    assert all(r.rc == 0 for r in baseline.values()), baseline

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(how=_corruptions(len(original)), command=st.sampled_from(sorted(baseline)))
    def check(how: tuple[str, int, int], command: str) -> None:
        damaged.write_bytes(corrupt(original, *how))
        assert check_one(damaged, clean, command, want_content, baseline[command]) is None, how

    check()
