"""Tests `planner/programs/fused_step.py`: the step in backward is the plain step, one layer at a time."""

import jax
import jax.numpy as jnp
import pytest

from costmodel.errors import UnsupportedError
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import OptimizerState, TrainConfig
from planner.programs.fused_step import make_fused_train_step
from planner.programs.params import init_params
from planner.programs.residuals import to_bits
from planner.programs.train_step import init_opt_state, make_train_step

LLAMA = ModelConfig(name="tiny-llama", hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2, ffn_size=64, vocab_size=100)
GPT = ModelConfig(name="tiny-gpt", hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, vocab_size=100, norm="layernorm",
                  mlp="gelu", positions="learned", tie_embeddings=True, max_position_embeddings=16)
MOE = ModelConfig(**{**LLAMA.model_dump(), "name": "tiny-moe", "num_experts": 4, "experts_per_token": 2, "moe_ffn_size": 32})


def _batch(cfg: ModelConfig) -> dict[str, jax.Array]:
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab_size)
    return {"tokens": tokens, "targets": jnp.roll(tokens, -1, axis=1)}


@pytest.mark.parametrize("cfg", [LLAMA, GPT, MOE], ids=["llama", "gpt2-tied", "moe"])
def test_two_fused_steps_match_two_plain_steps(cfg):
    train = TrainConfig(seq_len=16, global_batch=2, workload="finetune-full", optimizer_in_backward=True)
    params = init_params(cfg, jax.random.key(0))
    fused, plain = (params, init_opt_state(params)), (params, init_opt_state(params))
    for _ in range(2):  # the second step checks the bias correction's count and the moments carried over
        *fused, fused_metrics = jax.jit(make_fused_train_step(cfg, train))(*fused, _batch(cfg))
        *plain, plain_metrics = jax.jit(make_train_step(cfg, train, remat="full"))(*plain, _batch(cfg))
    assert float(fused_metrics["loss"]) == pytest.approx(float(plain_metrics["loss"]), rel=1e-6)
    for got, want in zip(jax.tree.leaves(fused), jax.tree.leaves(plain)):
        assert jnp.allclose(got, want, atol=1e-6, rtol=1e-5)


def test_sixteen_bit_state_given_as_integers_comes_back_as_integers_with_the_same_values():
    train = TrainConfig(seq_len=16, global_batch=2, workload="finetune-full").with_optimizer_state(OptimizerState.BF16, in_backward=True)
    params = init_params(LLAMA, jax.random.key(0), dtype=jnp.bfloat16)
    state = (params, init_opt_state(params, jnp.bfloat16))
    as_floats = make_fused_train_step(LLAMA, train)(*state, _batch(LLAMA))
    as_bits = make_fused_train_step(LLAMA, train, as_bits=True)(*jax.tree.map(to_bits, state), _batch(LLAMA))
    assert {x.dtype.name for x in jax.tree.leaves(as_bits[0])} == {"uint16"}
    assert all(bool((a == b).all()) for a, b in zip(jax.tree.leaves(jax.tree.map(to_bits, as_floats[:2])), jax.tree.leaves(as_bits[:2])))


def test_adapters_are_refused_in_one_line():
    with pytest.raises(UnsupportedError, match="full training only"):
        make_fused_train_step(LLAMA, TrainConfig(seq_len=16, global_batch=2, workload="finetune-lora"))
