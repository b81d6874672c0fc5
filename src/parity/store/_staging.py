"""Replace a folder's golden files all at once, crash-safely, one writer at a time.

`repin` writes several `<group>.h5` files; killing it (SIGKILL, power loss) at any moment
must leave either the old files byte-identical or the new ones complete, never a mix that
a check would read. The protocol:

1. **Lock.** `folder_lock` takes an exclusive, non-blocking `flock` on `LOCK_NAME` in the
   folder, with the holder's pid in it; a second repin fails at once naming that pid. The
   kernel drops the lock when its holder dies, so a killed repin never blocks the next.
2. **Stage.** Every new file is written completely (fsynced, `write_goldens` is atomic on
   its own) as `.<name>.new` beside its destination. Until step 3 a crash leaves the old
   files untouched; the staged ones are debris.
3. **Journal.** The planned renames are written to `JOURNAL_NAME` atomically (temporary
   file, fsync, `os.replace`, fsync of the folder). From here on the new set is committed.
4. **Replace.** Each staged file is moved over its destination (`os.replace`), then the
   journal is removed.

While a journal is present the folder is mid-replace: `parity.store.open_goldens` refuses
to read it. `recover` (run by every repin under the lock before it does anything else, and
by `tools/repin_goldens.py --recover`) rolls a journal forward, then removes staged and
temporary files a killed repin left and its temporary runner folders; the repin removes its
stale worktrees itself (`parity.machinery._worktree.remove_stale_worktrees`: the store knows no
git). A folder a process owns holds `OWNER_NAME` with that process's pid (`owned_tempdir` here,
the worktrees in `parity.machinery._worktree`), so a later run can tell a killed owner's from a
live one (`owner_dead`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from parity._errors import ParityError
from parity.judge._floats import count
from parity.store._format import JOURNAL_NAME
from parity.store._writer import fsync_dir, write_atomic

__all__ = [
    "JOURNAL_NAME",
    "LOCK_NAME",
    "OWNER_NAME",
    "FolderLockedError",
    "StagingError",
    "commit_staged",
    "folder_lock",
    "owned_tempdir",
    "owner_dead",
    "recover",
    "staged_name",
]

#: The lock file a repin holds in the golden folder while it runs.
LOCK_NAME = ".parity-repin.lock"
#: Prefix of the temporary folders a repin's producer process writes its arrays to.
RUNNER_PREFIX = "parity-repin-"
#: File in a temporary folder naming the process that owns it.
OWNER_NAME = "parity-owner.pid"


def owner_dead(owner_file: Path) -> bool:
    """Whether the pid in `owner_file` names no running process. A missing or unreadable
    file is not proof: the folder may belong to a running parity that writes none (an
    older version), so it is left alone."""
    try:
        pid = int(owner_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class StagingError(ParityError, RuntimeError):
    """The golden folder cannot be written or recovered; the message says what to do."""


class FolderLockedError(StagingError):
    """Another repin holds the folder's lock."""


def _checkpoint(step: str) -> None:
    """Called at each named step of a replace; does nothing. Tests replace it to kill the
    process at that step (see tests/parity/run/test_repin.py,
    `test_sigkill_at_any_step_leaves_old_or_complete_new_goldens`)."""


def staged_name(dest: Path) -> Path:
    """Where the new version of `dest` is staged: `.<name>.new` in the same folder."""
    return dest.with_name(f".{dest.name}.new")


