"""The jit and sharding plumbing every step shares: `jit_step` and the `JittedStep` it gives.

A step is a pure function `fn(config, model, state, inputs, key)`. `jit_step` binds the
config, replicates the model on the mesh once (it is passed to the program as an argument,
not baked into it as constants), and jits with explicit shardings: model, state and key
replicated, the batch sharded on `dp`; so the same code runs on 1 device and on many. The
train and eval steps (`decomp.train`, `decomp.eval`) and their per-site references
(`decomp.legacy.train`, `decomp.legacy.eval`) all go through it: they differ in their
numbers, not in where their arrays live.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import jax
from jax import Array
from jax.sharding import Mesh

from decomp.config import SPDConfig
from decomp.mesh import batch_sharding, check_batch, make_dp_mesh, replicate, replicated
from decomp.model import DecomposedModel

S = TypeVar("S")
Out = TypeVar("Out")


class JittedStep(Generic[S, Out]):
    """A jitted step with its model bound: `step(state, inputs, key) -> out`.

    `lower(state, inputs, key)` gives the `jax.stages.Lowered` of the same program, for
    compile statistics and benchmarks. Both check first that the batch divides over the
    mesh (`decomp.mesh.check_batch`).
    """

    def __init__(self, jitted: Any, model: DecomposedModel, mesh: Mesh) -> None:
        self._jitted, self._model, self.mesh = jitted, model, mesh

    def __call__(self, state: S, inputs: Array, key: Array) -> Out:
        check_batch(inputs.shape[0], self.mesh)
        return self._jitted(self._model, state, inputs, key)

    def lower(self, state: S, inputs: Array, key: Array) -> jax.stages.Lowered:
        check_batch(inputs.shape[0], self.mesh)
        return self._jitted.lower(self._model, state, inputs, key)


def jit_step(
    fn: Callable[[SPDConfig, DecomposedModel, S, Array, Array], Out],
    model: DecomposedModel,
    config: SPDConfig,
    *,
    mesh: Mesh | None,
    returns_state: bool,
    donate: bool = False,
) -> JittedStep[S, Out]:
    """Jit `fn` with `config` bound and `model` replicated on `mesh`.

    **Arguments:**

    - `fn`: the step, `fn(config, model, state, inputs, key)`.
    - `model`: the target (its sites are checked against `config`'s chunk sizes).
    - `config`: the SPD configuration, bound as a static argument.
    - `mesh`: the data-parallel mesh (`None`: every visible device).
    - `returns_state`: whether `fn` returns `(new state, metrics)` (a train step) rather
      than metrics alone (an eval step); either way every output is replicated.
    - `donate`: donate the incoming state's buffers (only with `returns_state`).

    **Returns:** the step, a `JittedStep`.
    """
    config.check_sites(model.site_names)
    mesh = make_dp_mesh() if mesh is None else mesh
    rep = replicated(mesh)
    kw: dict[str, Any] = {"out_shardings": (rep, rep) if returns_state else rep}
    if returns_state:
        kw["donate_argnums"] = (1,) if donate else ()
    elif donate:
        raise ValueError("donate needs a step that returns its state")
    jitted = jax.jit(
        functools.partial(fn, config), in_shardings=(rep, rep, batch_sharding(mesh), rep), **kw
    )
    return JittedStep(jitted, replicate(model, mesh), mesh)
