"""`parity show GOLDEN [--json FILE] [--verify]`: a file's provenance, class map and
inventory; `--json -` prints the JSON instead of the text."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import IO, Any, cast

from parity.commands._common import EXIT_OK, CLIError, subparser
from parity.commands._files import key_classes, opened, read_errors
from parity.judge._dataflow import DATAFLOW, DECLARED, describe_order, order_hint
from parity.judge._floats import count
from parity.report import text_table
from parity.store import GoldenFile, GoldenStoreError

__all__ = ["add_parser", "format_inventory", "inventory", "run"]


def _verify(gf: GoldenFile) -> int:
    """`gf.verify()`: every checksum, and the file's index against each array's own
    attributes; store and HDF5 read errors become `CLIError`."""
    with read_errors(gf, None, "GOLDEN"):
        return gf.verify()


def inventory(golden: str | Path, *, verify: bool = False) -> dict[str, Any]:
    """What `parity show --json FILE` writes: provenance, class map and arrays of a file.

    **Arguments:**

    - `golden`: an HDF5 file (parity-written or plain).
    - `verify`: also load every array and verify its checksum, and check that the file's
      index agrees with every array's own attributes.

    **Returns:** a JSON-safe dict with `path`, `format` (`"parity"` or `"plain"`),
    `schema_version` (null for plain files), `provenance` (a dict, empty if none),
    `class_map` (the pinned map as parsed JSON, or null), `arrays` (a list of `{key, shape,
    dtype, class, order}`, sorted by key; `class` is the one `diff` would use without
    `--class`, `order` the pinned forward place or -1), `verified` (how many arrays were
    read and, in a parity file, checksum-verified; null without `verify`), `notes` (what
    a check of this file would refuse, one line each: a key under `calibrated` without a
    recorded spread, its class shown as `calibrated (no spread recorded)`) and `order`
    (`source`: `"dataflow"`, `"declared"` or null where not recorded; `describe`: that in
    words; `hint`: the one-line hint of `parity.judge._dataflow.order_hint`, or null).
    Raises `CLIError` for unusable input.
    """
    with opened(golden, "GOLDEN") as gf:
        try:
            infos = [gf.info(k) for k in gf]
        except GoldenStoreError as e:
            raise CLIError(f"GOLDEN: {e}") from None
        class_map = None
        if gf.class_map_json:
            try:
                class_map = json.loads(gf.class_map_json)
            except json.JSONDecodeError as e:
                raise CLIError(
                    f"GOLDEN: {gf.path}: the pinned class map is not JSON ({e}); repin the file"
                ) from None
        bound = key_classes(gf)
        notes: list[str] = []

        def resolve(key: str) -> str:
            # `show` always shows: a key a check could not judge (under `calibrated` with no
            # recorded spread) is listed as such, the check's error becoming a note.
            try:
                return bound(key)
            except CLIError as e:
                if not notes:
                    notes.append(str(e).removeprefix("GOLDEN: "))
                return "calibrated (no spread recorded)"

        verified = _verify(gf) if verify else None
        source = gf.provenance.order
        ordered = sorted((i for i in infos if i.order >= 0), key=lambda i: i.order)
        return {
            "path": str(gf.path),
            "format": "parity" if gf.is_parity_file else "plain",
            "schema_version": gf.schema_version,
            "provenance": gf.provenance.to_json_dict(),  # the JSON edge: as the file has it
            "class_map": class_map,
            "arrays": [
                {
                    "key": i.key,
                    "shape": list(i.shape),
                    "dtype": i.dtype.name,
                    "class": resolve(i.key),
                    "order": i.order,
                }
                for i in infos
            ],
            "verified": verified,
            "notes": notes,
            "order": {
                "source": source if source in (DATAFLOW, DECLARED) else None,
                "describe": describe_order(source),
                "hint": order_hint(source, [i.key for i in ordered]),
            },
        }


def format_inventory(doc: dict[str, Any]) -> str:
    """`inventory`'s dict as text for a terminal.

    **Arguments:**

    - `doc`: the output of `inventory`.

    **Returns:** the text: the file and its format, provenance, class map, then one row per
    array (key, shape, dtype, class, order).
    """
    arrays = doc["arrays"]
    if doc["format"] == "parity":
        kind = f"parity schema {doc['schema_version']}"
    else:
        kind = "plain HDF5 (no parity attributes: no checksums, every key compares bitwise)"
    lines = [f"golden: {doc['path']}", f"format: {kind}, {count(len(arrays), 'array')}"]
    if doc["verified"] is not None:
        verified = "none to verify (plain HDF5)" if doc["format"] != "parity" else "all verified"
        lines.append(f"checksums: {verified} ({count(int(doc['verified']), 'array')} read)")
    prov = doc["provenance"]
    lines.append("provenance:" + ("" if prov else " none recorded"))
    if prov:
        width = max(len(k) for k in prov)
        for k, value in sorted(prov.items()):
            if isinstance(value, dict) and "summary" in value:  # a calibration: its one line
                value = cast(dict[str, Any], value)["summary"]
            lines.append(f"  {k.ljust(width)}  {value}")
    cmap = doc["class_map"]
    if not isinstance(cmap, dict):
        lines.append("class map: none pinned")
    else:
        lines.append("class map (first matching rule wins):")
        lines += [f"  {rule[0]}  ->  {rule[1]}" for rule in cmap.get("rules", [])]
        # What parity check does with a key no rule matches (`parity.check`'s precedence):
        # the class recorded with its array, else bitwise. The class column shows each.
        fallback = "none pinned: an unmatched key takes its array's recorded class, else bitwise"
        lines.append(f"  default  ->  {cmap.get('default') or f'({fallback})'}")
    order = doc.get("order") or {}
    if order.get("describe") and doc["format"] == "parity":
        lines.append(f"forward order: {order['describe']}")
    if order.get("hint"):
        lines.append(f"hint: {order['hint']}")
    lines += [f"note: {note}" for note in doc.get("notes") or []]
    lines += ["", f"arrays ({len(arrays)}):"]
    rows = [["key", "shape", "dtype", "class", "order"]] + [
        [
            a["key"],
            str(tuple(a["shape"])),
            a["dtype"],
            a["class"],
            str(a["order"]) if a["order"] >= 0 else "-",
        ]
        for a in arrays
    ]
    lines += ["  " + line for line in text_table(rows, [False] * len(rows[0]))]
    return "\n".join(lines) + "\n"


_SHOW_DESCRIPTION = """\
Print a file's provenance, its pinned class map and every array (key, shape, dtype, the
class `parity diff` would check it under, forward order) without loading the data.
"""


def add_parser(sub: Any, help: str) -> None:
    """Add `show` to `sub` (argparse subparsers), `help` its line in `parity --help`."""
    show = subparser(
        sub,
        "show",
        help=help,
        description=_SHOW_DESCRIPTION,
    )
    show.usage = "parity show [-h] GOLDEN [--json FILE] [--verify]"
    show.add_argument("golden", metavar="GOLDEN", help="HDF5 file to describe")
    show.add_argument(
        "--json",
        dest="json_path",
        metavar="FILE",
        help="write the description as JSON to FILE instead of printing the text; '-' "
        "prints the JSON",
    )
    show.add_argument(
        "--verify", action="store_true", help="also load every array and verify its checksum"
    )


def run(args: argparse.Namespace, out: IO[str]) -> int:
    golden, target = args.golden, args.json_path
    doc = inventory(golden, verify=args.verify)
    if target is None:
        out.write(format_inventory(doc))
    elif target == "-":
        out.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    else:
        try:
            Path(target).write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
        except OSError as e:
            raise CLIError(f"cannot write {target}: {e}") from None
        out.write(f"JSON written to {target}\n")
    return EXIT_OK
