"""Tests `validate/predict_serving.py` (with the programs of `validate/serving.py`) against XLA."""

import pytest

from costmodel.errors import UnsupportedError
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import STACKS, Attention
from costmodel.inputs.workload import InferenceConfig
from planner.api import layout_plan
from validate.compile_check import compile_in_subprocess
from validate.predict_serving import serving_argument_bytes, serving_collectives, serving_matmul_flops
from validate.report import checks, features_not_predicted

LLAMA = ModelConfig(name="tiny-llama", hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4, ffn_size=512, vocab_size=1024)
GPT2 = ModelConfig(name="tiny-gpt2", hidden_size=128, num_layers=4, num_heads=4, ffn_size=512, vocab_size=1000, positions="learned",
                   norm="layernorm", mlp="gelu", qkv_bias=True, out_bias=True, mlp_bias=True, tie_embeddings=True)
MATERIALIZED = STACKS["jax"].model_copy(update={"attention": Attention.MATERIALIZED})
PROMPT = InferenceConfig(prompt_len=96)  # flash blocks of 96: one block pair


@pytest.mark.parametrize("model, workload, layout, inference", [
    (LLAMA, "decode", Layout(dp=2, tp=4), InferenceConfig()),
    # tp > kv heads: the tensor axis splits in two, a KV head (its cache and projections) on each pair
    (LLAMA, "decode", Layout(tp=8), InferenceConfig(kv_block_size=64)),
    (LLAMA, "decode", Layout(dp=4, tp=2), InferenceConfig(weight_dtype="int8")),
    (LLAMA, "decode", Layout(dp=2, tp=4), InferenceConfig(weight_dtype="fp8", kv_cache_dtype="fp8")),
    (LLAMA, "prefill", Layout(dp=2, tp=4), PROMPT),
    (LLAMA, "prefill", Layout(dp=2, tp=4, stack=MATERIALIZED), PROMPT),
    (GPT2, "prefill", Layout(dp=4, tp=2), InferenceConfig(prompt_len=80, kv_block_size=32)),
    (LLAMA, "decode", Layout(pp=2, tp=4), InferenceConfig()),
    (LLAMA, "decode", Layout(pp=4, dp=2), InferenceConfig()),
    (LLAMA, "prefill", Layout(pp=2, dp=2, tp=2), PROMPT),
    # 2D weight-stationary: the model dimension over embed, heads and MLP width over tensor, the cache's sequences over embed.
    (LLAMA, "decode", Layout(dp=2, tp=8, tp_embed=2), InferenceConfig()),
    (GPT2, "decode", Layout(tp=8, tp_embed=4), InferenceConfig()),
], ids=["decode-dp-tp", "decode-tp-over-kv-heads", "decode-dp-tp-int8", "decode-dp-tp-fp8-weights-and-cache", "prefill-dp-tp-flash",
        "prefill-dp-tp-materialized", "prefill-gpt2-tied", "decode-pp2-tp4", "decode-pp4-dp2", "prefill-pp2-dp2-tp2",
        "decode-2d-dp2", "decode-2d-gpt2-layernorm"])
def test_serving_arguments_flops_and_collectives_match_the_compiled_module(model, workload, layout, inference):
    plan = layout_plan(model, layout, hardware="h100-sxm", seq_len=200, global_batch=8, workload=workload, inference=inference)
    assert features_not_predicted(plan) == []
    results = {(c.item, c.axis): c for c in checks(plan, compile_in_subprocess(plan))}
    assert all(c.ok for c in results.values()), {k: (c.predicted, c.actual) for k, c in results.items() if not c.ok}
    assert ("memory arguments", None) in results and ("flops", None) in results
    assert any(item == "all-reduce bytes" and (axis or "").startswith("tensor") for item, axis in results) or layout.tp == 1
    assert ("all-gather bytes", "embed") in results or layout.tp_embed == 1
    assert ("collective-permute bytes", "pipeline") in results or layout.pp == 1


