"""The configuration of an SPD run: component count, CI function, loss weights, optimisers.

See docs/design.md, "The subject: SPD training". Everything that changes the traced program is
here, so a config plus a model fixes the compiled train step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal

import jax.numpy as jnp
import numpy as np

Remat = Literal["nothing", "dots"] | None

_REMAT_MODES = (None, "nothing", "dots")
_SOURCES_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class CIConfig:
    """Structure of the CI function.

    - `d_hidden`: width of the chunk transformer's residual stream.
    - `n_blocks`: pre-norm blocks per chunk.
    - `n_head`: attention heads; `d_hidden / n_head` must be an even integer (rotate-half
      RoPE).
    - `d_mlp`: hidden width of each block's MLP.
    - `sites_per_chunk`: consecutive sites per chunk; must divide the number of sites.
    - `rope_theta`: RoPE base.
    - `eps`: added to the mean square in every rms norm.
    """

    d_hidden: int
    n_blocks: int
    n_head: int
    d_mlp: int
    sites_per_chunk: int
    rope_theta: float = 10000.0
    eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("d_hidden", "n_blocks", "n_head", "d_mlp", "sites_per_chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CIConfig.{name} must be a positive int, got {value!r}")
        if self.d_hidden % self.n_head:
            raise ValueError(
                f"CIConfig: n_head ({self.n_head}) must divide d_hidden ({self.d_hidden}); "
                "pick d_hidden = n_head * head_dim"
            )
        if (self.d_hidden // self.n_head) % 2:
            raise ValueError(
                f"CIConfig: the head dim d_hidden / n_head = {self.d_hidden // self.n_head} "
                "must be even for rotate-half RoPE"
            )
        if not self.rope_theta > 0:
            raise ValueError(f"CIConfig.rope_theta must be positive, got {self.rope_theta}")
        if not self.eps > 0:
            raise ValueError(f"CIConfig.eps must be positive, got {self.eps}")

    @property
    def head_dim(self) -> int:
        return self.d_hidden // self.n_head


def _fail(field: str, value: object, allowed: str) -> ValueError:
    return ValueError(f"SPDConfig.{field} must be {allowed}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class SPDConfig:
    """Hyperparameters of SPD training.

    **Fields:**

    - `n_components`: `C`, components per site (>= 1).
    - `ci`: structure of the causal-importance function (`ci.sites_per_chunk` >= 1 and must
      divide the number of sites).
    - `faithfulness_coeff`, `importance_coeff`, `stochastic_recon_coeff`, `pgd_recon_coeff`:
      weights of the four loss terms (>= 0). A term whose weight is 0 is not computed; its
      metric reads 0.
    - `p_start`, `p_end`, `p_anneal_steps`: the importance-minimality exponent goes linearly
      from `p_start` at step 0 to `p_end` at step `p_anneal_steps`, then stays (p > 0).
    - `n_mask_samples`: stochastic mask draws per step (>= 1).
    - `recon_sites_per_chunk`: sites per stochastic-reconstruction chunk, in canonical order
      (>= 1; must divide the number of sites).
    - `pgd_warmup_steps`, `pgd_lr`: Adam ascent steps on the persistent sources per train
      step (>= 0) and their learning rate (> 0).
    - `lr_components`, `lr_ci`, `weight_decay`: AdamW for components and CI function.
    - `grad_clip`: global-norm clip of the component gradients (> 0).
    - `remat`: the masked forward's scan body under `jax.checkpoint` saving `"nothing"` or
      `"dots"`, or `None` for no checkpointing.
    - `sources_dtype`: storage dtype of the persistent sources, `"float32"` or `"bfloat16"`.
    - `l0_threshold`: eval counts a component active where `ci_lower > l0_threshold`.
    """

    n_components: int
    ci: CIConfig
    faithfulness_coeff: float = 1.0
    importance_coeff: float = 1e-3
    stochastic_recon_coeff: float = 1.0
    pgd_recon_coeff: float = 1.0
    p_start: float = 2.0
    p_end: float = 1.0
    p_anneal_steps: int = 1000
    n_mask_samples: int = 1
    recon_sites_per_chunk: int = 1
    pgd_warmup_steps: int = 2
    pgd_lr: float = 0.01
    lr_components: float = 1e-3
    lr_ci: float = 1e-3
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    remat: Remat = None
    sources_dtype: str = "float32"
    l0_threshold: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.n_components, int) or self.n_components < 1:
            raise _fail("n_components", self.n_components, "an int >= 1")
        spc = getattr(self.ci, "sites_per_chunk", None)
        if not isinstance(spc, int) or spc < 1:
            raise _fail("ci.sites_per_chunk", spc, "an int >= 1")
        for name in (
            "faithfulness_coeff",
            "importance_coeff",
            "stochastic_recon_coeff",
            "pgd_recon_coeff",
            "weight_decay",
            "l0_threshold",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise _fail(name, value, "a finite number >= 0")
        for name in ("p_start", "p_end", "pgd_lr", "lr_components", "lr_ci", "grad_clip"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise _fail(name, value, "a finite number > 0")
        for name, low in (
            ("p_anneal_steps", 0),
            ("n_mask_samples", 1),
            ("recon_sites_per_chunk", 1),
            ("pgd_warmup_steps", 0),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise _fail(name, value, f"an int >= {low}")
        if self.remat not in _REMAT_MODES:
            raise _fail("remat", self.remat, "None, 'nothing' or 'dots'")
        if self.sources_dtype not in _SOURCES_DTYPES:
            raise _fail("sources_dtype", self.sources_dtype, "'float32' or 'bfloat16'")

    @property
    def sources_jnp_dtype(self) -> np.dtype:
        """`sources_dtype` as a dtype."""
        return jnp.dtype(self.sources_dtype)

    def check_sites(self, site_names: Sequence[str]) -> None:
        """Check the chunk sizes against a model's sites; a `ValueError` names the mismatch."""
        n = len(site_names)
        for field, size in (
            ("ci.sites_per_chunk", self.ci.sites_per_chunk),
            ("recon_sites_per_chunk", self.recon_sites_per_chunk),
        ):
            if n % size:
                divisors = [d for d in range(1, n + 1) if n % d == 0]
                raise ValueError(
                    f"SPDConfig.{field} must divide the model's {n} sites, got {size}; "
                    f"allowed: {divisors}"
                )

    def p_at(self, step: jnp.ndarray | int) -> jnp.ndarray:
        """The importance exponent at `step`: linear from `p_start` to `p_end`, then flat."""
        if self.p_anneal_steps == 0:
            return jnp.asarray(self.p_end, jnp.float32)
        frac = jnp.clip(jnp.asarray(step, jnp.float32) / self.p_anneal_steps, 0.0, 1.0)
        return jnp.asarray(self.p_start + (self.p_end - self.p_start) * frac, jnp.float32)
