"""The Hugging Face state-dict loader: exact round trips, tied heads, and errors that name
every offending key."""

from __future__ import annotations

import dataclasses

import jax
import ml_dtypes
import numpy as np
import pytest
from _jitted import clean

from decomp.targets import GLUConfig, GLUTransformer

N_LAYER = 2
LLAMA = GLUConfig(
    family="llama", n_layer=N_LAYER, d_model=16, n_head=2, n_kv_head=1, head_dim=8, d_mlp=24,
    vocab_size=32,
)  # fmt: skip
QWEN3 = dataclasses.replace(LLAMA, family="qwen3")
TIED = dataclasses.replace(LLAMA, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(1).integers(0, LLAMA.vocab_size, (2, 5), dtype=np.int32)


@pytest.fixture(scope="module", params=["llama", "qwen3", "tied"])
def config(request):
    return {"llama": LLAMA, "qwen3": QWEN3, "tied": TIED}[request.param]


@pytest.fixture(scope="module")
def state(config, random_glu):
    """A state dict exported from a random model (read-only; tests copy before editing)."""
    return jax.device_put(random_glu(config, 0)).to_hf_state_dict()


def _bits(a) -> np.ndarray:
    return np.asarray(a).view(np.uint32)


def test_round_trip_gives_identical_weights_and_logits(config, tokens, random_glu):
    model = jax.device_put(random_glu(config, 0))
    state = model.to_hf_state_dict()
    loaded = GLUTransformer.from_hf_state_dict(config, state)
    same_leaves = jax.tree.map(lambda a, b: np.array_equal(_bits(a), _bits(b)), loaded, model)
    assert all(jax.tree.leaves(same_leaves)), same_leaves
    assert (loaded.lm_head is None) == config.tie_word_embeddings
    np.testing.assert_array_equal(
        _bits(clean(loaded, tokens)), _bits(clean(model, tokens)), err_msg="round-trip logits"
    )
    exported_again = loaded.to_hf_state_dict()
    assert sorted(exported_again) == sorted(state)
    for key, value in state.items():
        np.testing.assert_array_equal(exported_again[key], value, err_msg=key)


def test_export_uses_hf_names_and_shapes(config, state):
    """Key set and shapes written from the HF module layout, independently of the loader."""
    c = config
    hq, hkv = c.n_head * c.head_dim, c.n_kv_head * c.head_dim
    per_layer = {
        "self_attn.q_proj.weight": (hq, c.d_model),
        "self_attn.k_proj.weight": (hkv, c.d_model),
        "self_attn.v_proj.weight": (hkv, c.d_model),
        "self_attn.o_proj.weight": (c.d_model, hq),
        "mlp.gate_proj.weight": (c.d_mlp, c.d_model),
        "mlp.up_proj.weight": (c.d_mlp, c.d_model),
        "mlp.down_proj.weight": (c.d_model, c.d_mlp),
        "input_layernorm.weight": (c.d_model,),
        "post_attention_layernorm.weight": (c.d_model,),
    }
    if c.family == "qwen3":
        per_layer["self_attn.q_norm.weight"] = per_layer["self_attn.k_norm.weight"] = (c.head_dim,)
    want = {
        "model.embed_tokens.weight": (c.vocab_size, c.d_model),
        "model.norm.weight": (c.d_model,),
    }
    if not c.tie_word_embeddings:
        want["lm_head.weight"] = (c.vocab_size, c.d_model)
    for i in range(c.n_layer):
        want.update({f"model.layers.{i}.{path}": shape for path, shape in per_layer.items()})
    assert {k: v.shape for k, v in state.items()} == want


def test_tied_head_loads_when_absent_or_equal(tokens, random_glu):
    model = jax.device_put(random_glu(TIED, 0))
    state = model.to_hf_state_dict()
    assert "lm_head.weight" not in state
    with_head = {**state, "lm_head.weight": np.array(state["model.embed_tokens.weight"])}
    want = _bits(clean(model, tokens))
    for name, sd in (("absent", state), ("present and equal", with_head)):
        loaded = GLUTransformer.from_hf_state_dict(TIED, sd)
        assert loaded.lm_head is None, name
        np.testing.assert_array_equal(_bits(clean(loaded, tokens)), want, err_msg=name)


def test_bfloat16_tensors_load_as_their_exact_float32_values(random_glu):
    state = jax.device_put(random_glu(LLAMA, 0)).to_hf_state_dict()
    bf16 = {k: v.astype(ml_dtypes.bfloat16) for k, v in state.items()}
    loaded = GLUTransformer.from_hf_state_dict(LLAMA, bf16).to_hf_state_dict()
    for key, value in bf16.items():
        assert loaded[key].dtype == np.float32, key
        np.testing.assert_array_equal(loaded[key], value.astype(np.float32), err_msg=key)


def _reject(config: GLUConfig, state: dict, *offending: str) -> str:
    with pytest.raises(ValueError) as info:
        GLUTransformer.from_hf_state_dict(config, state)
    message = str(info.value)
    unnamed = [k for k in offending if k not in message]
    assert not unnamed, f"error does not name {unnamed}: {message}"
    return message


def test_missing_tensors_are_all_named(config, state):
    gone = ("model.layers.1.mlp.up_proj.weight", "model.norm.weight")
    message = _reject(config, {k: v for k, v in state.items() if k not in gone}, *gone)
    assert "missing" in message


def test_extra_tensor_is_named(config, state):
    extra = "model.layers.0.self_attn.rotary_emb.inv_freq"
    message = _reject(config, {**state, extra: np.ones(4, np.float32)}, extra)
    assert "unexpected" in message


def test_mis_shaped_tensor_is_named_with_both_shapes(config, state):
    key = "model.layers.1.self_attn.k_proj.weight"
    bad = np.ascontiguousarray(state[key].T)  # [d_model, n_kv_head * head_dim]: swapped
    assert bad.shape != state[key].shape
    message = _reject(config, {**state, key: bad}, key)
    assert str(bad.shape) in message and str(state[key].shape) in message, message


def test_integer_tensor_is_rejected_by_name(config, state):
    key = "model.layers.0.post_attention_layernorm.weight"
    message = _reject(config, {**state, key: state[key].astype(np.int32)}, key)
    assert "int32" in message


def test_tied_head_that_differs_from_embeddings_is_rejected(random_glu):
    state = jax.device_put(random_glu(TIED, 0)).to_hf_state_dict()
    head = np.array(state["model.embed_tokens.weight"])
    head[3, 5] += 1.0
    message = _reject(TIED, {**state, "lm_head.weight": head}, "lm_head.weight")
    assert "tie_word_embeddings" in message


def test_qwen3_weights_under_a_llama_config_are_rejected_naming_the_qk_norms(random_glu):
    state = jax.device_put(random_glu(QWEN3, 0)).to_hf_state_dict()
    qk_norms = [k for k in state if k.endswith(("q_norm.weight", "k_norm.weight"))]
    assert len(qk_norms) == 2 * N_LAYER
    _reject(LLAMA, state, *qk_norms)


def test_llama_weights_under_a_qwen3_config_are_rejected_naming_the_missing_qk_norms(random_glu):
    state = jax.device_put(random_glu(LLAMA, 0)).to_hf_state_dict()
    qk_norms = [f"model.layers.{i}.self_attn.{n}_norm.weight" for i in range(N_LAYER) for n in "qk"]
    _reject(QWEN3, state, *qk_norms)
