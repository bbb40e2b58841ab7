"""Tests `planner/programs/decode.py`: the decode step against the training forward pass."""

import jax
import jax.numpy as jnp
import numpy as np

from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from planner.programs.decode import decode_step, kv_cache_shape, served_dtype_of
from planner.programs.params import init_params
from planner.programs.transformer import forward

CFG = ModelConfig(name="t", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=64, vocab_size=50)


def test_decoding_token_by_token_gives_the_forward_pass_logits():
    """Filling the cache one token at a time reproduces the causal forward pass (fp32 throughout)."""
    train = TrainConfig(workload="decode", global_batch=2, seq_len=6)
    params = init_params(CFG, jax.random.key(0))
    tokens_BxS = jax.random.randint(jax.random.key(1), (2, 6), 0, CFG.vocab_size)
    want_BxSxV, _ = forward(params, tokens_BxS, CFG, compute_dtype=jnp.float32)
    cache = {name: jnp.zeros(kv_cache_shape(CFG, train), jnp.float32) for name in ("k", "v")}
    step = jax.jit(lambda p, c, b: decode_step(p, c, b, CFG, compute_dtype=jnp.float32))
    for s in range(6):
        logits_BxV, cache = step(params, cache, {"tokens": tokens_BxS[:, s:s + 1], "position": jnp.int32(s)})
        np.testing.assert_allclose(logits_BxV, want_BxSxV[:, s], atol=2e-4, rtol=2e-4)


def test_layer_matrices_are_served_in_the_weight_dtype_and_the_rest_in_the_compute_dtype():
    train = TrainConfig(workload="decode", inference={"weight_dtype": "int4"})
    assert served_dtype_of("layers/mlp/w_in", train) == jnp.int4
    assert served_dtype_of("layers/attn_norm/scale", train) == jnp.bfloat16
    assert served_dtype_of("embed/tokens", train) == jnp.bfloat16
