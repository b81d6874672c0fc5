"""Writing a golden file: atomically (a temporary file, fsynced, then `os.replace`) and
byte-reproducibly (see `parity.store._format`)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from parity.store._dtypes import digest, to_storage
from parity.store._errors import GoldenKeyError
from parity.store._format import (
    INDEX_ATTR,
    LIBVER,
    META_ATTR,
    SCHEMA_VERSION,
    VALUE_NAME,
    meta_digest,
)
from parity.store._keys import encode_key
from parity.store._provenance import collect_provenance
from parity.store._provenance_record import Provenance

__all__ = ["fsync_dir", "save_arrays", "set_text", "write_atomic", "write_goldens"]


def write_goldens(
    path: str | os.PathLike[str],
    arrays: Mapping[str, Any],
    *,
    classes: Mapping[str, str] | None = None,
    class_map_json: str = "",
    provenance: Provenance | None = None,
    order: Sequence[str] | None = None,
) -> Path:
    """Write `arrays` to a golden file at `path`, atomically and byte-reproducibly.

    The file is written to a temporary file in the same directory, flushed, fsynced and
    moved over `path` with `os.replace`; if anything fails, the temporary file is removed
    and an existing `path` is left as it was.

    **Arguments:**

    - `path`: destination file; its directory must exist.
    - `arrays`: key -> array-like (numpy or jax arrays, any shape including 0-d and empty).
    - `classes`: key -> tolerance class name; keys not named get "". Every key named here
      must be in `arrays`.
    - `class_map_json`: the pattern -> class map as JSON text, stored at the root.
    - `provenance`: the `Provenance`, stored at the root as JSON with sorted keys
      (`Provenance.to_json_dict`); None stores an empty one.
    - `order`: the declared forward order (taps by layer, trajectory leaves by step); each
      key's index is stored as `order`, -1 for keys not in it. Every key must be in `arrays`.

    **Returns:** `path` as a `Path`.
    """
    dest = Path(path)
    classes = dict(classes or {})
    order_list = list(order or [])
    keys = sorted(arrays)
    # Validate everything cheap before touching the disk, so typos fail fast.
    groups = {k: encode_key(k) for k in keys}
    unknown = sorted(set(classes) - set(arrays))
    if unknown:
        raise GoldenKeyError(f"classes names keys that are not in arrays: {unknown[:10]}")
    unknown = sorted(set(order_list) - set(arrays))
    if unknown:
        raise GoldenKeyError(f"order names keys that are not in arrays: {unknown[:10]}")
    if len(set(order_list)) != len(order_list):
        dup = sorted({k for k in order_list if order_list.count(k) > 1})
        raise GoldenKeyError(f"order lists keys more than once: {dup[:10]}")
    order_index = {k: i for i, k in enumerate(order_list)}
    recorded = provenance.to_json_dict() if provenance is not None else {}
    prov_json = json.dumps(recorded, sort_keys=True, allow_nan=False)

    # Built in memory (HDF5's core driver, same bytes as a file on disk) and written with
    # plain file I/O: a full disk or a file size limit then fails one `write` with a clean
    # OSError, where HDF5 writing to disk itself leaves its library state broken and can
    # crash the process at exit (found by tests/parity/run/test_repin.py's RLIMIT_FSIZE test).
    with h5py.File(
        f"parity-{dest.name}",
        "w",
        driver="core",
        backing_store=False,
        libver=LIBVER,
        track_order=False,
        track_times=False,
        locking=False,
    ) as f:
        f.attrs["schema_version"] = np.int64(SCHEMA_VERSION)
        set_text(f.attrs, "class_map", class_map_json)
        set_text(f.attrs, "provenance", prov_json)
        f.attrs["n_arrays"] = np.int64(len(keys))
        index: list[dict[str, Any]] = []
        for key in keys:
            # Converted one at a time so device arrays are fetched one at a time.
            stored, dtype_name = to_storage(key, arrays[key])
            group = _require_group(f, groups[key])
            dset = group.create_dataset(VALUE_NAME, data=stored, track_times=False)
            entry = {
                "class": str(classes.get(key, "")),
                "dtype": dtype_name,
                "key": key,
                "order": order_index.get(key, -1),
                "path": f"{groups[key]}/{VALUE_NAME}",
                "sha256": digest(stored),
                "shape": list(stored.shape),
            }
            set_text(dset.attrs, "class", entry["class"])
            set_text(dset.attrs, "dtype", dtype_name)
            set_text(dset.attrs, "sha256", entry["sha256"])
            dset.attrs["order"] = np.int64(entry["order"])
            index.append(entry)
        # Written last because the digests are known only now; keys are sorted, so
        # the text (and hence the file) is the same for the same inputs.
        index_json = json.dumps(index, sort_keys=True, separators=(",", ":"))
        set_text(f.attrs, INDEX_ATTR, index_json)
        meta = meta_digest(SCHEMA_VERSION, class_map_json, prov_json, len(keys), index_json)
        set_text(f.attrs, META_ATTR, meta)
        f.flush()
        image = f.id.get_file_image()
    write_atomic(dest, image, mode=_mode_for(dest))
    return dest


def write_atomic(path: Path, data: bytes, *, mode: int | None = None, strict: bool = False) -> None:
    """Write `data` to `path` atomically: a temporary file in the same folder, flushed and
    fsynced, given `mode` (else it keeps `mkstemp`'s 0600), moved over `path` with
    `os.replace`, then the folder fsynced (`fsync_dir`, `strict` as there). If anything
    fails, the temporary file is removed and an existing `path` is left as it was."""
    import tempfile  # here: a reader of goldens (`parity diff`, `show`) never writes one

    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(folder, strict=strict)


def set_text(attrs: h5py.AttributeManager, name: str, text: str) -> None:
    """Store `text` as a fixed-length UTF-8 string attribute (NUL-padded; an empty text
    takes one byte). Not h5py's default variable-length string: those live in HDF5's global
    heap, and a damaged global heap can make HDF5 loop forever on read (found by the
    corruption fuzzer, `tests/parity/store/test_store_fuzz.py`); fixed-length text sits in the
    attribute itself."""
    raw = text.encode("utf-8")
    attrs.create(name, np.bytes_(raw), dtype=h5py.string_dtype("utf-8", max(1, len(raw))))


def _require_group(f: h5py.File, group_path: str) -> h5py.Group:
    group: h5py.Group = f
    for segment in group_path.split("/"):
        sub = group.get(segment)
        if sub is None:
            sub = group.create_group(segment, track_order=False, track_times=False)
        group = sub  # pyright: ignore[reportAssignmentType]
    return group


def _mode_for(dest: Path) -> int:
    # mkstemp creates 0600; goldens are shared data, so keep an existing file's mode or 0644.
    try:
        return dest.stat().st_mode & 0o777
    except FileNotFoundError:
        return 0o644


def fsync_dir(directory: Path, *, strict: bool = False) -> None:
    """Make the renames in `directory` durable (fsync the folder itself).

    **Arguments:**

    - `directory`: the folder.
    - `strict`: raise `OSError` where the folder cannot be opened or synced (a repin's
      journal must be durable before it goes on); otherwise pass, since not every platform
      can open a directory.
    """
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        if strict:
            raise
        return
    try:
        os.fsync(fd)
    except OSError:
        if strict:
            raise
    finally:
        os.close(fd)


def save_arrays(
    directory: str | os.PathLike[str],
    name: str,
    arrays: Mapping[str, Any],
    *,
    classes: Callable[[str], str],
    order: Sequence[str] = (),
    provenance: Provenance | None = None,
) -> Path:
    """Write `arrays` in golden format to `directory/<name>.h5` (atomically), with the
    classes they were checked under, the forward order and the provenance of the process
    that produced them.

    **Arguments:**

    - `directory`: the folder to write into (created if missing).
    - `name`: the file's stem.
    - `arrays`: `{key: array}`.
    - `classes`: key -> the class it was checked under.
    - `order`: the forward order (keys not in `arrays` are left out).
    - `provenance`: the producing process's environment, when that was another process
      (`parity check` saves from its jax-free CLI process, whose XLA flags and ISA cap are
      not the producer's: recording them would make `parity diff` report a false drift);
      default this process's.

    **Returns:** the file written.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    keys = [k for k in order if k in arrays]
    return write_goldens(
        out / f"{name}.h5",
        arrays,
        classes={k: classes(k) for k in arrays},
        provenance=provenance if provenance is not None else collect_provenance(),
        order=keys,
    )
