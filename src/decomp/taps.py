"""Site names, tap keys and the activation class each tap reads.

Sites are the decomposed weights: `layers.{i}.self_attn.{q,k,v,o}_proj` and
`layers.{i}.mlp.{gate,up,down}_proj`, in canonical order (layer ascending, then kind in
q, k, v, o, gate, up, down). Taps are `resid.{i}` (the residual entering block i) and every
site name (the activation entering that site's weight).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

#: Site kinds in canonical order, with the module path inside a layer.
SITE_KINDS: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
_KIND_PATH = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
_PATH_KIND = {path: kind for kind, path in _KIND_PATH.items()}

#: The intermediate class each site reads its input from.
KIND_CLASS = {
    "q": "post_ln1",
    "k": "post_ln1",
    "v": "post_ln1",
    "o": "attn_out",
    "gate": "post_ln2",
    "up": "post_ln2",
    "down": "mlp_inner",
}
#: Intermediate classes in the order they occur in a block.
TAP_CLASSES: tuple[str, ...] = ("resid", "post_ln1", "attn_out", "post_ln2", "mlp_inner")

_SITE_RE = re.compile(r"^layers\.(\d+)\.(self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj)$")
_RESID_RE = re.compile(r"^resid\.(\d+)$")

VALID_KEY_FORMS = (
    "resid.{i}",
    "layers.{i}.self_attn.q_proj",
    "layers.{i}.self_attn.k_proj",
    "layers.{i}.self_attn.v_proj",
    "layers.{i}.self_attn.o_proj",
    "layers.{i}.mlp.gate_proj",
    "layers.{i}.mlp.up_proj",
    "layers.{i}.mlp.down_proj",
)


class Tap(NamedTuple):
    """A parsed tap key: the block it is read in and the intermediate class it reads."""

    key: str
    layer: int
    tap_class: str


def site_name(layer: int, kind: str) -> str:
    """The canonical name of the site of `kind` in `layer`."""
    return f"layers.{layer}.{_KIND_PATH[kind]}"


def site_names(n_layer: int) -> tuple[str, ...]:
    """All site names of an `n_layer` model in canonical order."""
    return tuple(site_name(i, kind) for i in range(n_layer) for kind in SITE_KINDS)


def parse_site(name: str) -> tuple[int, str]:
    """`layers.3.mlp.up_proj` -> `(3, "up")`; a `ValueError` for anything else."""
    m = _SITE_RE.match(name)
    if m is None:
        raise ValueError(
            f"not a site name: {name!r}; expected one of {', '.join(VALID_KEY_FORMS[1:])}"
        )
    return int(m.group(1)), _PATH_KIND[m.group(2)]


def _valid_forms_message(n_layer: int) -> str:
    return f"valid keys, for i in 0..{n_layer - 1}: " + ", ".join(VALID_KEY_FORMS)


def parse_wanted(wanted: Iterable[str], n_layer: int) -> tuple[Tap, ...]:
    """Validate a wanted set of tap keys and parse each into a `Tap`, in the given order.

    Raises a `ValueError` listing the valid key forms for an empty set, an unknown key or a
    layer index out of range.
    """
    if isinstance(wanted, str):
        raise ValueError(
            f"wanted must be a collection of tap keys, not the string {wanted!r}; "
            f"wrap it in a list. {_valid_forms_message(n_layer)}"
        )
    keys = list(wanted)
    if not keys:
        raise ValueError(
            f"wanted is empty: ask for at least one tap. {_valid_forms_message(n_layer)}"
        )
    taps = []
    for key in dict.fromkeys(keys):
        m = _RESID_RE.match(key) if isinstance(key, str) else None
        if m is not None:
            tap = Tap(key, int(m.group(1)), "resid")
        else:
            m = _SITE_RE.match(key) if isinstance(key, str) else None
            if m is None:
                raise ValueError(f"unknown tap key {key!r}. {_valid_forms_message(n_layer)}")
            tap = Tap(key, int(m.group(1)), KIND_CLASS[_PATH_KIND[m.group(2)]])
        if not 0 <= tap.layer < n_layer:
            raise ValueError(
                f"tap key {key!r} names layer {tap.layer}, but the model has {n_layer} layers. "
                f"{_valid_forms_message(n_layer)}"
            )
        taps.append(tap)
    return tuple(taps)
