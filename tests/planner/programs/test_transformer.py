"""Tests `planner/programs/transformer.py`: causality, GQA, MoE, remat, the padded vocabulary."""

from functools import partial

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

from costmodel.errors import UnsupportedError
from costmodel.inputs.model_config import ModelConfig
from planner.programs.params import init_params
from planner.programs.train_step import loss_fn
from planner.programs.transformer import PADDED_LOGIT, forward

LLAMA = ModelConfig(name="l", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=64, vocab_size=64)
GPT = ModelConfig(name="g", hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, vocab_size=64, norm="layernorm",
                  mlp="gelu", positions="learned", tie_embeddings=True, qkv_bias=True, out_bias=True, mlp_bias=True,
                  max_position_embeddings=16)
MOE = LLAMA.model_copy(update={"num_experts": 4, "experts_per_token": 2, "shared_expert_ffn_size": 16})


def _tokens(b=2, s=12, seed=0, vocab=64):
    return jax.random.randint(jax.random.key(seed), (b, s), 0, vocab)


@pytest.mark.parametrize("cfg", [LLAMA, GPT, MOE], ids=["llama", "gpt", "moe"])
def test_later_tokens_do_not_change_earlier_logits(cfg):
    params = init_params(cfg, jax.random.key(0))
    tokens = _tokens()
    changed = tokens.at[:, 8:].set((tokens[:, 8:] + 1) % 64)
    # MoE capacity is shared within a sequence, so compare dense models exactly, MoE on its attention path.
    a, _ = forward(params, tokens, cfg, compute_dtype=jnp.float32)
    b, _ = forward(params, changed, cfg, compute_dtype=jnp.float32)
    assert jnp.allclose(a[:, :8], b[:, :8], atol=1e-5)
    assert not jnp.allclose(a[:, 8:], b[:, 8:], atol=1e-5)


def test_gqa_shares_kv_heads_and_equals_mha_when_kv_heads_are_repeated():
    mha_cfg = LLAMA.model_copy(update={"num_kv_heads": 4})
    gqa_params = init_params(LLAMA, jax.random.key(0))
    mha_params = jax.tree.map(lambda x: x, gqa_params)
    attn = dict(gqa_params["layers"]["attn"])
    # Repeat each kv head for the query heads of its group: MHA with tied k/v heads.
    attn["wk"] = jnp.repeat(attn["wk"], 2, axis=2)
    attn["wv"] = jnp.repeat(attn["wv"], 2, axis=2)
    mha_params["layers"] = {**gqa_params["layers"], "attn": attn}
    tokens = _tokens()
    gqa, _ = forward(gqa_params, tokens, LLAMA, compute_dtype=jnp.float32)
    mha, _ = forward(mha_params, tokens, mha_cfg, compute_dtype=jnp.float32)
    assert jnp.allclose(gqa, mha, atol=1e-5)


def test_moe_reports_a_balancing_loss_and_dense_does_not():
    _, aux = forward(init_params(MOE, jax.random.key(0)), _tokens(), MOE)
    _, dense_aux = forward(init_params(LLAMA, jax.random.key(0)), _tokens(), LLAMA)
    assert float(aux) >= 1.0 - 1e-3 and float(dense_aux) == 0.0  # E·Σ f·P is at least 1


@pytest.mark.parametrize("remat", ["full", "selective"])
def test_recompute_policies_give_the_same_gradients(remat):
    params = init_params(GPT, jax.random.key(0))
    tokens = _tokens()

    def loss(p, remat):
        logits, _ = forward(p, tokens, GPT, compute_dtype=jnp.float32, remat=remat)
        return logits.mean()

    base = jax.grad(loss)(params, "none")
    again = jax.grad(loss)(params, remat)
    assert all(jnp.allclose(a, b, atol=1e-6) for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(again)))


def test_unknown_remat_policy():
    with pytest.raises(UnsupportedError, match="remat='some'"):
        forward(init_params(LLAMA, jax.random.key(0)), _tokens(), LLAMA, remat="some")