def test_cache_is_rounded_up_to_whole_blocks_in_the_arguments():
    small = layout_plan(LLAMA, Layout(), seq_len=100, global_batch=2, workload="decode", inference=InferenceConfig(kv_block_size=16))
    large = layout_plan(LLAMA, Layout(), seq_len=100, global_batch=2, workload="decode", inference=InferenceConfig(kv_block_size=128))
    per_token = 2 * 4 * 2 * 4 * 32 * 2  # K and V · layers · batch · kv heads · head_dim · bf16
    assert serving_argument_bytes(large) - serving_argument_bytes(small) == per_token * (128 - 112)


def test_pipelined_decode_computes_in_bubble_ticks_and_hands_micro_batches_on():
    """pp=4 over 8 sequences: 4 micro-batches of 2, 7 ticks; each device runs its layer on every tick."""
    flat = layout_plan(LLAMA, Layout(), seq_len=64, global_batch=8, workload="decode")
    piped = layout_plan(LLAMA, Layout(pp=4), seq_len=64, global_batch=8, workload="decode")
    head_flops = 2 * 8 * LLAMA.hidden_size * LLAMA.vocab_size
    assert serving_matmul_flops(piped) - head_flops == pytest.approx((serving_matmul_flops(flat) - head_flops) * 7 / 4 / 4)
    permute = next(c for c in serving_collectives(piped) if c.kind == "collective-permute")
    assert (permute.calls, permute.bytes_per_call) == (7, 2 * LLAMA.hidden_size * 2)


def test_prefill_flops_grow_with_the_flash_kernels_causal_blocks():
    """A 2048-token prompt in blocks of 512: 10 of the 16 block pairs run."""
    plan = layout_plan(LLAMA, Layout(), seq_len=2048, global_batch=1, workload="prefill")
    longer = plan.model_copy(update={"layout": plan.layout.model_copy(update={"stack": MATERIALIZED})})
    attention_per_pair = 4 * 1 * LLAMA.num_heads * LLAMA.head_dim * 512**2 * LLAMA.num_layers
    assert serving_matmul_flops(longer) - serving_matmul_flops(plan) == pytest.approx(attention_per_pair * (16 - 10))


def test_fp8_weights_and_cache_take_one_byte_each_in_the_arguments():
    bf16 = layout_plan(LLAMA, Layout(), hardware="h100-sxm", seq_len=100, global_batch=2, workload="decode")
    fp8 = layout_plan(LLAMA, Layout(), hardware="h100-sxm", seq_len=100, global_batch=2, workload="decode",
                      inference=InferenceConfig(weight_dtype="fp8", kv_cache_dtype="fp8"))
    layer_matrices = 4 * (256 * (256 + 2 * 128) + 256 * 256 + 3 * 256 * 512)  # layers · (qkv + out + gated MLP)
    cache = 2 * 4 * 2 * 112 * 4 * 32  # K and V · layers · batch · 7 blocks of 16 · kv heads · head_dim
    assert serving_argument_bytes(bf16) - serving_argument_bytes(fp8) == layer_matrices + cache  # one byte less each


def test_mixture_of_experts_decode_is_refused_in_one_line():
    moe = LLAMA.model_copy(update={"name": "tiny-moe", "num_experts": 4, "experts_per_token": 2, "moe_ffn_size": 512})
    plan = layout_plan(moe, Layout(tp=2), seq_len=64, global_batch=2, workload="decode")
    with pytest.raises(UnsupportedError, match="a mixture-of-experts model, are not lowered yet"):
        compile_in_subprocess(plan)


def test_a_serving_tensor_axis_over_more_devices_than_kv_heads_caches_one_kv_head_a_device_as_the_plan_predicts():
    plan = layout_plan(LLAMA, Layout(tp=8), hardware="h100-sxm", seq_len=200, global_batch=8, workload="decode")
    assert [(a.name, a.size) for a in plan.mesh] == [("tensor", 4), ("tensor_query", 2)]
    assert plan.param_specs["layers/attn/wk"][2] == "tensor" and plan.param_specs["layers/attn/wq"][2] == ("tensor", "tensor_query")
    memory = plan.predicted.memory
    tokens_and_position = 8 * 4 + 4
    assert serving_argument_bytes(plan) - tokens_and_position == pytest.approx(memory.params_bytes + memory.kv_cache_bytes, rel=1e-3)
