"""A recording of one program's values: what each value is, where the user's source made it,
and a fingerprint of its numbers (`parity.origin._fingerprints`), as plain numpy data that
crosses a process boundary.

A `Value` describes one value (primitive, shape, dtype, the values it was computed from,
source file, line and function). A `Recording` holds them in dataflow order (a value's
`id` is its position: every value comes after the values it reads), the program's outputs by
key, and per value its `Fingerprint` (and, for a value with two or more axes, one per row, as
the arrays of `Prints`).

`Recording.to_arrays()` / `Recording.from_arrays()` turn a recording into a flat dict of
numpy arrays and back (an `np.savez` file), each array's dtype kept by the golden store's
codec (bfloat16 and the other ml_dtypes as their bits and their dtype's name);
`Recording.summary()` drops the values' arrays and keeps their fingerprints and the outputs,
so the old side of a comparison can be recorded in one process and matched in another.

This module imports numpy only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from parity.judge import _mldtypes as mldtypes
from parity.origin._fingerprints import Fingerprint, Prints
from parity.origin._stored import StoredArrays

__all__ = ["FORMAT", "KINDS", "Recording", "Value", "format_of"]

#: The recording format: a file of another one is read as none (`Recording.from_arrays`
#: callers check `format_of`); 2 added the signed statistic, 3 each operation's literals and
#: call chain, 4 each array's dtype by the store's codec (`parity.judge._mldtypes.to_raw`),
#: 5 a large value's fingerprint made a chunk at a time (`_fingerprints.CHUNK`: its block
#: sums added in another order, its signs `_KEPT_SIGNS`'s over and over).
FORMAT = 5

#: Value kinds: an equation's result, a data movement of other values (a reshape, a scan's
#: iteration slice or stacked outputs, ...), a program input, a constant of the program.
KINDS = ("op", "move", "input", "const")


@dataclass(frozen=True)
class Value:
    """One value of a recorded program.

    **Fields:** `id` (its position in dataflow order), `primitive` (the jax primitive that
    computed it, `input` or `const`), `kind` (see `KINDS`), `shape`, `dtype` (its name),
    `inputs` (the ids of the values it was computed from; literals have none), `file`,
    `line`, `function` (the innermost frame of the user's own source: outside jax, parity
    and installed libraries; `""` and 0 where the program does not say), `library` (where
    the operation runs inside an installed library such as optax or equinox, that
    library's innermost frame as `file:line in function`; else `""`), `literals` (the
    operands written into the program as constants, `(position among the operands, value
    in its dtype's own words)`: what `1e-05` an `add` adds, which a changed constant
    changes; for an input or a constant of at most 16 elements, `(-1, its numbers)`),
    `chain` (the user's own frames that led to it, innermost first, each `file:line in
    function`: where an argument changed at a call site shows).
    """

    id: int
    primitive: str
    kind: str
    shape: tuple[int, ...]
    dtype: str
    inputs: tuple[int, ...]
    file: str = ""
    line: int = 0
    function: str = ""
    library: str = ""
    literals: tuple[tuple[int, str], ...] = ()
    chain: tuple[str, ...] = ()


@dataclass(frozen=True)
class Recording:
    """Every value of one program, in dataflow order.

    **Fields:**

    - `values`: one `Value` per value, `values[i].id == i`.
    - `fingerprints`: one `Fingerprint` per value.
    - `rows`: `{value id: its rows' fingerprints}` (`Prints`: arrays, a `Fingerprint` per row
      when indexed) for values with two or more axes.
    - `outputs`: `{key: value id}` in the dataflow order of the program's outputs (keys as
      `parity.judge._trees.flatten` names them); -1 for an output that is a literal.
    - `output_arrays`: `{key: array}`, the outputs' numbers (kept by `summary()`).
    - `arrays`: each value's numbers (a numpy array), or `None` for a summary; read from
      its file as they are asked for where the recording was read from one
      (`parity.origin._stored.StoredArrays`).
    """

    values: tuple[Value, ...]
    fingerprints: tuple[Fingerprint, ...]
    rows: Mapping[int, Prints]
    outputs: Mapping[str, int]
    output_arrays: Mapping[str, np.ndarray]
    arrays: Sequence[np.ndarray] | None = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        """Bytes of the values' arrays (0 for a summary), held or in its file."""
        if isinstance(self.arrays, StoredArrays):
            return self.arrays.nbytes
        return sum(a.nbytes for a in self.arrays) if self.arrays is not None else 0

    def summary(self) -> Recording:
        """The same recording without the values' arrays: fingerprints, outputs, metadata."""
        return replace(self, arrays=None)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The recording as a flat `{name: numpy array}` dict (`np.savez(path, **it)`);
        `Recording.from_arrays` reads it back."""
        v = self.values
        chain_ids: dict[tuple[str, ...], int] = {}
        for x in v:
            chain_ids.setdefault(x.chain, len(chain_ids))
        chains = ["\n".join(c) for c in chain_ids]
        out: dict[str, np.ndarray] = {
            "meta.primitive": np.array([x.primitive for x in v], dtype=str),
            "meta.kind": np.array([x.kind for x in v], dtype=str),
            "meta.dtype": np.array([x.dtype for x in v], dtype=str),
            "meta.file": np.array([x.file for x in v], dtype=str),
            "meta.function": np.array([x.function for x in v], dtype=str),
            "meta.library": np.array([x.library for x in v], dtype=str),
            "meta.literals": np.array([json.dumps(x.literals) for x in v], dtype=str),
            # Chains repeat (one per place and call path): a table, and an index per value.
            "meta.chains": np.array(chains, dtype=str),
            "meta.chain": np.array([chain_ids[x.chain] for x in v], dtype=np.int64),
            "meta.line": np.array([x.line for x in v], dtype=np.int64),
            "meta.ndim": np.array([len(x.shape) for x in v], dtype=np.int64),
            "meta.shape": np.array([d for x in v for d in x.shape], dtype=np.int64),
            "meta.n_inputs": np.array([len(x.inputs) for x in v], dtype=np.int64),
            "meta.inputs": np.array([i for x in v for i in x.inputs], dtype=np.int64),
            "meta.output_keys": np.array(list(self.outputs), dtype=str),
            "meta.output_ids": np.array(list(self.outputs.values()), dtype=np.int64),
            "meta.row_of": np.repeat(
                np.array(list(self.rows), dtype=np.int64), [len(fs) for fs in self.rows.values()]
            ),
            "meta.format": np.array(FORMAT, dtype=np.int64),
        }
        out |= _prints_to_arrays("fp", Prints.of(self.fingerprints))
        out |= _prints_to_arrays("row", Prints.joined(list(self.rows.values())))
        # Each array's dtype by the store's codec: a bfloat16 value as uint16 and its name.
        names = []
        for j, key in enumerate(self.outputs):
            out[f"output.{j}"], name = mldtypes.to_raw(self.output_arrays[key])
            names.append(name)
        out["meta.output_dtypes"] = np.array(names, dtype=str)
        if self.arrays is not None:
            names = []
            for i, a in enumerate(self.arrays):
                out[f"array.{i}"], name = mldtypes.to_raw(a)
                names.append(name)
            out["meta.array_dtypes"] = np.array(names, dtype=str)
        return out

    @classmethod
    def read(cls, path: str | Path) -> Recording:
        """The recording `np.savez(path, **recording.to_arrays())` (or an
        `parity.origin._stored.ArraysWriter`) wrote: its summary read now, each value's
        numbers from the file when asked for (the file stays open while they are held)."""
        npz = np.load(path)
        try:
            plain = {k: npz[k] for k in npz.files if not k.startswith("array.")}
            summary = cls.from_arrays(plain)
        except BaseException:
            npz.close()
            raise
        if not summary.values or "meta.array_dtypes" not in plain:
            npz.close()
            return summary
        return replace(summary, arrays=StoredArrays(npz, plain["meta.array_dtypes"]))

    @classmethod
    def from_arrays(cls, data: Mapping[str, np.ndarray]) -> Recording:
        """Read back what `to_arrays` wrote (an `np.load` of its file); values' arrays come
        back when they were written. Raises `ValueError` for another format than `FORMAT`
        (a file an older parity wrote: record it again)."""
        if format_of(data) != FORMAT:
            raise ValueError(
                f"a recording of format {format_of(data)}, where this parity reads {FORMAT}: "
                "record it again"
            )
        shapes = _split(data["meta.shape"], data["meta.ndim"])
        inputs = _split(data["meta.inputs"], data["meta.n_inputs"])
        n = len(data["meta.primitive"])
        library = data["meta.library"] if "meta.library" in data else [""] * n
        literals = [
            tuple((int(k), str(x)) for k, x in json.loads(str(t))) for t in data["meta.literals"]
        ]
        chains = [tuple(str(c).split("\n")) if str(c) else () for c in data["meta.chains"]]
        values = tuple(
            Value(
                i,
                str(p),
                str(k),
                shapes[i],
                str(d),
                inputs[i],
                str(f),
                int(ln),
                str(fn),
                str(lib),
                literals[i],
                chains[int(data["meta.chain"][i])],
            )
            for i, (p, k, d, f, ln, fn, lib) in enumerate(
                zip(
                    data["meta.primitive"],
                    data["meta.kind"],
                    data["meta.dtype"],
                    data["meta.file"],
                    data["meta.line"],
                    data["meta.function"],
                    library,
                    strict=True,
                )
            )
        )
        prints = _prints_from_arrays("fp", data)
        every_row = _prints_from_arrays("row", data)
        owners = np.asarray(data["meta.row_of"])
        starts = np.flatnonzero(np.diff(owners, prepend=-2)).tolist()  # runs of one value
        rows = {
            int(owners[a]): every_row[a:b]
            for a, b in zip(starts, [*starts[1:], len(owners)], strict=True)
        }
        keys = [str(k) for k in data["meta.output_keys"]]
        arrays = None
        if values and "array.0" in data:
            kept = data["meta.array_dtypes"]
            arrays = tuple(
                mldtypes.from_raw(np.asarray(data[f"array.{i}"]), str(kept[i]))
                for i in range(len(values))
            )
        output_dtypes = [str(d) for d in data["meta.output_dtypes"]]
        return cls(
            values=values,
            fingerprints=tuple(prints),
            rows=rows,
            outputs=dict(zip(keys, (int(i) for i in data["meta.output_ids"]), strict=True)),
            output_arrays={
                k: mldtypes.from_raw(np.asarray(data[f"output.{j}"]), output_dtypes[j])
                for j, k in enumerate(keys)
            },
            arrays=arrays,
        )


def _split(flat: np.ndarray, counts: np.ndarray) -> list[tuple[int, ...]]:
    ends = np.cumsum(counts)
    return [tuple(int(x) for x in flat[e - c : e]) for c, e in zip(counts, ends, strict=True)]


#: A `Prints`' arrays, as a recording's file names them after their prefix.
_FIELDS = ("digest", "special", "max_abs", "stats")


def _prints_to_arrays(prefix: str, prints: Prints) -> dict[str, np.ndarray]:
    return {f"{prefix}.{field}": getattr(prints, field) for field in _FIELDS}


def _prints_from_arrays(prefix: str, data: Mapping[str, Any]) -> Prints:
    return Prints(*(data[f"{prefix}.{field}"] for field in _FIELDS))


def format_of(data: Mapping[str, Any]) -> int:
    """The format of a recording written by `Recording.to_arrays` (1 where it says none)."""
    return int(data["meta.format"]) if "meta.format" in data else 1