def _unpadded(params, vocab_size):
    """The same weights with the padding rows of the table and columns of the head dropped."""
    out = jax.tree.map(lambda x: x, params)
    out["embed"] = dict(params["embed"], tokens=params["embed"]["tokens"][:vocab_size])
    if "lm_head" in params:
        out["lm_head"] = {"w": params["lm_head"]["w"][:, :vocab_size]}
    return out


@pytest.mark.parametrize("cfg", [LLAMA, GPT], ids=["llama-untied", "gpt-tied"])
def test_padded_vocabulary_gives_the_unpadded_logits_loss_and_gradients(cfg):
    padded = cfg.model_copy(update={"vocab_size": 50})  # 50 tokens in 128 rows
    exact = padded.model_copy(update={"vocab_multiple": 1})
    assert (padded.padded_vocab_size, exact.padded_vocab_size) == (128, 50)
    params = init_params(padded, jax.random.key(0))
    tokens = _tokens(vocab=50)
    batch = {"tokens": tokens, "targets": jnp.roll(tokens, -1, axis=1)}

    logits, _ = forward(params, tokens, padded, compute_dtype=jnp.float32)
    exact_logits, _ = forward(_unpadded(params, 50), tokens, exact, compute_dtype=jnp.float32)
    assert logits.shape == (2, 12, 128) and exact_logits.shape == (2, 12, 50)
    assert jnp.allclose(logits[..., :50], exact_logits, atol=1e-6)
    assert bool((logits[..., 50:] == PADDED_LOGIT).all()) and int(logits.argmax(-1).max()) < 50

    loss, grads = jax.value_and_grad(loss_fn)(params, batch, padded, compute_dtype=jnp.float32)
    exact_loss, exact_grads = jax.value_and_grad(loss_fn)(_unpadded(params, 50), batch, exact, compute_dtype=jnp.float32)
    assert jnp.isfinite(loss) and float(loss) == pytest.approx(float(exact_loss), rel=1e-6)
    assert jnp.allclose(_unpadded(grads, 50)["embed"]["tokens"], exact_grads["embed"]["tokens"], atol=1e-7)
    assert float(abs(grads["embed"]["tokens"][50:]).max()) == 0.0  # no token, no target: no gradient
    if "lm_head" in grads:
        assert jnp.allclose(grads["lm_head"]["w"][:, :50], exact_grads["lm_head"]["w"], atol=1e-7)
        assert float(abs(grads["lm_head"]["w"][:, 50:]).max()) == 0.0
    assert jnp.allclose(grads["final_norm"]["scale"], exact_grads["final_norm"]["scale"], atol=1e-6)


def test_the_gpu_vocab_projection_keeps_fp32_logits_and_takes_bf16_operands_backward():
    """Its gradients are autodiff's to bf16 rounding of the logits' gradient; its backward products read bf16."""
    from planner.programs.transformer import _f32_projection, vocab_projection

    h_BxSxD = jax.random.normal(jax.random.key(0), (2, 4, 16), jnp.float32).astype(jnp.bfloat16)
    w_DxV = jax.random.normal(jax.random.key(1), (16, 32), jnp.float32).astype(jnp.bfloat16)
    target_BxSxV = jax.random.normal(jax.random.key(2), (2, 4, 32), jnp.float32)

    def loss(project, h, w):
        return jnp.sum(project(h, w) * target_BxSxV)

    assert (vocab_projection(h_BxSxD, w_DxV) == _f32_projection(h_BxSxD, w_DxV)).all()
    got, want = (jax.grad(partial(loss, project), argnums=(0, 1))(h_BxSxD, w_DxV) for project in (vocab_projection, _f32_projection))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=2e-2, atol=2e-2)
    def equations(jaxpr):
        for e in jaxpr.eqns:
            yield e
            for sub in jax.extend.core.jaxprs_in_params(e.params):
                yield from equations(sub)

    backward = jax.make_jaxpr(jax.grad(partial(loss, vocab_projection), argnums=(0, 1)))(h_BxSxD, w_DxV)
    dots = [e for e in equations(backward.jaxpr) if e.primitive.name == "dot_general"]
    assert dots and all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars)
