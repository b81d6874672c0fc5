"""`parity.localise` proves the stacked eval step against the per-site one at every value
that reaches an output: run op by op on the pinned eval group's first batch, every metric
holds `eval_metric`, and no metric is reached from a value the per-site step never computed.
The stacked step does compute values the per-site step does not (the mask draws of all
sites of one shape in one stacked array, whose rows come in another order than the sites');
they are dead ends: the per-kind slices taken from them match the per-site draws again."""

from __future__ import annotations

import jax
import pytest
from producers import SEQ, _spd_setup, tokens

from decomp.eval import make_eval_step
from decomp.legacy.eval import make_eval_step as legacy_eval_step
from decomp.legacy.train import init_train_state as legacy_init
from decomp.train import init_train_state
from parity.judge._classes import REGISTRY
from parity.origin import align, locate, matching_tolerance, record


@pytest.mark.slow
@pytest.mark.one_layout
def test_the_stacked_eval_step_has_no_origin_against_the_per_site_step():
    model, spd = _spd_setup("nothing")
    new_state = init_train_state(model, spd, key=jax.random.key(1), seq_len=SEQ)
    old_state = legacy_init(model, spd, key=jax.random.key(1), seq_len=SEQ)
    x, key = tokens(model.config.vocab_size, seed=7), jax.random.key(200)
    new_step, old_step = make_eval_step(model, spd), legacy_eval_step(model, spd)
    # The two steps take their own TrainState classes: each is recorded on its own state,
    # whose arrays are equal (bit-identical inits, tests/equivalence/test_live.py).
    new = record(lambda s, x, k: new_step(s, x, k), new_state, x, key)
    old = record(lambda s, x, k: old_step(s, x, k), old_state, x, key)
    assert set(new.outputs) == set(old.outputs)
    assert locate(new, old, class_map="eval_metric").origin is None
    # Matching is monotone in the tolerance, so under the strictest tolerance any metric's
    # class implies, every metric's value matched: none is reached from an unmatched value.
    rho = min(
        matching_tolerance(REGISTRY["eval_metric"], old.output_arrays[metric])
        for metric in new.outputs
    )
    alignment = align(new, old, rho)
    assert all(alignment.origin(metric) is None for metric in new.outputs)
    assert alignment.matched_fraction > 0.95
