"""The contract every decomposition target implements: `DecomposedModel`.

The train and eval steps (`decomp.train`, `decomp.eval`) call these members and nothing
else of a model; they never ask which class they hold (as levanter's training code holds
an `LmHeadModel`). A new target is a class with these members; `SiteLayout.of(model)`
(`decomp.stacked`) reads its site layout.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar, Protocol, runtime_checkable

from jax import Array

from decomp.components import SiteComponents, SiteMask
from decomp.config import Remat


@runtime_checkable
class DecomposedModel(Protocol):
    """A target whose weights at named *sites* are decomposed into components.

    Four parts:

    - **site layout**: `site_names` (canonical order), `site_kinds` (which sites stack on
      one leading axis: sites of a kind share a weight shape), `site_shapes`, `site_weight`;
    - **the output's form**: `has_seq_axis` and `divergence`;
    - **the forward** (per site, the public view): `clean_output`, `read_activations`,
      `clean_output_and_activations`;
    - **the by-kind forms** the steps call, everything per site stacked per kind on a
      leading axis (`decomp.stacked`): `clean_output_and_taps_by_kind`,
      `masked_output_by_kind`, `weight_deltas_by_kind`.

    Shapes below write `...` for the position axes: `[batch, seq]` when `has_seq_axis`,
    `[batch]` otherwise.
    """

    @property
    def site_names(self) -> tuple[str, ...]:
        """Sites in canonical order."""
        ...

    @property
    def site_kinds(self) -> dict[str, tuple[str, ...]]:
        """`{kind: its sites in canonical order}`; the kinds partition the sites."""
        ...

    def site_shapes(self) -> dict[str, tuple[int, int]]:
        """`{site: (d_in, d_out)}` in canonical order."""
        ...

    def site_weight(self, name: str) -> Array:
        """The weight `[d_out, d_in]` of one site, applied as `x @ W.T`."""
        ...

    #: Whether inputs and taps carry a sequence axis: int tokens `[batch, seq]` in,
    #: next-token logits `[batch, seq, vocab]` out (the GLU transformer); or float inputs
    #: `[batch, d_in]` in, real outputs `[batch, d_out]` out (the toys).
    has_seq_axis: ClassVar[bool]

    #: The divergence's name in metrics (`kl`, `mse`).
    divergence_name: ClassVar[str]

    def divergence(self, clean: Array, masked: Array) -> Array:
        """How far a masked output is from the clean one: an fp32 scalar, averaged over
        positions, exactly 0 when they are equal."""
        ...

    def clean_output(self, inputs: Array) -> Array:
        """Output of the unmodified model."""
        ...

    def read_activations(self, inputs: Array, wanted: Iterable[str]) -> dict[str, Array]:
        """Taps `{key: activation}` for a non-empty set of known keys."""
        ...

    def clean_output_and_activations(
        self, inputs: Array, wanted: Iterable[str]
    ) -> tuple[Array, dict[str, Array]]:
        """Clean output and taps of the same inputs."""
        ...

    def clean_output_and_taps_by_kind(self, inputs: Array) -> tuple[Array, dict[str, Array]]:
        """Clean output and the input of every site, `{kind: [n_kind, ..., d_in]}`."""
        ...

    def masked_output_by_kind(
        self,
        inputs: Array,
        components: Mapping[str, SiteComponents],
        masks: Mapping[str, SiteMask],
        *,
        remat: Remat = None,
    ) -> Array:
        """Output with every site run through its components under its mask, both stacked
        per kind (`V [n_kind, d_in, C]`, `U [n_kind, C, d_out]`, `mask [n_kind, ..., C]`).
        `remat` checkpoints a scan over blocks (`None`, `"nothing"`, `"dots"`); a target
        without one ignores it."""
        ...

    def weight_deltas_by_kind(self, components: Mapping[str, SiteComponents]) -> dict[str, Array]:
        """`{kind: W - (V @ U).T}`, `[n_kind, d_out, d_in]`."""
        ...