def _owner_pid(text: str) -> int | None:
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[Path]:
    """Hold the exclusive repin lock on `folder` (created if missing) for the block.

    **Returns:** (as a context manager) the lock file's path. Raises `FolderLockedError`
    at once if another process holds it, `StagingError` if the folder cannot be written.
    """
    path = folder / LOCK_NAME
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StagingError(
                f"cannot create the lock file {path}: {e.strerror or e}; the golden folder "
                f"{folder} must be a writable folder. Old goldens are untouched"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _owner_pid(os.pread(fd, 64, 0).decode("ascii", "replace"))
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StagingError(f"cannot lock {path}: {e}") from None
            raise FolderLockedError(
                f"another repin (pid {holder if holder is not None else 'unknown'}) holds the "
                f"lock on {folder}; wait for it, or remove {path} if no repin runs"
            ) from None
        # The holder removes the file on release; if it did so between our open and our
        # lock, we hold a lock on a file nobody else sees: start again.
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


@contextlib.contextmanager
def owned_tempdir(prefix: str) -> Iterator[Path]:
    """A temporary folder holding `OWNER_NAME` (this pid), removed on exit; `recover`
    removes those whose owner died without removing them (SIGKILL)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        (tmp / OWNER_NAME).write_text(f"{os.getpid()}\n")
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def commit_staged(folder: Path, renames: Sequence[tuple[Path, Path]]) -> None:
    """Move every staged file over its destination, crash-safely (steps 3 and 4 above).

    **Arguments:**

    - `folder`: the golden folder; every path is in it.
    - `renames`: `(staged, dest)` pairs; every staged file complete and fsynced.

    If a rename fails, the journal stays, so the next repin (or `recover`) completes it,
    and reading the folder is refused until then; raises `StagingError` saying so.
    """
    journal = folder / JOURNAL_NAME
    plan = {"pid": os.getpid(), "renames": [[s.name, d.name] for s, d in renames]}
    _checkpoint("staged")
    try:
        write_atomic(journal, json.dumps(plan).encode("utf-8"), strict=True)
    except OSError as e:
        raise StagingError(
            f"cannot write the journal {journal}: {e.strerror or e}; old goldens are untouched"
        ) from None
    _checkpoint("journal")
    try:
        _roll_forward(folder, plan["renames"])
    except OSError as e:
        raise StagingError(
            f"replacing the goldens in {folder} failed half-way ({e}); the new files are "
            f"complete and {journal} lists them: run the repin again (or "
            "`python tools/repin_goldens.py --recover`) to finish"
        ) from None
    journal.unlink()
    fsync_dir(folder, strict=True)
    _checkpoint("done")


def _roll_forward(folder: Path, renames: Sequence[Sequence[str]]) -> int:
    done = 0
    for n, (staged, dest) in enumerate(renames):
        src = folder / staged
        if src.exists():  # else moved already, before an interruption
            os.replace(src, folder / dest)
            done += 1
        _checkpoint(f"replaced-{n + 1}")
    fsync_dir(folder, strict=True)
    return done


def _is_debris(name: str) -> bool:
    """Staged files (`.<name>.new`) and temporary files (`.<name>.<random>.tmp`) that
    parity writes in a golden folder."""
    return name.startswith(".") and (name.endswith(".new") or name.endswith(".tmp"))


def recover(folder: Path) -> list[str]:
    """Finish or clean up after a repin that was killed. Call it under `folder_lock`.

    Rolls a journal forward (the new files are complete once it exists), removes staged and
    temporary files and temporary runner folders (`parity-repin-*`) whose owner is dead.
    Stale worktrees are the caller's (`parity.machinery._worktree.remove_stale_worktrees`).

    **Returns:** one line per thing done, for the progress output.
    """
    done: list[str] = []
    if not folder.is_dir():
        return done
    journal = folder / JOURNAL_NAME
    if journal.exists():
        try:
            plan = json.loads(journal.read_text(encoding="utf-8"))
            renames = [(str(s), str(d)) for s, d in plan["renames"]]
        except (ValueError, KeyError, TypeError) as e:
            raise StagingError(
                f"{journal} is unreadable ({e}); the folder may hold a mix of old and new "
                "goldens: restore them from version control, delete the journal and repin"
            ) from None
        n = _roll_forward(folder, renames)
        journal.unlink()
        fsync_dir(folder, strict=True)
        done.append(f"finished an interrupted replace: {n} of {count(len(renames), 'file')} moved")
    for p in sorted(folder.iterdir()):
        if _is_debris(p.name) and p.is_file():
            p.unlink()
            done.append(f"removed {p.name}, left by an interrupted repin")
    for tmp in sorted(Path(tempfile.gettempdir()).glob(f"{RUNNER_PREFIX}*")):
        if tmp.is_dir() and owner_dead(tmp / OWNER_NAME):
            shutil.rmtree(tmp, ignore_errors=True)
            done.append(f"removed {tmp}, left by a killed repin")
    return done
