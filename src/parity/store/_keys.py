"""Golden keys and the HDF5 group paths that store them.

A key is split on "." into segments, each escaped ("%" as "%25", "/" as "%2F"), and joined
by "/" into the group path that holds its dataset (`parity.store._format` has the layout and
why it round-trips). Keys that are empty, contain NUL, or have an empty segment (`a..b`,
`.a`, `a.`) are refused: HDF5 names cannot hold them.
"""

from __future__ import annotations

import re

from parity.store._errors import GoldenKeyError

__all__ = ["decode_path", "encode_key"]


_ESCAPE_RE = re.compile(r"%(25|2F)")


def _escape_segment(segment: str) -> str:
    return segment.replace("%", "%25").replace("/", "%2F")


def _unescape_segment(segment: str) -> str:
    return _ESCAPE_RE.sub(lambda m: "%" if m.group(1) == "25" else "/", segment)


def encode_key(key: str) -> str:
    """Return the HDF5 group path (without the leaf dataset) that stores `key`.

    **Arguments:**

    - `key`: a dotted key such as `"taps.llama.layers.3.mlp"`.

    **Returns:** the path, such as `"taps/llama/layers/3/mlp"`; the dataset itself is
    `path + "/" + VALUE_NAME`.

    Raises `GoldenKeyError` for an empty key, a key with NUL, or an empty segment.
    """
    if not isinstance(key, str):
        raise GoldenKeyError(f"golden keys must be str, got {type(key).__name__} {key!r}")
    if "\x00" in key:
        raise GoldenKeyError(f"golden key {key!r} contains NUL, which HDF5 names cannot hold")
    segments = key.split(".")
    if any(s == "" for s in segments):
        raise GoldenKeyError(
            f"golden key {key!r} has an empty segment (leading, trailing or doubled '.'); "
            "use non-empty dot-separated names such as 'taps.llama.layers.3'"
        )
    return "/".join(_escape_segment(s) for s in segments)


def decode_path(path: str) -> str:
    """Invert `encode_key`: the key stored at the group path `path`.

    **Arguments:**

    - `path`: a group path as written by `encode_key` (leading "/" allowed).

    **Returns:** the dotted key.
    """
    return ".".join(_unescape_segment(s) for s in path.strip("/").split("/"))
