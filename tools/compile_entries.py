"""The jitted entry points of the subject, built at a chosen structure, for compile reports.

Each entry is `name -> build(structure) -> (jitted function, args)`, written against the
public API of `decomp` only, so that `tools/compile_report.py --base SHA` can build the same
entries against a base commit's code (an entry whose symbols the base lacks is reported as
such). The equivalence suite loads this file to pin compile budgets.

Sources and CI-function inits are measured as one outer `jax.jit` of the whole init: the
legacy form traces one draw (or one chunk init) per site (chunk), the new form one vmapped
draw per group; the outer jit keeps that difference and gives one program to measure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Structure:
    """What to build: a GLU transformer at toy width with `n_layer` layers."""

    n_layer: int = 32
    family: str = "llama"
    d_model: int = 32
    n_head: int = 2
    n_kv_head: int = 1
    head_dim: int = 16
    d_mlp: int = 64
    vocab_size: int = 64
    batch: int = 4
    seq: int = 16
    n_components: int = 8
    sites_per_chunk: int = 7
    #: Devices of the `dp` mesh the train and eval steps are built on. 1 by default, so the
    #: program (and its compile budget) is the same whatever the process's device count.
    devices: int = 1


Entry = Callable[[Structure], tuple[Callable[..., Any], tuple[Any, ...]]]
ENTRIES: dict[str, Entry] = {}


def entry(name: str) -> Callable[[Entry], Entry]:
    def register(fn: Entry) -> Entry:
        ENTRIES[name] = fn
        return fn

    return register


def _model(s: Structure) -> Any:
    import jax

    from decomp.targets.glu_transformer import GLUConfig, GLUTransformer

    cfg = GLUConfig(
        family=s.family,  # type: ignore[arg-type]
        n_layer=s.n_layer,
        d_model=s.d_model,
        n_head=s.n_head,
        n_kv_head=s.n_kv_head,
        head_dim=s.head_dim,
        d_mlp=s.d_mlp,
        vocab_size=s.vocab_size,
    )
    return GLUTransformer.init(cfg, key=jax.random.key(0))


def _tokens(s: Structure) -> Any:
    import jax
    import jax.numpy as jnp

    return jax.random.randint(jax.random.key(1), (s.batch, s.seq), 0, s.vocab_size, jnp.int32)


def _full_wanted(model: Any) -> tuple[str, ...]:
    n = model.config.n_layer
    return tuple(f"resid.{i}" for i in range(n)) + tuple(model.site_names)


@entry("forward_scan")
def _forward_scan(s: Structure):
    import jax

    return jax.jit(lambda m, x: m.clean_output(x)), (_model(s), _tokens(s))


@entry("forward_legacy")
def _forward_legacy(s: Structure):
    import jax

    from decomp import legacy

    return jax.jit(legacy.clean_output), (_model(s), _tokens(s))


@entry("taps_scan")
def _taps_scan(s: Structure):
    import jax

    model = _model(s)
    wanted = _full_wanted(model)
    return jax.jit(lambda m, x: m.clean_output_and_activations(x, wanted)), (model, _tokens(s))


@entry("taps_legacy")
def _taps_legacy(s: Structure):
    import jax

    from decomp import legacy

    model = _model(s)
    wanted = _full_wanted(model)
    fn = jax.jit(lambda m, x: legacy.clean_output_and_activations(m, x, wanted))
    return fn, (model, _tokens(s))


def _ci_args(s: Structure) -> tuple[Any, tuple[str, ...], dict[str, tuple[int, int]]]:
    from decomp.config import CIConfig

    model = _model(s)
    shapes = model.site_shapes()
    names = tuple(model.site_names)
    dims = {n: (shapes[n][0], s.n_components) for n in names}
    cfg = CIConfig(d_hidden=32, n_blocks=2, n_head=2, d_mlp=64, sites_per_chunk=s.sites_per_chunk)
    return cfg, names, dims


@entry("ci_init_new")
def _ci_init_new(s: Structure):
    import jax

    from decomp.ci_function import init_ci_function

    cfg, names, dims = _ci_args(s)
    return jax.jit(lambda k: init_ci_function(cfg, names, dims, key=k)), (jax.random.key(2),)


@entry("ci_init_legacy")
def _ci_init_legacy(s: Structure):
    import jax

    from decomp import legacy

    cfg, names, dims = _ci_args(s)
    return jax.jit(lambda k: legacy.init_ci_function(cfg, names, dims, key=k)), (jax.random.key(2),)


def _site_cs(s: Structure) -> dict[str, int]:
    from decomp.taps import site_names

    return {n: s.n_components for n in site_names(s.n_layer)}


@entry("sources_init_new")
def _sources_new(s: Structure):
    import jax

    from decomp.sources import init_sources

    cs = _site_cs(s)
    return jax.jit(lambda k: init_sources(cs, s.seq, key=k)), (jax.random.key(3),)


@entry("sources_init_legacy")
def _sources_legacy(s: Structure):
    import jax

    from decomp import legacy

    cs = _site_cs(s)
    return jax.jit(lambda k: legacy.init_sources(cs, s.seq, key=k)), (jax.random.key(3),)


def _spd(s: Structure, remat: str | None) -> tuple[Any, Any, Any, Any, Any]:
    import jax

    from decomp.config import CIConfig, SPDConfig
    from decomp.train import init_train_state

    model = _model(s)
    spd = SPDConfig(
        n_components=s.n_components,
        ci=CIConfig(d_hidden=32, n_blocks=2, n_head=2, d_mlp=64, sites_per_chunk=s.sites_per_chunk),
        n_mask_samples=1,
        recon_sites_per_chunk=s.sites_per_chunk,
        pgd_warmup_steps=2,
        remat=remat,  # type: ignore[arg-type]
    )
    from decomp.mesh import make_dp_mesh

    # This process's own devices: over several processes each compiles (and measures) the
    # same one-process program on a device it can address; on one process, the same list.
    mesh = make_dp_mesh(jax.local_devices()[: s.devices])
    state = init_train_state(model, spd, key=jax.random.key(4), seq_len=s.seq, mesh=mesh)
    return model, spd, state, _tokens(s), mesh


def _train_entry(remat: str | None) -> Entry:
    def build(s: Structure):
        import jax

        from decomp.train import make_train_step

        model, spd, state, x, mesh = _spd(s, remat)
        step = make_train_step(model, spd, mesh=mesh, donate=False)
        return step, (state, x, jax.random.key(5))

    return build


entry("train_step_remat_nothing")(_train_entry("nothing"))
entry("train_step_remat_dots")(_train_entry("dots"))


@entry("eval_step")
def _eval_step(s: Structure):
    import jax

    from decomp.eval import make_eval_step

    model, spd, state, x, mesh = _spd(s, "nothing")
    return make_eval_step(model, spd, mesh=mesh), (state, x, jax.random.key(6))
