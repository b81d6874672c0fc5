"""The protocol every decomposition target implements."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from jax import Array


@runtime_checkable
class DecomposedModel(Protocol):
    """A target whose weights at named *sites* are decomposed into components.

    Forward part (every target): sites, clean logits, taps (the activation entering each
    site's weight, keyed by site name) and the fused accessor that serves both from one
    forward. The decomposition part (masked output, weight deltas, shardings) is
    implemented by each target (`decomp.targets.glu_transformer`, `decomp.targets.toy`).
    """

    @property
    def site_names(self) -> tuple[str, ...]:
        """Sites in canonical order."""
        ...

    def site_weight(self, name: str) -> Array:
        """The weight `[d_out, d_in]` of one site, applied as `x @ W.T`."""
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
