"""Tests `planner/programs/params.py`: shapes, counts and logical axes of the parameters."""

import math

import jax
import pytest

from costmodel.inputs.model_config import ModelConfig
from planner.config import load_model
from planner.programs.params import (
    LogicalAxis,
    abstract_params,
    flat_logical_axes,
    init_params,
    param_logical_axes,
    param_shapes,
)

TINY = {
    "gpt2-like": ModelConfig(name="g", hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, vocab_size=64,
                             norm="layernorm", mlp="gelu", positions="learned", tie_embeddings=True,
                             qkv_bias=True, out_bias=True, mlp_bias=True, max_position_embeddings=16),
    "llama-gqa": ModelConfig(name="l", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=64, vocab_size=64),
    "qwen3-head-dim": ModelConfig(name="q", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                                  ffn_size=64, vocab_size=64, tie_embeddings=True),
    "mixtral-like": ModelConfig(name="m", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=64,
                                vocab_size=64, num_experts=4, experts_per_token=2),
    "moe-shared-expert": ModelConfig(name="s", hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, vocab_size=64,
                                     num_experts=6, experts_per_token=2, moe_ffn_size=16, shared_expert_ffn_size=48, qkv_bias=True),
}


def _count(tree):
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(tree))


@pytest.mark.parametrize("name", sorted(TINY))
def test_parameter_count_equals_the_config(name):
    cfg = TINY[name]
    assert _count(abstract_params(cfg)) == cfg.total_params
    assert _count(init_params(cfg, jax.random.key(0))) == cfg.total_params


@pytest.mark.parametrize("preset", ["gpt2", "llama3-405b", "mixtral-8x7b"])
def test_full_size_abstract_params_allocate_nothing(preset):
    cfg = load_model(preset)
    params = abstract_params(cfg)
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(params))
    assert _count(params) == cfg.total_params


@pytest.mark.parametrize("name", sorted(TINY))
def test_every_dimension_has_a_logical_axis(name):
    cfg = TINY[name]
    params, axes = abstract_params(cfg), param_logical_axes(cfg)
    flat_axes = jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))
    assert jax.tree.structure(params) == jax.tree.structure(axes, is_leaf=lambda x: isinstance(x, tuple))
    for leaf, names in zip(jax.tree.leaves(params), flat_axes):
        assert len(names) == leaf.ndim and all(isinstance(n, LogicalAxis) for n in names)


@pytest.mark.parametrize("name", sorted(TINY))
def test_the_flat_axes_and_shapes_follow_abstract_params_leaf_for_leaf(name):
    cfg = TINY[name]
    flat = jax.tree_util.tree_flatten_with_path(abstract_params(cfg))[0]
    assert list(param_shapes(cfg).items()) == [("/".join(p.key for p in path), leaf.shape) for path, leaf in flat]
    assert list(flat_logical_axes(cfg).values()) == jax.tree.leaves(param_logical_axes(cfg), is_leaf=lambda x: isinstance(x, tuple))


def test_stacked_layers_and_head_layout():
    cfg = TINY["llama-gqa"]
    params = abstract_params(cfg)
    assert params["layers"]["attn"]["wq"].shape == (2, 32, 4, 8)
    assert params["layers"]["mlp"]["w_gate"].shape == (2, 32, 64)
    assert params["lm_head"]["w"].shape == (32, 128)  # the 64-token vocabulary padded to a multiple of 128
    assert "lm_head" not in abstract_params(TINY["gpt2-like"])


def test_init_scales_and_zeros():
    params = init_params(TINY["gpt2-like"], jax.random.key(0))
    assert float(params["layers"]["attn_norm"]["scale"].min()) == 1.0
    assert float(abs(params["layers"]["mlp"]["b_in"]).max()) == 0.0
    assert 0.01 < float(params["embed"]["tokens"].std()) < 0.03
