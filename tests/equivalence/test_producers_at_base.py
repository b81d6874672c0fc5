"""Today's producers re-produce the goldens at the base commit each one records (issue 28).

`python tools/repin_goldens.py --base <the golden's base_sha>` runs the current
tests/equivalence/producers.py against that commit's code, so the producers adapt to what
the base offers: the train state's per-site views (`site_components()`, `site_sources()`)
came with the stacked train step, after `60638e8`, the base of the train goldens, whose
state holds `{site: ...}` fields instead (`producers.per_site` takes either). Every group
re-produced at its base was measured bit for bit equal to its golden on the pin's processor
(goldens/README.md, "Re-producing a group at its base"); this test holds part of it at a
cost the suite can carry, in one producer process at the train goldens' base:

- the `sources` group in full, through today's producers as they are (the cheapest group
  there);
- the adapter's fallback, where it runs at the base: the persistent sources of
  `init_train_state(key=key(1))` taken through `per_site`, against the golden keys they
  must equal (`sources.float32.uniform_c.*`, the same draw at the same key), without the
  train-step compile that the trajectories, the groups that read it, cost there (two
  minutes and more on 2 cores).

Each is judged by `check_group` with the producer process's provenance: bitwise on the
pin's processor, within the calibrated bounds elsewhere.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
from producers import per_site

from parity.check import check_group
from parity.machinery._config import load_config
from parity.machinery._launcher import ProducerRunError
from parity.machinery._worktree import GitError, resolve_sha, temporary_worktree
from parity.run._goldens import golden_provenance
from parity.run._produced import Checkout, produce
from parity.store import open_goldens

ROOT = Path(__file__).resolve().parents[2]
GOLDENS = ROOT / "goldens"
PRODUCERS = Path(__file__).with_name("producers.py")

#: A producers file for the run at the base: today's producers, loaded by path from the
#: current tree (their `decomp` imports resolve to the base's code), with the real `sources`
#: group and the adapter's group beside it.
AT_BASE = """
import importlib.util
import sys

_spec = importlib.util.spec_from_file_location("producers_under_test", {producers!r})
P = importlib.util.module_from_spec(_spec)
sys.modules["producers_under_test"] = P
_spec.loader.exec_module(P)

CLASS_MAP = P.CLASS_MAP


def sources_of_the_train_state():
    import jax
    from decomp.targets.glu_transformer import GLUTransformer
    from decomp.train import init_train_state

    # The trajectories' model and config. Only the sites' shapes enter the state's init, so
    # the weights are left abstract: their init would compile for seconds and change nothing.
    cfg, spd = P.spd_configs(None)
    model = jax.eval_shape(lambda k: GLUTransformer.init(cfg, key=k), jax.random.key(0))
    state = init_train_state(model, spd, key=jax.random.key(1), seq_len=P.SEQ)
    sources = P.per_site(state, "sources")
    return {{f"sources.float32.uniform_c.{{s}}": sources[s] for s in model.site_names}}


GROUPS = {{
    "sources": P.GROUPS["sources"],
    "sources_of_the_train_state": sources_of_the_train_state,
}}
"""


def _base_of(group: str) -> str:
    return str(golden_provenance(GOLDENS / f"{group}.h5").base_sha)


def test_per_site_takes_the_views_or_the_per_site_fields():
    """Where the state has the views (the stacked step), `per_site` is the view; where it
    has none (the bases before it), the field itself."""
    stacked = SimpleNamespace(
        sources="stacked", site_sources=lambda: {"a": 1}, site_components=lambda: {"a": 2}
    )
    assert per_site(stacked, "sources") == {"a": 1}
    assert per_site(stacked, "components") == {"a": 2}
    old = SimpleNamespace(sources={"a": 3, "b": 4}, components={"a": 5})
    assert per_site(old, "sources") == {"a": 3, "b": 4}
    assert list(per_site(old, "sources")) == ["a", "b"]
    assert per_site(old, "components") == {"a": 5}


@pytest.mark.slow
def test_todays_producers_reproduce_the_goldens_at_their_base(tmp_path):
    base = _base_of("sources")
    # The trajectories read `per_site` at this base: the adapter's fallback runs where they do.
    assert {_base_of(g) for g in ("train_branches", "train_remat_nothing")} == {base}
    try:
        sha = resolve_sha(ROOT, base)
    except GitError as e:
        pytest.fail(
            f"the goldens' base commit {base} is not in this clone ({e}); the test re-produces "
            "groups there and needs the full history (`git fetch --unshallow`)"
        )
    producers = tmp_path / "producers_at_base.py"
    producers.write_text(AT_BASE.format(producers=str(PRODUCERS)))
    config = dataclasses.replace(load_config(ROOT), producers=producers)
    with temporary_worktree(ROOT, sha) as worktree:
        try:
            at = Checkout(
                root=worktree, drop_paths=list(config.src), name=f"the base commit {sha[:12]}"
            )
            produced = produce(config, at=at)
        except ProducerRunError as e:
            pytest.fail(
                f"today's producers cannot run at {sha[:12]}: {e.reason}\n{e.output[-3000:]}"
            )

    sources = produced.groups["sources"]
    with open_goldens(GOLDENS / "sources.h5") as golden:
        assert list(sources) == golden.ordered_keys(), "keys or their order moved"
    result = check_group(
        sources, "sources", goldens=GOLDENS, current_provenance=produced.provenance["sources"]
    )
    assert result.passed, [f.reason for f in result.comparison.failures][:5]

    via_state = produced.groups["sources_of_the_train_state"]
    result = check_group(
        via_state,
        "sources",
        goldens=GOLDENS,
        name="sources.of_the_train_state",
        current_provenance=produced.provenance["sources_of_the_train_state"],
        keys=list(via_state),
    )
    assert len(result.checked_keys) == 14, result.checked_keys
    assert result.passed, [f.reason for f in result.comparison.failures][:5]
