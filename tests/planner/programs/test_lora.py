"""Tests `planner/programs/lora.py` and the LoRA step of `planner/programs/train_step.py`."""

import jax
import jax.numpy as jnp
import pytest

from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.inputs.workload import LoraConfig, adapter_params_per_layer
from planner.programs.lora import (
    abstract_frozen,
    adapter_elements,
    adapter_shapes,
    adapter_specs,
    init_adapters,
    init_frozen,
    merge_adapters,
)
from planner.programs.train_step import abstract_train_inputs, init_opt_state, loss_fn, make_train_step

CFG = ModelConfig(name="t", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=64, vocab_size=50)
TRAIN = TrainConfig(seq_len=8, global_batch=2, workload="finetune-lora", lora={"targets": ["attn", "mlp"], "rank": 4})
BATCH = {"tokens": jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 50, "targets": jnp.ones((2, 8), jnp.int32)}


def test_adapter_count_matches_the_cost_model():
    assert adapter_elements(CFG, TRAIN.workload.lora) == CFG.num_layers * adapter_params_per_layer(CFG, TRAIN.workload.lora)


def test_query_value_adapters_have_the_napkin_count_and_only_they_train():
    r, d, kv = 4, CFG.hidden_size, CFG.num_kv_heads * CFG.head_dim
    qv = LoraConfig(rank=r, targets="q,v")
    # r·(d_in + d_out) per adapted matrix per layer: q is d → d, v is d → kv width.
    assert adapter_elements(CFG, qv) == CFG.num_layers * (r * (d + d) + r * (d + kv))
    assert set(adapter_shapes(CFG, qv)) == {f"layers/attn/{w}_lora_{h}" for w in ("wq", "wv") for h in "ab"}
    train = TRAIN.model_copy(update={"workload": TRAIN.workload.model_copy(update={"lora": qv})})
    frozen, adapters = init_frozen(CFG, train, jax.random.key(0)), init_adapters(CFG, qv, jax.random.key(1))
    new, _, _ = jax.jit(make_train_step(CFG, train))(frozen, adapters, init_opt_state(adapters), BATCH)
    assert set(new["layers"]) == {"attn"} and float(jnp.abs(new["layers"]["attn"]["wv_lora_b"]).max()) > 0


def test_gate_on_a_non_gated_mlp_adapts_nothing():
    gelu = ModelConfig.model_validate({**CFG.model_dump(), "mlp": "gelu"})
    assert set(adapter_shapes(gelu, LoraConfig(targets="mlp"))) == {f"layers/mlp/{w}_lora_{h}" for w in ("w_in", "w_out") for h in "ab"}


def test_adapters_start_as_the_base_model_and_only_they_train():
    frozen = init_frozen(CFG, TRAIN, jax.random.key(0))
    adapters = init_adapters(CFG, TRAIN.workload.lora, jax.random.key(1))
    base = loss_fn(frozen, BATCH, CFG)
    assert loss_fn(merge_adapters(frozen, adapters), BATCH, CFG) == base  # B starts at zero
    step = jax.jit(make_train_step(CFG, TRAIN))
    new, opt_state, metrics = step(frozen, adapters, init_opt_state(adapters), BATCH)
    assert jax.tree.structure(new) == jax.tree.structure(adapters)
    assert float(jnp.abs(new["layers"]["mlp"]["w_out_lora_b"]).max()) > 0
    _, _, again = step(frozen, new, opt_state, BATCH)
    assert again["loss"] < metrics["loss"]


@pytest.mark.parametrize("frozen_dtype, layer_dtype", [("bf16", jnp.bfloat16), ("int8", jnp.int8), ("int4", jnp.int4)])
def test_frozen_layer_weights_are_stored_as_asked_and_the_rest_in_the_compute_dtype(frozen_dtype, layer_dtype):
    train = TrainConfig(seq_len=8, global_batch=2, workload="finetune-lora", lora={"frozen_dtype": frozen_dtype})
    frozen = abstract_frozen(CFG, train)
    assert frozen["layers"]["mlp"]["w_in"].dtype == layer_dtype and frozen["layers"]["attn_norm"]["scale"].dtype == jnp.bfloat16
    assert frozen["embed"]["tokens"].dtype == jnp.bfloat16
    out = jax.eval_shape(make_train_step(CFG, train), *abstract_train_inputs(CFG, train))
    assert out[2]["loss"].shape == ()


def test_adapter_specs_follow_the_adapted_matrix():
    specs = {"layers/attn/wq": (None, None, "tensor", None), "layers/attn/wo": (None, "tensor", None, "data"),
             "layers/attn/wk": (None, "data", None, None), "layers/attn/wv": (None, None, None, None)}
    out = adapter_specs(CFG, LoraConfig(), specs)
    assert out["layers/attn/wq_lora_a"] == (None, None, None) and out["layers/attn/wq_lora_b"] == (None, None, "tensor", None)
    assert out["layers/attn/wo_lora_a"] == (None, "tensor", None, None) and out["layers/attn/wo_lora_b"] == (None, None, "data")
    assert set(out) == set(adapter_shapes(CFG, LoraConfig()))
