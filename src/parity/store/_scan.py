"""Opening a golden file, the scan: every link checked for data outside the file (external
links or storage, virtual datasets, dangling soft links), every dataset mapped to its key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import h5py.h5d as h5d
import h5py.h5l as h5l
import h5py.h5o as h5o

from parity.store._errors import GoldenFormatError, GoldenUnsafeError, printable
from parity.store._format import REPIN_HINT, RESTORE_HINT, VALUE_NAME
from parity.store._keys import decode_path

__all__ = ["attr_str", "one_line", "scan"]

# Dataset handles the opening scan keeps for the first load of their key (saving a second
# open): at most this many, since an open dataset holds ~16 kB (measured), which for a file of
# 100,000 arrays would be 1.6 GB where the rest of reading it needs tens of MB.
_HELD_HANDLES = 512


def attr_str(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _escape_undecodable(text: str) -> str:
    """`text` from `_text` with each byte that was not UTF-8 written as `\\xNN`."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def one_line(text: str) -> str:
    return " ".join(text.split())


def _text(name: bytes | str) -> str:
    """An HDF5 name as text; bytes that are not UTF-8 are escaped, so the text encodes
    back to the same name (`encode("utf-8", "surrogateescape")`)."""
    return name.decode("utf-8", "surrogateescape") if isinstance(name, bytes) else name


def scan(
    f: h5py.File, file_path: Path, *, is_parity_file: bool
) -> tuple[dict[str, str], dict[str, Any]]:
    """Check every link of the open file `f` (at `file_path`) for outside references and map
    key -> dataset path.

    **Returns:** key -> dataset path, as text (undecodable bytes escaped), and key -> the
    dataset handle the scan opened (at most `_HELD_HANDLES` of them), for the first load of
    the key. Raises `GoldenUnsafeError` or `GoldenFormatError`.

    Low-level on purpose: h5py's `visititems_links` builds a link object per link and
    `file[name]` a high-level object per dataset, ~100 us each, where the C-level visit
    and `h5o.open` below cost a few us. The visit only follows hard links, so it never
    opens another file.
    """
    fid = f.id
    links: list[tuple[bytes, int]] = []
    fid.links.visit(lambda name, info: links.append((name, info.type)), info=True)
    # A hard link that other links sit under is a group; only the rest (datasets, empty
    # groups, named types, second links to a group) need opening to learn their type.
    # Saves reading every group's object header a second time (an `h5o.visit`).
    parents = {raw.rpartition(b"/")[0] for raw, _ in links}
    problems: list[str] = []
    datasets: list[tuple[str, Any]] = []
    soft: list[tuple[bytes, bytes]] = []
    # Collect first and check after: an exception raised inside h5py's C-level visit
    # callback surfaces as a SystemError, not as itself.
    for raw, kind in links:
        name = _text(raw)
        if kind == h5l.TYPE_EXTERNAL:
            filename, target = (_text(v) for v in fid.links.get_val(raw))
            problems.append(f"external link {name!r} -> {filename}:{target}")
        elif kind == h5l.TYPE_SOFT:
            soft.append((raw, fid.links.get_val(raw)))
        elif kind != h5l.TYPE_HARD:
            problems.append(f"link {name!r} of unsupported type {kind}")
        elif raw not in parents:
            dsid = h5o.open(fid, raw)
            if not isinstance(dsid, h5d.DatasetID):
                continue
            dcpl = dsid.get_create_plist()
            if dcpl.get_layout() == h5d.VIRTUAL:
                problems.append(f"virtual dataset {name!r}")
            elif dcpl.get_external_count():
                where = attr_str(dcpl.get_external(0)[0])
                problems.append(f"dataset {name!r} with external storage {where!r}")
            else:
                # Dropped at once beyond the cap: an open dataset costs ~16 kB of memory
                # that HDF5 keeps in its free lists once released.
                datasets.append((name, dsid if len(datasets) < _HELD_HANDLES else None))
    if not problems:
        # Resolved only when nothing external is present, since resolving a soft link
        # that leads into an external link would open the other file. A resolvable soft
        # link's target is listed under its own hard path, so it adds no key.
        # Bytes, not text, so names that are not UTF-8 resolve too.
        for raw, target in soft:
            parent = f[raw.rpartition(b"/")[0] or b"/"]
            if parent.get(target) is None:  # pyright: ignore[reportAttributeAccessIssue]
                problems.append(
                    f"soft link {_text(raw)!r} -> {_text(target)!r} resolves to nothing"
                )
    if problems:
        raise GoldenUnsafeError(
            f"{file_path} refers to data outside itself ({'; '.join(problems[:5])}"
            f"{'; ...' if len(problems) > 5 else ''}); expected self-contained datasets. "
            f"Rewrite it with parity.store.write_goldens or {REPIN_HINT}"
        )
    paths: dict[str, str] = {}
    dsids: dict[str, Any] = {}
    for name, dsid in datasets:
        key = _key_for(name, file_path, is_parity_file)
        if key in paths:
            raise GoldenFormatError(
                f"{file_path}: datasets {paths[key]!r} and {name!r} both map to key {key!r}; "
                "rename one of them"
            )
        paths[key] = name
        if dsid is not None:
            dsids[key] = dsid
    return paths, dsids


def _key_for(name: str, file_path: Path, is_parity_file: bool) -> str:
    group, _, leaf = name.rpartition("/")
    if not is_parity_file:
        if leaf == VALUE_NAME:
            # Only parity names datasets so; its root attributes must have been damaged.
            raise GoldenFormatError(
                f"{file_path}: dataset {name!r} is named as parity names arrays, but the "
                f"file has none of parity's root attributes: the file is damaged. " + RESTORE_HINT
            )
        # A name that is not UTF-8 gets a printable key (its bytes escaped); the path
        # keeps the raw name, so the dataset still opens.
        return printable(_escape_undecodable(name)).replace("/", ".")
    if leaf != VALUE_NAME or not group:
        raise GoldenFormatError(
            f"{file_path}: dataset {name!r} is not where parity puts arrays "
            f"('<key path>/{VALUE_NAME}'); the file was edited by hand. {REPIN_HINT}"
        )
    return decode_path(group)
