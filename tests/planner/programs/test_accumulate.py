"""Tests `planner/programs/accumulate.py`: gradients added in layer by layer are autodiff's, and
only one layer's gradient exists beside the sum."""

import functools

import jax
import jax.numpy as jnp
import pytest

from costmodel.errors import UnsupportedError
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from planner.programs.accumulate import make_accumulating_value_and_grad
from planner.programs.params import abstract_params, init_params
from planner.programs.residuals import residuals_as_bits
from planner.programs.train_step import make_value_and_grad, micro_batched

LLAMA = ModelConfig(name="tiny-llama", hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2, ffn_size=64, vocab_size=100)
GPT = ModelConfig(name="tiny-gpt", hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, vocab_size=100, norm="layernorm",
                  mlp="gelu", positions="learned", tie_embeddings=True, max_position_embeddings=16)
MOE = ModelConfig(**{**LLAMA.model_dump(), "name": "tiny-moe", "num_experts": 4, "experts_per_token": 2, "moe_ffn_size": 32})
TRAIN = TrainConfig(seq_len=16, global_batch=2)
# As the validator lowers it on the CPU: residuals kept as 16-bit integers, the scanned weights as they are.
BITS = {"keep_residuals": functools.partial(residuals_as_bits, scan_body=True)}


def _batch(cfg: ModelConfig) -> dict[str, jax.Array]:
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab_size)
    return {"tokens": tokens, "targets": jnp.roll(tokens, -1, axis=1)}


@pytest.mark.parametrize("remat", ["none", "selective", "full"])
@pytest.mark.parametrize("cfg", [LLAMA, GPT, MOE], ids=["llama", "gpt2-tied", "moe"])
def test_the_sum_gains_autodiffs_gradients_under_every_recompute_policy(cfg, remat):
    params = init_params(cfg, jax.random.key(0))
    acc = jax.tree.map(lambda p: jnp.full(p.shape, 0.5, jnp.float32), params)
    loss, summed = jax.jit(make_accumulating_value_and_grad(cfg, TRAIN, remat=remat, hooks=BITS))(params, _batch(cfg), acc)
    want_loss, grads = jax.jit(make_value_and_grad(cfg, TRAIN, remat=remat))(params, _batch(cfg), None)
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-6)
    for got, base, grad in zip(jax.tree.leaves(summed), jax.tree.leaves(acc), jax.tree.leaves(grads)):
        assert got.dtype == jnp.float32 and jnp.allclose(got, base + grad, atol=1e-6, rtol=1e-5)


def test_a_micro_batch_loop_holds_one_layers_gradient_not_the_stack_of_them():
    """Compiled on the CPU, the loop over micro-batches needs less temporary memory than autodiff's
    by the layers' whole 16-bit gradient, and keeps no second copy of the stacked weights."""
    cfg = ModelConfig(name="m", hidden_size=256, num_layers=8, num_heads=4, num_kv_heads=2, ffn_size=768, vocab_size=512)
    train = TrainConfig(seq_len=128, global_batch=8)
    params = abstract_params(cfg, dtype=jnp.bfloat16)
    acc = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, jnp.float32), params)
    batch = {k: jax.ShapeDtypeStruct((8, 128), jnp.int32) for k in ("tokens", "targets")}
    plain_grads = make_value_and_grad(cfg, train, remat="full", hooks=BITS)
    accumulating = make_accumulating_value_and_grad(cfg, train, remat="full", hooks=BITS)

    def plain(params, batch, acc):
        def add(acc, mb):
            return jax.tree.map(lambda a, g: a + g.astype(a.dtype), acc, plain_grads(params, mb, None)[1]), None
        return jax.lax.scan(add, acc, micro_batched(batch, 4))[0]

    def layer_by_layer(params, batch, acc):
        return jax.lax.scan(lambda acc, mb: (accumulating(params, mb, acc)[1], None), acc, micro_batched(batch, 4))[0]

    temp = {f.__name__: jax.jit(f, donate_argnums=2).lower(params, batch, acc).compile().memory_analysis().temp_size_in_bytes
            for f in (plain, layer_by_layer)}
    stack_bytes = sum(p.size for p in jax.tree.leaves(params["layers"])) * 2
    assert temp["plain"] - temp["layer_by_layer"] == pytest.approx(stack_bytes, rel=0.1)


def test_adapters_are_refused_in_one_line():
    lora = TrainConfig(seq_len=16, global_batch=2, workload="finetune-lora")
    with pytest.raises(UnsupportedError, match="full training"):
        make_accumulating_value_and_grad(LLAMA, lora)
