"""Pre-refactor implementations, kept beside the new ones as live references.

Everything here is what only the references use: the unrolled GLU forward
(`clean_output`, `read_activations`, `clean_output_and_activations`), the per-site inits
(`init_components`, `init_ci_function`, `init_sources`), the per-site forms of the step's
pieces (`causal_importances`, `ci_pre_activations`, `stochastic_masks`, `route_chunk`,
`masked_output`, `weight_deltas`) and the per-site train and eval steps
(`decomp.legacy.train`, `decomp.legacy.eval`, with their own copy of the losses in
`decomp.legacy.losses`). A name means one function in each package: `decomp.legacy.X` is
the reference of `decomp`'s `X` (or of its `X_by_kind`), with the same signature, and the
references call each other, never the refactored form they check. `decomp` itself never
imports `decomp.legacy`.

Each module imports no private (`_`-prefixed) name of the refactored modules and reaches
no private attribute of their objects, and it imports from them only the shared names
listed below, so an edit inside the refactored code cannot silently change its reference
(`tests/decomp/test_legacy_independence.py` enforces all three).

What the references share with the refactored code, and why that is safe:

- the layer primitives of `decomp.nn` (`rms_norm`, `rope_inv_freq`, `rope_cos_sin`,
  `apply_rope`, `attention`): the refactors did not touch them, and a change to them moves
  the forward goldens (`forward_llama`, `forward_qwen3`: logits bitwise, taps per class),
  which the live differentials cannot see;
- `decomp.taps.parse_wanted`: the tap-key grammar, pinned by the golden key names and by
  its own unit tests;
- the data types and the contract the references build, read or call (`GLUConfig`,
  `GLUTransformer`, `CIConfig`, `CIFunction`, `CIBlocks`, `SPDConfig`, `SiteComponents`,
  `SiteMask`, `SiteLayout`, `DecomposedModel`, the aliases `Components`, `Remat`): plain
  containers whose fields are what the goldens pin, and the target's public by-kind forms,
  which the per-site masked forward feeds per-site data regrouped per kind (an exact
  copy);
- the per-site formulas the refactors did not change, pinned bitwise by the train and
  eval goldens: `weight_delta`, `mask_from_draw`, `uniform_k_routing`, `source_masks`,
  `constant_masks`, `recon_chunks`, and the CI function's chunk transformer
  (`ci_pre_activations_by_position`, `ci_lower`, `ci_upper`), which the stacked form only
  feeds with taps regrouped by kind;
- the placement of a step, not its numbers: the mesh helpers of `decomp.mesh` and
  `decomp.jitted.jit_step` (the jit with its shardings and donation, the batch check);
- `jax.random`: the draws themselves (the sources and CI init are pinned bitwise in the
  `sources` and train groups).
"""

from decomp.legacy.ci_init import init_ci_function
from decomp.legacy.components import init_components
from decomp.legacy.forward import clean_output, clean_output_and_activations, read_activations
from decomp.legacy.importances import causal_importances, ci_pre_activations
from decomp.legacy.masks import route_chunk, stochastic_masks
from decomp.legacy.sources_init import init_sources
from decomp.legacy.target import masked_output, weight_deltas

__all__ = [
    "causal_importances",
    "ci_pre_activations",
    "clean_output",
    "clean_output_and_activations",
    "init_ci_function",
    "init_components",
    "init_sources",
    "masked_output",
    "read_activations",
    "route_chunk",
    "stochastic_masks",
    "weight_deltas",
]
