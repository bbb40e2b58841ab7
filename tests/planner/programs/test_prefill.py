"""Tests `planner/programs/prefill.py`: the prefill step against the training forward pass and the decode step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from planner.programs import attention as kernels
from planner.programs.decode import decode_step
from planner.programs.params import init_params
from planner.programs.prefill import prefill_step
from planner.programs.transformer import forward
from tests.planner.programs.test_decode import served

LLAMA = ModelConfig(name="t", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=64, vocab_size=50)
GPT2 = ModelConfig(name="g", hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, vocab_size=50, max_position_embeddings=64,
                   positions="learned", norm="layernorm", mlp="gelu", qkv_bias=True, out_bias=True, mlp_bias=True,
                   tie_embeddings=True)
TRAIN = TrainConfig(workload="prefill", global_batch=2, seq_len=24, inference={"prompt_len": 10, "kv_block_size": 8})


@pytest.mark.parametrize("cfg", [LLAMA, GPT2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("attention", ["flash", "materialized"])
@pytest.mark.parametrize("stacked", [False, True], ids=["per-layer", "stacked"])
def test_prefill_gives_the_forward_pass_last_token_logits_and_the_cache_decoding_would_write(cfg, attention, stacked, monkeypatch):
    """fp32 throughout; the flash kernel runs in blocks of 4 rows over a 10-token prompt (padded to 12)."""
    params = init_params(cfg, jax.random.key(0))
    tokens_BxP = jax.random.randint(jax.random.key(1), (2, 10), 0, cfg.vocab_size)
    want_BxPxV, _ = forward(params, tokens_BxP, cfg, compute_dtype=jnp.float32)
    params, empty = served(params, cfg, TRAIN, stacked=stacked, fill=7.0)  # 7: slots past the prompt stay
    monkeypatch.setattr(kernels, "DEFAULT_BLOCK", 4)
    logits_BxV, cache = jax.jit(lambda p, c, b: prefill_step(p, c, b, cfg, compute_dtype=jnp.float32, attention=attention))(
        params, empty, {"tokens": tokens_BxP})
    np.testing.assert_allclose(logits_BxV, want_BxPxV[:, -1], atol=2e-4, rtol=2e-4)
    decoded = empty
    step = jax.jit(lambda p, c, b: decode_step(p, c, b, cfg, compute_dtype=jnp.float32))
    for s in range(10):
        _, decoded = step(params, decoded, {"tokens": tokens_BxP[:, s:s + 1], "position": jnp.int32(s)})
    for name in ("k", "v"):
        np.testing.assert_allclose(np.stack(cache[name]), np.stack(decoded[name]), atol=2e-5, rtol=2e-5)
        assert (np.stack(cache[name])[:, :, :, 10:] == 7.0).all()  # [layers, batch, kv_heads, tokens, head_dim]
