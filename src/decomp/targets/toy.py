"""Toy targets: SimpleMLP, TMS (toy model of superposition) and ResidMLP.

Each is an `eqx.Module` with weights `[d_out, d_in]` applied as `x @ W.T` to float inputs
`[batch, d_in]`, and implements `decomp.model.DecomposedModel`: taps
are keyed by site name and read the activation entering that site's weight. The fused
accessor `clean_output_and_activations` is the trivial two-call form.

One private `_forward(inputs, site)` per toy serves the clean, tapped and masked runs:
`site(name, x)` applies the weight of `name` to its input `x`.
"""

from __future__ import annotations

import abc
import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from decomp.components import SiteComponents, SiteMask, site_output, weight_delta
from decomp.config import Remat
from decomp.losses import mse
from decomp.stacked import SiteLayout

#: `site(name, x) -> y`: apply the weight of site `name` to its input `x` `[..., d_in]`.
_Site = Callable[[str, Array], Array]


def _check_positive(config: object, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def _valid_keys(site_names: tuple[str, ...]) -> str:
    return "valid keys: " + ", ".join(site_names)


def _parse_wanted(wanted: Iterable[str], site_names: tuple[str, ...]) -> tuple[str, ...]:
    """The wanted tap keys, deduplicated in order; a `ValueError` listing the valid keys for
    a bare string, an empty set or an unknown key."""
    if isinstance(wanted, str):
        raise ValueError(
            f"wanted must be a collection of tap keys, not the string {wanted!r}; "
            f"wrap it in a list. {_valid_keys(site_names)}"
        )
    keys = tuple(dict.fromkeys(wanted))
    if not keys:
        raise ValueError(f"wanted is empty: ask for at least one tap. {_valid_keys(site_names)}")
    unknown = [k for k in keys if k not in site_names]
    if unknown:
        raise ValueError(f"unknown tap key(s) {unknown}. {_valid_keys(site_names)}")
    return keys


def _check_site(name: str, site_names: tuple[str, ...]) -> None:
    if name not in site_names:
        raise ValueError(f"not a site: {name!r}; sites: {', '.join(site_names)}")


def _masked_site(
    model: _Toy, components: Mapping[str, SiteComponents], masks: Mapping[str, SiteMask]
) -> _Site:
    """The `site` function of a masked run, after checking every site is covered."""
    for what, given in (("components", components), ("masks", masks)):
        missing = [s for s in model.site_names if s not in given]
        if missing:
            raise ValueError(
                f"{what} must cover every site; missing {', '.join(missing)} "
                f"(sites: {', '.join(model.site_names)})"
            )

    def site(name: str, x: Array) -> Array:
        return site_output(x, model.site_weight(name), components[name], masks[name])

    return site


class _Toy(eqx.Module):
    """What the three toys share: the rest of `DecomposedModel` (taps, the fused accessor,
    the by-kind forms), all through the subclass's `_forward`."""

    @property
    @abc.abstractmethod
    def site_names(self) -> tuple[str, ...]:
        """Sites in canonical order."""

    @abc.abstractmethod
    def site_weight(self, name: str) -> Array:
        """The weight `[d_out, d_in]` of one site, applied as `x @ W.T`."""

    @abc.abstractmethod
    def _forward(self, inputs: Array, site: _Site) -> tuple[Array, dict[str, Array]]:
        """Output and the input of every site, `{site: [batch, d_in]}`."""

    #: Float inputs `[batch, d_in]` in, real outputs `[batch, d_out]` out.
    has_seq_axis: ClassVar[bool] = False
    divergence_name: ClassVar[str] = "mse"

    def divergence(self, clean: Array, masked: Array) -> Array:
        """`mse` of the masked output against the clean one (the outputs are not logits)."""
        return mse(clean, masked)

    def _plain(self, name: str, x: Array) -> Array:
        return x @ self.site_weight(name).T

    def site_shapes(self) -> dict[str, tuple[int, int]]:
        """`{site: (d_in, d_out)}` in canonical order."""
        out = {}
        for name in self.site_names:
            d_out, d_in = self.site_weight(name).shape
            out[name] = (d_in, d_out)
        return out

    def clean_output(self, inputs: Array) -> Array:
        """Output of the unmodified model.

        **Arguments:**

        - `inputs`: `[batch, d_in]` floats.

        **Returns:** `[batch, d_out]`.
        """
        out, _ = self._forward(inputs, self._plain)
        return out

    def read_activations(self, inputs: Array, wanted: Iterable[str]) -> dict[str, Array]:
        """Taps of the clean forward: the input of each wanted site's weight.

        **Arguments:**

        - `inputs`: `[batch, d_in]` floats.
        - `wanted`: a non-empty collection of site names (a `ValueError` lists the valid
          keys otherwise).

        **Returns:** `{site: [batch, d_in of that site]}` in the order asked.
        """
        keys = _parse_wanted(wanted, self.site_names)
        _, acts = self._forward(inputs, self._plain)
        return {k: acts[k] for k in keys}

    def clean_output_and_activations(
        self, inputs: Array, wanted: Iterable[str]
    ) -> tuple[Array, dict[str, Array]]:
        """`(clean_output(inputs), read_activations(inputs, wanted))`: the two-call form.

        **Arguments:**

        - `inputs`: `[batch, d_in]` floats.
        - `wanted`: a non-empty collection of site names.

        **Returns:** `(output [batch, d_out], {site: [batch, d_in of that site]})`.
        """
        return self.clean_output(inputs), self.read_activations(inputs, wanted)

    # --- stacked per kind (the train and eval steps' layout, `decomp.stacked`) ----------

    @property
    def site_kinds(self) -> dict[str, tuple[str, ...]]:
        """`{kind: sites}`: by default every site is a kind of its own (the toys' sites
        differ in shape); a toy with repeated layers groups them."""
        return {name: (name,) for name in self.site_names}

    def clean_output_and_taps_by_kind(self, inputs: Array) -> tuple[Array, dict[str, Array]]:
        """Output and the input of every site, stacked per kind: `{kind: [n_kind, batch,
        d_in]}`."""
        out, acts = self._forward(inputs, self._plain)
        return out, SiteLayout.of(self).from_sites(acts)

    def masked_output_by_kind(
        self,
        inputs: Array,
        components: Mapping[str, SiteComponents],
        masks: Mapping[str, SiteMask],
        *,
        remat: Remat = None,
    ) -> Array:
        """Output with every site run through its components under its mask, both stacked
        per kind (the toys have no scan over layers: each site takes its row, and `remat`
        has nothing to checkpoint).

        **Arguments:**

        - `inputs`: `[batch, d_in]` floats.
        - `components`: `{kind: SiteComponents(V [n_kind, d_in, C], U [n_kind, C, d_out])}`.
        - `masks`: `{kind: SiteMask(mask [n_kind, batch, C], ...)}` (optional delta and
          routing `[n_kind, batch]`).
        - `remat`: ignored.

        **Returns:** `[batch, d_out]`. A `ValueError` names any site that either mapping
        misses.
        """
        del remat
        missing = [k for k in self.site_kinds if k not in components or k not in masks]
        if missing:
            raise ValueError(f"components and masks need every site kind; missing {missing}")
        layout = SiteLayout.of(self)
        site = _masked_site(self, layout.to_sites(components), layout.to_sites(masks))
        out, _ = self._forward(inputs, site)
        return out

    def weight_deltas_by_kind(self, components: Mapping[str, SiteComponents]) -> dict[str, Array]:
        """`{kind: W - (V @ U).T}`, `[n_kind, d_out, d_in]`."""
        return {
            kind: weight_delta(jnp.stack([self.site_weight(s) for s in sites]), components[kind])
            for kind, sites in self.site_kinds.items()
        }


# --- SimpleMLP ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SimpleMLPConfig:
    """Widths of a `SimpleMLP`: `d_in -> d_hidden[0] -> ... -> d_out`."""

    d_in: int
    d_hidden: tuple[int, ...]
    d_out: int

    def __post_init__(self) -> None:
        _check_positive(self, "d_in", "d_out")
        if not isinstance(self.d_hidden, tuple) or not all(
            isinstance(d, int) and d >= 1 for d in self.d_hidden
        ):
            raise ValueError(f"d_hidden must be a tuple of positive ints, got {self.d_hidden!r}")

    @property
    def widths(self) -> tuple[int, ...]:
        """`(d_in, *d_hidden, d_out)`."""
        return (self.d_in, *self.d_hidden, self.d_out)


class SimpleMLP(_Toy):
    """Linear layers with ReLU between: `x_{i+1} = relu(x_i @ W_i.T + b_i)`, no ReLU after
    the last. Sites `layers.{i}`, weights `[d_out_i, d_in_i]`, biases `[d_out_i]`."""

    config: SimpleMLPConfig = eqx.field(static=True)
    weights: tuple[Array, ...]
    biases: tuple[Array, ...]

    @classmethod
    def init(cls, config: SimpleMLPConfig, *, key: Array) -> SimpleMLP:
        """Random weights `N(0, 1/d_in)` and biases `N(0, 0.1^2)` (not zero, so that a lost
        bias shows in the output).

        **Arguments:**

        - `config`: the widths.
        - `key`: a PRNG key (keyword-only).

        **Returns:** the model.
        """
        widths = config.widths
        keys = jax.random.split(key, 2 * (len(widths) - 1))
        weights, biases = [], []
        for i, (d_in, d_out) in enumerate(itertools.pairwise(widths)):
            weights.append(jax.random.normal(keys[2 * i], (d_out, d_in)) / np.sqrt(d_in))
            biases.append(0.1 * jax.random.normal(keys[2 * i + 1], (d_out,)))
        return cls(config=config, weights=tuple(weights), biases=tuple(biases))

    @property
    def site_names(self) -> tuple[str, ...]:
        """`layers.0`, `layers.1`, ... in order."""
        return tuple(f"layers.{i}" for i in range(len(self.weights)))

    def site_weight(self, name: str) -> Array:
        """The weight `[d_out, d_in]` of `layers.{i}`."""
        _check_site(name, self.site_names)
        return self.weights[int(name.removeprefix("layers."))]

    def _forward(self, inputs: Array, site: _Site) -> tuple[Array, dict[str, Array]]:
        x, acts = inputs, {}
        for i, b in enumerate(self.biases):
            if i:
                x = jax.nn.relu(x)
            name = f"layers.{i}"
            acts[name] = x
            x = site(name, x) + b
        return x, acts


# --- TMS ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TMSConfig:
    """A toy model of superposition: `n_features` squeezed through `n_hidden`."""

    n_features: int
    n_hidden: int

    def __post_init__(self) -> None:
        _check_positive(self, "n_features", "n_hidden")


class TMS(_Toy):
    """Toy model of superposition (Elhage et al. 2022): `h = x @ W.T`,
    `out = relu(h @ W + b)`.

    Sites `linear1` (weight `W [n_hidden, n_features]`) and `linear2` (weight `W.T
    [n_features, n_hidden]`: tied, the transpose of the same array).
    """

    config: TMSConfig = eqx.field(static=True)
    W: Array
    b: Array

    @classmethod
    def init(cls, config: TMSConfig, *, key: Array) -> TMS:
        """Xavier-normal `W` and `b ~ N(0, 0.1^2)` (not zero, so that a lost bias shows).

        **Arguments:**

        - `config`: the sizes.
        - `key`: a PRNG key (keyword-only).

        **Returns:** the model.
        """
        k_w, k_b = jax.random.split(key)
        n_f, n_h = config.n_features, config.n_hidden
        w = jax.random.normal(k_w, (n_h, n_f)) * np.sqrt(2.0 / (n_f + n_h))
        b = 0.1 * jax.random.normal(k_b, (n_f,))
        return cls(config=config, W=w, b=b)

    @property
    def site_names(self) -> tuple[str, ...]:
        """`("linear1", "linear2")`."""
        return ("linear1", "linear2")

    def site_weight(self, name: str) -> Array:
        """`W` for `linear1`, `W.T` for `linear2`."""
        _check_site(name, self.site_names)
        return self.W if name == "linear1" else self.W.T

    def _forward(self, inputs: Array, site: _Site) -> tuple[Array, dict[str, Array]]:
        h = site("linear1", inputs)
        out = jax.nn.relu(site("linear2", h) + self.b)
        return out, {"linear1": inputs, "linear2": h}


# --- ResidMLP ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ResidMLPConfig:
    """A residual stream of width `d_embed` over `n_features`, with `n_layers` MLPs."""

    n_features: int
    d_embed: int
    d_mlp: int
    n_layers: int

    def __post_init__(self) -> None:
        _check_positive(self, "n_features", "d_embed", "d_mlp", "n_layers")


class ResidMLP(_Toy):
    """Residual MLPs: `x = inputs @ W_E.T`; per layer
    `x = x + relu(x @ W_in.T + b_in) @ W_out.T`; `out = x @ W_E` (unembed `W_E.T`).

    The embedding `W_E [d_embed, n_features]` is fixed (not a site). Sites
    `layers.{i}.mlp_in` (`W_in [d_mlp, d_embed]`) and `layers.{i}.mlp_out`
    (`W_out [d_embed, d_mlp]`); per-layer arrays are stacked on a leading `n_layers` axis.
    """

    config: ResidMLPConfig = eqx.field(static=True)
    W_E: Array
    W_in: Array
    b_in: Array
    W_out: Array

    @classmethod
    def init(cls, config: ResidMLPConfig, *, key: Array) -> ResidMLP:
        """`W_E` with unit-norm columns (each feature a random direction), `W_in`, `W_out`
        `N(0, 1/d_in)`, `b_in ~ N(0, 0.1^2)`.

        **Arguments:**

        - `config`: the sizes.
        - `key`: a PRNG key (keyword-only).

        **Returns:** the model.
        """
        cfg = config
        k_e, k_in, k_b, k_out = jax.random.split(key, 4)
        w_e = jax.random.normal(k_e, (cfg.d_embed, cfg.n_features))
        w_e = w_e / jnp.linalg.norm(w_e, axis=0, keepdims=True)
        l, d, m = cfg.n_layers, cfg.d_embed, cfg.d_mlp
        return cls(
            config=cfg,
            W_E=w_e,
            W_in=jax.random.normal(k_in, (l, m, d)) / np.sqrt(d),
            b_in=0.1 * jax.random.normal(k_b, (l, m)),
            W_out=jax.random.normal(k_out, (l, d, m)) / np.sqrt(m),
        )

    @property
    def site_names(self) -> tuple[str, ...]:
        """`layers.{i}.mlp_in`, `layers.{i}.mlp_out`, layer ascending."""
        return tuple(
            f"layers.{i}.{kind}"
            for i in range(self.config.n_layers)
            for kind in ("mlp_in", "mlp_out")
        )

    @property
    def site_kinds(self) -> dict[str, tuple[str, ...]]:
        """`mlp_in` and `mlp_out`, each with one site per layer."""
        n = self.config.n_layers
        return {k: tuple(f"layers.{i}.{k}" for i in range(n)) for k in ("mlp_in", "mlp_out")}

    def site_weight(self, name: str) -> Array:
        """`W_in[i]` for `layers.{i}.mlp_in`, `W_out[i]` for `layers.{i}.mlp_out`."""
        _check_site(name, self.site_names)
        _, layer, kind = name.split(".")
        return (self.W_in if kind == "mlp_in" else self.W_out)[int(layer)]

    def _forward(self, inputs: Array, site: _Site) -> tuple[Array, dict[str, Array]]:
        x, acts = inputs @ self.W_E.T, {}
        for i in range(self.config.n_layers):
            acts[f"layers.{i}.mlp_in"] = x
            hidden = jax.nn.relu(site(f"layers.{i}.mlp_in", x) + self.b_in[i])
            acts[f"layers.{i}.mlp_out"] = hidden
            x = x + site(f"layers.{i}.mlp_out", hidden)
        return x @ self.W_E, acts


__all__ = [
    "TMS",
    "ResidMLP",
    "ResidMLPConfig",
    "SimpleMLP",
    "SimpleMLPConfig",
    "TMSConfig",
]
