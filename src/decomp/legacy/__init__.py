"""Pre-refactor implementations, kept beside the new ones as live references.

Each module is a self-contained copy of the code as it was before its refactor: it imports no
private (`_`-prefixed) name of the refactored modules and reaches no private attribute of
their objects, so an edit inside the refactored code cannot silently change its reference
(`tests/decomp/test_legacy_independence.py` enforces this).

What the references still share with the refactored code, and why that is safe:

- the layer primitives of `decomp.nn` (`rms_norm`, `rope_inv_freq`, `rope_cos_sin`,
  `apply_rope`, `attention`): the refactors did not touch them, and a change to them moves
  the forward goldens (`forward_llama`, `forward_qwen3`: logits bitwise, taps per class),
  which the live differentials cannot see;
- `decomp.taps.parse_wanted`: the tap-key grammar, pinned by the golden key names and by
  its own unit tests;
- the data types the references build or read (`GLUConfig`, `GLUTransformer`, `CIConfig`,
  `CIFunction`, `CIBlocks`): plain containers whose fields are what the goldens pin;
- the per-site public functions the per-site train and eval steps (`decomp.legacy.train`,
  `decomp.legacy.eval`, with their own copy of the losses in `decomp.legacy.losses`) call:
  `init_components`, `init_sources`, `init_ci_function`, `causal_importances`, the
  per-site masks (`stochastic_masks`, `route_chunk`, `source_masks`, `constant_masks`) and
  the model's `masked_output`, `weight_deltas` and `clean_output_and_activations`. The
  stacked steps call their `_by_kind` forms instead, and the inits' bitwise differentials
  (`tests/equivalence/test_live.py`) tie each stacked form to its per-site one;
- `jax.random`: the draws themselves (the sources and CI init are pinned bitwise in the
  `sources` and train groups).
"""

from decomp.legacy.ci_init import init_ci_function
from decomp.legacy.forward import clean_output, clean_output_and_activations, read_activations
from decomp.legacy.sources_init import init_sources

__all__ = [
    "clean_output",
    "clean_output_and_activations",
    "init_ci_function",
    "init_sources",
    "read_activations",
]
