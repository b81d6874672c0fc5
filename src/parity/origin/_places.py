"""Where in the user's own source a recorded value was made: the innermost frame of a jax
operation's source info outside jax, parity and installed libraries, the library's frame
where the operation runs inside one (optax, equinox), and the chain of the user's frames
that led there (`Where`), as the interpreter places each value (`parity.origin.
_interpreter`) and a captured program places its call (`parity.origin._programs`).

This module imports the standard library only; the adapter inside `user_frame_of`.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

__all__ = ["CHAIN_FRAMES", "UNPLACED", "Frame", "Where", "frame_of", "relative", "user_frame_of"]

_PARITY = str(Path(__file__).resolve().parents[1])

Frame = tuple[str, int, str]  # (file, line, function); ("", 0, "") where unknown
_NOWHERE: Frame = ("", 0, "")
#: The user's own frame, the library's frame as a line ("" if none), and the chain of the
#: user's own frames, innermost first, each `file:line in function`, joined by "\n".
Where = tuple[Frame, str, str]
UNPLACED: Where = (_NOWHERE, "", "")
#: The most of the user's own frames a value's chain keeps (innermost first).
CHAIN_FRAMES = 8

_LIBRARIES = ("site-packages", "dist-packages")


def _file_kind(file_name: str) -> str:
    """Whose a frame's file is: `parity`'s own, an installed `library`'s, or the `user`'s."""
    return _kind_of_file(os.path.join(os.getcwd(), file_name))


@functools.lru_cache(maxsize=4096)
def _kind_of_file(path: str) -> str:
    """`_file_kind` of an absolute `path`, resolved once per path: a recording asks for the
    same few files at every operation."""
    file = str(Path(path).resolve())
    if file.startswith(_PARITY):
        return "parity"
    return "library" if any(part in _LIBRARIES for part in Path(file).parts) else "user"


def user_frame_of(source_info: Any) -> Where:
    """The user's own frame of a jax `SourceInfo` (the innermost outside jax, parity and
    installed libraries); where the innermost frame outside jax and parity lies in an
    installed library (optax, equinox), that frame as `file:line in function`; and the
    chain of the user's own frames that led there, innermost first (`CHAIN_FRAMES` at
    most)."""
    from parity.origin._adapter import user_frames

    own: Frame | None = None
    library = ""
    chain: list[str] = []
    for frame in user_frames(source_info):
        kind = _file_kind(frame.file_name)
        if kind == "parity":
            continue
        if kind == "library":
            if own is None and not library:
                library = f"{frame.file_name}:{frame.start_line} in {frame.function_name}"
            continue
        if own is None:
            own = (frame.file_name, int(frame.start_line), frame.function_name)
        chain.append(f"{frame.file_name}:{frame.start_line} in {frame.function_name}")
        if len(chain) == CHAIN_FRAMES:
            break
    return (own or _NOWHERE), library, "\n".join(chain)


def frame_of(eqn: Any) -> Where:
    """`user_frame_of` of `eqn`'s source info, or unplaced."""
    try:
        return user_frame_of(eqn.source_info)
    except Exception:  # a jax without this private API: the values stay unplaced
        return UNPLACED


def relative(file: str, root: str | Path | None) -> str:
    """A source file named relative to `root` where it lies inside it, else as recorded
    (how an origin's frames, and the diff held against them, name a file)."""
    if not file or root is None:
        return file
    try:
        return Path(file).resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return file
