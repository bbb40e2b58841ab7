"""Tests `planner/programs/train_step.py`: it trains, it traces at full size, AdamW is right."""

import math

import jax
import jax.numpy as jnp
import pytest

from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import AdamW, TrainConfig
from planner.config import load_model
from planner.programs.params import init_params
from planner.programs.train_step import (
    abstract_train_inputs,
    adamw_update,
    init_opt_state,
    make_loss_and_grads,
    make_train_step,
)

GPT = ModelConfig(name="g", hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, vocab_size=32, norm="layernorm",
                  mlp="gelu", positions="learned", tie_embeddings=True, qkv_bias=True, out_bias=True, mlp_bias=True,
                  max_position_embeddings=16)
LLAMA = ModelConfig(name="l", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=64, vocab_size=32)
MOE = LLAMA.model_copy(update={"num_experts": 4, "experts_per_token": 2})


@pytest.mark.parametrize("cfg", [GPT, LLAMA, MOE], ids=["gpt", "llama", "moe"])
def test_loss_falls_on_a_learnable_task(cfg):
    # Next token = (token + 1) mod V: learnable from the current token alone.
    train = TrainConfig(seq_len=12, global_batch=16, optimizer=AdamW(learning_rate=3e-3, weight_decay=0.0))
    params = init_params(cfg, jax.random.key(0))
    opt_state = init_opt_state(params)
    step = jax.jit(make_train_step(cfg, train))
    key, losses = jax.random.key(1), []
    for _ in range(60):
        key, k = jax.random.split(key)
        start = jax.random.randint(k, (16, 1), 0, cfg.vocab_size)
        seq = (start + jnp.arange(13)[None]) % cfg.vocab_size
        params, opt_state, metrics = step(params, opt_state, {"tokens": seq[:, :-1], "targets": seq[:, 1:]})
        losses.append(float(metrics["loss"]))
    assert losses[0] == pytest.approx(math.log(cfg.vocab_size), rel=0.1)  # uniform at start
    assert losses[-1] < 0.25 * losses[0]


def test_full_size_step_traces_without_allocating():
    cfg, train = load_model("llama3-70b"), TrainConfig(seq_len=8192, global_batch=8)
    params, opt_state, batch = abstract_train_inputs(cfg, train, micro_batch=1)
    out = jax.eval_shape(make_train_step(cfg, train), params, opt_state, batch)
    assert out[0]["layers"]["attn"]["wq"].shape == (80, 8192, 64, 128)
    assert batch["tokens"].shape == (1, 8192)
    jaxpr = jax.make_jaxpr(make_train_step(cfg, train))(params, opt_state, batch)
    assert any(e.primitive.name == "scan" for e in jaxpr.jaxpr.eqns)


def test_adamw_first_step_moves_by_the_learning_rate_and_skips_decay_on_norms():
    params = {"w": jnp.ones((2, 2)), "scale": jnp.ones((2,)), "b_in": jnp.ones((2,))}
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
    opt = AdamW(learning_rate=0.1, weight_decay=0.5)
    new, state = adamw_update(params, grads, init_opt_state(params), opt)
    # Bias-corrected first step: m̂/√v̂ = sign(g) = 1.
    assert jnp.allclose(new["scale"], 1 - 0.1) and jnp.allclose(new["b_in"], 1 - 0.1)
    assert jnp.allclose(new["w"], 1 - 0.1 * (1 + 0.5 * 1))
    assert int(state["step"]) == 1


@pytest.mark.parametrize("cfg", [LLAMA, MOE], ids=["llama", "moe"])
def test_gradient_accumulation_matches_the_whole_batch(cfg):
    train = TrainConfig(seq_len=8, global_batch=8, compute_dtype="float32")
    params = init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (8, 8), 0, cfg.vocab_size)
    batch = {"tokens": tokens, "targets": jnp.roll(tokens, 1, axis=1)}
    whole_loss, whole = make_loss_and_grads(cfg, train)(params, batch)
    accum_loss, accum = make_loss_and_grads(cfg, train, micro_batches=4, remat="full")(params, batch)
    if cfg.is_moe:  # the balancing loss is a mean of per-micro-batch products: only the cross-entropy part agrees
        assert float(accum_loss) == pytest.approx(float(whole_loss), rel=1e-2)
        return
    assert float(accum_loss) == pytest.approx(float(whole_loss), rel=1e-5)
    for g_whole, g_accum in zip(jax.tree.leaves(whole), jax.tree.leaves(accum)):
        assert jnp.allclose(g_whole, g_accum, atol=1e-6, rtol=1e-4)


def test_the_loss_in_pieces_gives_the_same_loss_and_gradients():
    cfg = ModelConfig(name="t", hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, vocab_size=300)
    train = TrainConfig(seq_len=16, global_batch=4, compute_dtype="float32")
    params = init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (4, 16), 0, 300)
    batch = {"tokens": tokens, "targets": jnp.roll(tokens, -1, axis=1)}
    whole = make_loss_and_grads(cfg, train, micro_batches=2)(params, batch)
    pieces = make_loss_and_grads(cfg, train, micro_batches=2, loss_chunks=4)(params, batch)
    assert abs(float(whole[0]) - float(pieces[0])) < 1e-5
    for got, want in zip(jax.tree.leaves(pieces[1]), jax.tree.leaves(whole[1])):
        assert float(jnp.abs(got - want).max()) < 1e-5 * max(1.0, float(jnp.abs(want).max()))
    with pytest.raises(Exception, match="do not split into 3 loss chunks"):
        make_loss_and_grads(cfg, train, loss_chunks=3)(params, batch)
