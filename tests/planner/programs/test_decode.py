"""Tests `planner/programs/decode.py`: the decode step against the training forward pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from planner.programs.decode import abstract_decode_inputs, decode_step, per_layer, served_dtype_of
from planner.programs.params import init_params
from planner.programs.transformer import forward

CFG = ModelConfig(name="t", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=64, vocab_size=50)


def served(params, cfg, train, *, stacked, fill=0.0):
    """``(params, cache)`` as a served step takes them: per layer, or ``stacked``; the cache filled with ``fill``."""
    _, cache, _ = abstract_decode_inputs(cfg, train, stacked=stacked)
    cache = jax.tree.map(lambda c: jnp.full(c.shape, fill, jnp.float32), cache)
    return (params if stacked else per_layer(params)), cache


@pytest.mark.parametrize("stacked", [False, True], ids=["per-layer", "stacked"])
def test_decoding_token_by_token_gives_the_forward_pass_logits(stacked):
    """Filling the cache one token at a time reproduces the causal forward pass (fp32 throughout),
    the layers served one array a layer or stacked."""
    train = TrainConfig(workload="decode", global_batch=2, seq_len=6)
    params = init_params(CFG, jax.random.key(0))
    tokens_BxS = jax.random.randint(jax.random.key(1), (2, 6), 0, CFG.vocab_size)
    want_BxSxV, _ = forward(params, tokens_BxS, CFG, compute_dtype=jnp.float32)
    params, cache = served(params, CFG, train, stacked=stacked)
    step = jax.jit(lambda p, c, b: decode_step(p, c, b, CFG, compute_dtype=jnp.float32))
    for s in range(6):
        logits_BxV, cache = step(params, cache, {"tokens": tokens_BxS[:, s:s + 1], "position": jnp.int32(s)})
        np.testing.assert_allclose(logits_BxV, want_BxSxV[:, s], atol=2e-4, rtol=2e-4)


def test_layer_matrices_are_served_in_the_weight_dtype_and_the_rest_in_the_compute_dtype():
    train = TrainConfig(workload="decode", inference={"weight_dtype": "int4"})
    assert served_dtype_of("layers/mlp/w_in", train) == jnp.int4
    assert served_dtype_of("layers/attn_norm/scale", train) == jnp.bfloat16
    assert served_dtype_of("embed/tokens", train) == jnp.bfloat16


def test_served_layers_hold_the_stacked_weights_and_the_cache_is_batch_heads_tokens():
    train = TrainConfig(workload="decode", global_batch=3, seq_len=20)
    params = init_params(CFG, jax.random.key(0))
    layers = per_layer(params)["layers"]
    np.testing.assert_array_equal(layers[1]["mlp"]["w_in"], params["layers"]["mlp"]["w_in"][1])
    _, cache, _ = abstract_decode_inputs(CFG, train)
    _, stacked, _ = abstract_decode_inputs(CFG, train, stacked=True)
    assert [c.shape for c in cache["k"]] == [(3, 2, 32, 8)] * 2 and stacked["k"].shape == (2, 3, 2, 32, 8)
