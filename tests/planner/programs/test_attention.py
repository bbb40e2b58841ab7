"""Tests `planner/programs/attention.py`: the flash kernel equals the materialized reference, and its memory is linear in S."""

import jax
import jax.numpy as jnp
import pytest

from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from planner.programs.attention import block_pairs, flash_attention, fused_attention, fused_kernel_usable, reference_attention
from planner.programs.params import init_params
from planner.programs.train_step import make_loss_and_grads

FP32_TOLERANCE = 1e-5
BF16_TOLERANCE = 3e-2


def _qkv(b, s, k, g, h, dtype=jnp.float32, seed=0):
    keys = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(keys[0], (b, s, k, g, h), dtype)
    kk, v = (jax.random.normal(key, (b, s, k, h), dtype) for key in keys[1:3])
    return q, kk, v, jax.random.normal(keys[3], (b, s, k, g, h), dtype)


@pytest.mark.parametrize("b, s, k, g, h, block", [
    (2, 16, 2, 3, 8, 4),   # grouped-query, the block divides S
    (1, 13, 1, 4, 8, 4),   # one KV head (multi-query), S not a multiple of the block
    (2, 9, 3, 1, 4, 16),   # multi-head, one block longer than S
    (1, 40, 2, 2, 16, 8),
])
def test_forward_and_gradients_match_the_reference_in_fp32(b, s, k, g, h, block):
    q, kk, v, do = _qkv(b, s, k, g, h)
    flash = flash_attention(q, kk, v, block)
    assert float(jnp.abs(flash - reference_attention(q, kk, v)).max()) < FP32_TOLERANCE
    grads = jax.grad(lambda *a: jnp.sum(flash_attention(*a, block) * do), argnums=(0, 1, 2))(q, kk, v)
    expected = jax.grad(lambda *a: jnp.sum(reference_attention(*a) * do), argnums=(0, 1, 2))(q, kk, v)
    for got, want in zip(grads, expected):
        assert float(jnp.abs(got - want).max()) < FP32_TOLERANCE * max(1.0, float(jnp.abs(want).max()))


def test_bf16_matches_the_fp32_reference_within_bf16_rounding():
    q, kk, v, _ = _qkv(2, 32, 2, 2, 16)
    want = reference_attention(q, kk, v)
    got = flash_attention(q.astype(jnp.bfloat16), kk.astype(jnp.bfloat16), v.astype(jnp.bfloat16), 8).astype(jnp.float32)
    assert float(jnp.abs(got - want).max()) < BF16_TOLERANCE * float(jnp.abs(want).max())


def test_the_library_kernel_matches_the_reference_and_keeps_its_residuals_under_a_names_policy():
    q, kk, v, do = _qkv(2, 16, 2, 3, 8)
    fused = lambda *a: fused_attention(*a, implementation="xla")  # noqa: E731 (cuDNN's needs a GPU; the wrapper is the same)
    assert float(jnp.abs(fused(q, kk, v) - reference_attention(q, kk, v)).max()) < FP32_TOLERANCE
    expected = jax.grad(lambda *a: jnp.sum(reference_attention(*a) * do), argnums=(0, 1, 2))(q, kk, v)

    def backward_dots(policy):
        loss = lambda *a: jnp.sum(fused(*a) * do)  # noqa: E731
        loss = jax.checkpoint(loss, policy=policy) if policy else loss
        grads = jax.grad(loss, argnums=(0, 1, 2))(q, kk, v)
        for got, want in zip(grads, expected):
            assert float(jnp.abs(got - want).max()) < FP32_TOLERANCE * max(1.0, float(jnp.abs(want).max()))
        return str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, kk, v)).count("dot_general")

    names = jax.checkpoint_policies.save_only_these_names("attn_out_proj_input", "softmax_logsumexp")
    # Kept by name, nothing of the forward runs again in the backward, as without remat.
    assert backward_dots(names) == backward_dots(None) < backward_dots(jax.checkpoint_policies.nothing_saveable)


def test_the_fused_kernel_is_chosen_only_where_cudnn_runs_it():
    bf16 = jnp.zeros((1, 8, 2, 2, 128), jnp.bfloat16)
    assert fused_kernel_usable(bf16, backend="gpu")
    assert not fused_kernel_usable(bf16, backend="cpu")
    assert not fused_kernel_usable(jnp.zeros((1, 8, 2, 2, 256), jnp.bfloat16), backend="gpu")


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN's fused attention needs a GPU")
def test_on_a_gpu_the_cudnn_kernel_matches_the_blockwise_one_forward_and_backward_under_remat():
    q, kk, v, do = (x.astype(jnp.bfloat16) for x in _qkv(2, 1024, 2, 4, 128))
    assert fused_kernel_usable(q)
    policy = jax.checkpoint_policies.save_only_these_names("q", "k", "v", "attn_out_proj_input", "softmax_logsumexp")
    results = {}
    for name, kernel in {"cudnn": flash_attention, "blockwise": lambda *a: flash_attention(*a, block=256)}.items():
        loss = jax.checkpoint(lambda *a, kernel=kernel: jnp.sum((kernel(*a) * do).astype(jnp.float32)), policy=policy)
        results[name] = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, kk, v)
        # cuDNN's flash-attention custom calls (XLA may use cuDNN for plain GEMM fusions too).
        assert ("__cudnn$fmha" in jax.jit(jax.grad(loss)).lower(q, kk, v).compile().as_text()) is (name == "cudnn")
    (loss_c, grads_c), (loss_b, grads_b) = results["cudnn"], results["blockwise"]
    assert abs(float(loss_c) - float(loss_b)) < BF16_TOLERANCE * max(1.0, abs(float(loss_b)))
    for got, want in zip(grads_c, grads_b):
        assert float(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32)).max()) < BF16_TOLERANCE * float(jnp.abs(want).max())


def test_only_the_causal_triangle_of_blocks_is_visited():
    q_P, k_P = block_pairs(2048, 512)
    assert len(q_P) == 4 * 5 // 2 and bool((k_P <= q_P).all())


def test_the_training_step_gives_the_same_loss_and_gradients_with_either_kernel():
    cfg = ModelConfig(name="t", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=64, vocab_size=50,
                      norm="rmsnorm", mlp="swiglu", positions="rope")
    train = TrainConfig(seq_len=24, global_batch=2, compute_dtype="float32")
    params = init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 24), 0, 50)
    batch = {"tokens": tokens, "targets": jnp.roll(tokens, -1, axis=1)}
    results = {kernel: make_loss_and_grads(cfg, train, attention=kernel, remat="selective")(params, batch)
               for kernel in ("materialized", "flash")}
    assert float(results["flash"][0]) == pytest.approx(float(results["materialized"][0]), rel=1e-5)
    diffs = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), results["flash"][1], results["materialized"][1])
    assert max(jax.tree.leaves(diffs)) < 1e-4


def _temp_bytes(seq_len: int) -> float:
    q = jax.ShapeDtypeStruct((1, seq_len, 8, 4, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, seq_len, 8, 128), jnp.bfloat16)
    step = jax.jit(jax.grad(lambda q, k, v: flash_attention(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2)))
    return float(step.lower(q, kv, kv).compile().memory_analysis().temp_size_in_bytes)


def test_compiled_temporaries_grow_linearly_with_the_sequence():
    # 2k -> 8k -> 32k tokens: a quadratic kernel's temporaries grow 16x per step, a linear one's 4x.
    temp_2k, temp_8k, temp_32k = (_temp_bytes(s) for s in (2048, 8192, 32768))
    assert temp_8k / temp_2k < 5 and temp_32k / temp_8k < 5
