"""A detached git worktree of a base commit, in a temporary folder, removed on every exit.

The user's working tree, index and branches are never touched: `git worktree add --detach`
only writes the new folder and a bookkeeping entry under `.git/worktrees`, which is removed
again (`git worktree remove --force`, then `git worktree prune`) on success, on failure and
on Ctrl-C or SIGTERM. SIGKILL leaves both behind; the folder records its owner's pid, and
`remove_stale_worktrees` (run by the next repin) removes worktrees whose owner is dead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from parity._errors import ParityError
from parity.machinery._signals import deferred_signals, signals_reach_main_thread, terminated
from parity.store._staging import OWNER_NAME, owner_dead


class GitError(ParityError, RuntimeError):
    """A git command failed, or a revision does not name a commit of the repository."""


def git(repo: Path, *args: str) -> str:
    """Run `git -C repo ARGS` without touching the user's index; **returns** its stdout,
    stripped. Raises `GitError` when git is missing or the command fails."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            check=False,
            # Never refresh the user's index as a side effect of a read.
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        )
    except FileNotFoundError:
        raise GitError("git is not installed or not on PATH; install git to repin") from None
    if proc.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed in {repo}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def file_at(repo: Path, sha: str, path: Path) -> bytes | None:
    """The bytes of `path` (a file under `repo`'s work tree) as commit `sha` holds it, or
    None where it holds no such file (read with `git show`; nothing is checked out)."""
    try:
        rel = path.resolve().relative_to(repo.resolve()).as_posix()
    except ValueError:  # outside the repository: no commit holds it
        return None
    proc = subprocess.run(
        ["git", "-C", str(repo), "show", f"{sha}:{rel}"],
        capture_output=True,
        check=False,
        env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
    )
    return proc.stdout if proc.returncode == 0 else None


def repo_root(path: Path | str = ".") -> Path:
    """The top folder of the git repository holding `path`."""
    return Path(git(Path(path), "rev-parse", "--show-toplevel"))


def resolve_sha(repo: Path | str, rev: str) -> str:
    """Resolve `rev` to a full 40-hex commit SHA, or raise `GitError` saying what to do."""
    if not rev or rev.startswith("-"):
        raise GitError(
            f"not a revision: {rev!r}; pass a commit SHA, e.g. --base $(git rev-parse HEAD~1)"
        )
    try:
        return git(Path(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except GitError:
        raise GitError(
            f"{rev!r} is not a commit of the repository at {repo}; list candidates with "
            "`git log --oneline` (a shallow clone may need `git fetch --unshallow`)"
        ) from None


#: Prefix of the temporary folders holding parity's worktrees.
WORKTREE_PREFIX = "parity-worktree-"


def remove_stale_worktrees(repo: Path | str) -> list[str]:
    """Remove parity's temporary worktrees whose owning process is dead (a repin killed
    with SIGKILL runs no cleanup), then `git worktree prune` the ones whose folder is gone.

    **Returns:** one line per worktree removed.
    """
    root = repo_root(repo)
    done: list[str] = []
    listing = git(root, "worktree", "list", "--porcelain")
    for line in listing.splitlines():
        if not line.startswith("worktree "):
            continue
        path = Path(line[len("worktree ") :])
        folder = path.parent
        if not folder.name.startswith(WORKTREE_PREFIX) or not owner_dead(folder / OWNER_NAME):
            continue
        with contextlib.suppress(GitError):
            git(root, "worktree", "remove", "--force", str(path))
        shutil.rmtree(folder, ignore_errors=True)
        done.append(f"removed the worktree {path}, left by a killed repin")
    git(root, "worktree", "prune")
    return done


@contextlib.contextmanager
def _sigterm_as_exception() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise terminated(signum)

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def temporary_worktree(repo: Path | str, sha: str, *, keep: bool = False) -> Iterator[Path]:
    """Check out `sha` as a detached worktree in a new temporary folder.

    **Arguments:**

    - `repo`: any folder inside the repository.
    - `sha`: a commit (resolved with `resolve_sha` first).
    - `keep`: leave the worktree in place afterwards (for debugging); its path is printed
      by the caller.

    **Returns:** (as a context manager) the worktree's path; it is removed on exit, whatever
    the exit, unless `keep`.
    """
    root = repo_root(repo)
    full = resolve_sha(root, sha)
    tmp = Path(tempfile.mkdtemp(prefix=WORKTREE_PREFIX))
    # Who owns it, so that `remove_stale_worktrees` can tell a killed repin's from a live one.
    (tmp / OWNER_NAME).write_text(f"{os.getpid()}\n")
    path = tmp / full[:12]
    added = False
    try:
        with signals_reach_main_thread(), _sigterm_as_exception():
            git(root, "worktree", "add", "--detach", "--quiet", str(path), full)
            added = True
            yield path
    finally:
        if not keep:
            # Ctrl-C or SIGTERM while cleaning up is held back until the worktree is gone
            # (not ignored: the run still stops), so a second interrupt cannot leave debris.
            with deferred_signals():
                if added:
                    with contextlib.suppress(GitError):
                        git(root, "worktree", "remove", "--force", str(path))
                shutil.rmtree(tmp, ignore_errors=True)
                with contextlib.suppress(GitError):
                    git(root, "worktree", "prune")
