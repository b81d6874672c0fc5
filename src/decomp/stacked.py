"""Per-site data stacked per site kind on a leading layer axis: the layout of the train and
eval steps.

A target's sites fall into *kinds*: sites of one kind have one weight shape and differ only
by layer (the GLU transformer's `q`, `k`, ..., `down`; ResidMLP's `mlp_in`, `mlp_out`; a
toy whose sites all differ has one kind per site). Inside the jitted steps, everything that
exists once per site (components, masks, causal importances, weight deltas, persistent
sources, optimizer state) is a dict `{kind: array [n_kind, ...]}`, row `l` being the kind's
`l`-th site in canonical order. Every operation then runs once per kind, whatever the
depth: the program is flat in depth.

Per-site dicts (`{site: array}`) remain the public view, at the edges: `SiteLayout.to_sites`
and `SiteLayout.from_sites` convert, and `SiteLayout.canonical` lines per-site figures up in
canonical order (for sums that must add the sites in the order the per-site step did).
See docs/design.md, "The subject: SPD training", for how each random stream keeps its
per-site derivation under this layout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

K = TypeVar("K", bound=Hashable)


class _Sited(Protocol):
    """What `SiteLayout.of` reads of a target: the part of `decomp.model.DecomposedModel` it
    needs, said here because `decomp.model` imports this module (through
    `decomp.components`)."""

    @property
    def site_names(self) -> Sequence[str]: ...

    @property
    def site_kinds(self) -> Mapping[str, Sequence[str]]: ...


@dataclasses.dataclass(frozen=True)
class SiteLayout:
    """Which sites each kind stacks, and where each site sits in canonical order.

    **Fields:**

    - `names`: every site in canonical order.
    - `kinds`: `((kind, (site, ...)), ...)`: the kinds in order, each with its sites in
      canonical order (row `l` of a stacked array is the kind's `l`-th site).
    """

    names: tuple[str, ...]
    kinds: tuple[tuple[str, tuple[str, ...]], ...]

    def __post_init__(self) -> None:
        flat = [s for _, sites in self.kinds for s in sites]
        if sorted(flat) != sorted(self.names) or len(set(flat)) != len(flat):
            raise ValueError(
                f"the kinds must partition the sites: kinds cover {sorted(flat)}, "
                f"sites are {sorted(self.names)}"
            )
        if any(not sites for _, sites in self.kinds):
            raise ValueError("every kind needs at least one site")

    @classmethod
    def of(cls, model: _Sited) -> SiteLayout:
        """The layout of a target, from its `site_names` and `site_kinds`."""
        kinds = tuple((k, tuple(sites)) for k, sites in model.site_kinds.items())
        return cls(tuple(model.site_names), kinds)

    def sites(self, kind: str) -> tuple[str, ...]:
        """The sites of `kind`, row by row."""
        return dict(self.kinds)[kind]

    def where(self) -> dict[str, tuple[str, int]]:
        """`{site: (kind, row)}`."""
        return {s: (k, row) for k, sites in self.kinds for row, s in enumerate(sites)}

    def positions(self, kind: str) -> np.ndarray:
        """The canonical positions of the sites of `kind`, row by row (int32)."""
        index = {s: i for i, s in enumerate(self.names)}
        return np.asarray([index[s] for s in self.sites(kind)], np.int32)

    def to_sites(self, by_kind: Mapping[str, Any]) -> dict[str, Any]:
        """`{site: row of its kind}` in canonical order, for any pytree per kind (abstract
        leaves, as `jax.eval_shape` gives them, become the abstract row)."""
        where = self.where()

        def row_of(a: Any, row: int) -> Any:
            if isinstance(a, jax.ShapeDtypeStruct):
                return jax.ShapeDtypeStruct(a.shape[1:], a.dtype)
            return a[row]

        return {
            s: jax.tree.map(lambda a, row=where[s][1]: row_of(a, row), by_kind[where[s][0]])
            for s in self.names
        }

    def from_sites(self, by_site: Mapping[str, Any]) -> dict[str, Any]:
        """`{kind: the kind's sites stacked on a leading axis}`; a `ValueError` names the
        sites `by_site` misses."""
        missing = [s for s in self.names if s not in by_site]
        if missing:
            raise ValueError(
                f"every site is needed; missing {len(missing)}: {', '.join(missing[:8])}"
                + (" ..." if len(missing) > 8 else "")
            )
        return {
            k: jax.tree.map(lambda *xs: jnp.stack(xs), *(by_site[s] for s in sites))
            for k, sites in self.kinds
        }

    def canonical(self, by_kind: Mapping[str, Array]) -> Array:
        """`[n_sites, ...]`: the rows of every kind's array, in canonical site order."""
        where = self.where()
        return gather_rows(by_kind, [where[s] for s in self.names])


def gather_rows(sources: Mapping[K, Array], picks: Sequence[tuple[K, int]]) -> Array:
    """`out[r] = sources[picks[r][0]][picks[r][1]]`, in a number of operations that grows with
    the number of sources, not of picks.

    Rows are taken from each source at once (the whole source when it is picked entirely
    in order), concatenated, and put in the order of `picks` by one gather.
    """
    order: dict[K, list[tuple[int, int]]] = {}
    for r, (key, row) in enumerate(picks):
        order.setdefault(key, []).append((r, row))
    parts, placed = [], []
    for key, items in order.items():
        src = sources[key]
        rows = [row for _, row in items]
        parts.append(src if rows == list(range(src.shape[0])) else src[np.asarray(rows)])
        placed.extend(r for r, _ in items)
    out = parts[0] if len(parts) == 1 else jnp.concatenate(parts)
    if placed != list(range(len(picks))):
        out = out[np.argsort(np.asarray(placed))]
    return out


def sum_in_order(values: Array) -> Array:
    """`((values[0] + values[1]) + values[2]) + ...` over the leading axis, one addition at a
    time: the order a Python `sum` over per-site figures adds them in, so that a total is
    bit-identical to the per-site step's (a tree reduction may round differently)."""
    total, _ = jax.lax.scan(lambda acc, x: (acc + x, None), jnp.zeros_like(values[0]), values)
    return total
