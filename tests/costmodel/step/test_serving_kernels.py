"""Tests `costmodel/step/serving_kernels.py`: fp8 W8A8 GEMMs and the experts a serving step touches."""

import pytest

from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.serving_kernels import expected_experts_touched, iteration_layer_kernels, layer_kernels, linear_kernels

MOE = ModelConfig(name="moe", hidden_size=1024, num_layers=2, num_heads=8, num_kv_heads=2, ffn_size=2048, vocab_size=1000,
                  num_experts=8, experts_per_token=2)


def _serve(workload="decode", **inference):
    return TrainConfig(workload=workload, global_batch=1, seq_len=512, inference=inference or None)


def test_expected_experts_touched_grows_from_top_k_to_all():
    assert expected_experts_touched(num_experts=8, experts_per_token=2, tokens=1) == pytest.approx(2)
    assert expected_experts_touched(num_experts=8, experts_per_token=2, tokens=2) == pytest.approx(8 * (1 - 0.75 ** 2))  # 3.5
    counts = [expected_experts_touched(num_experts=64, experts_per_token=6, tokens=n) for n in (1, 4, 16, 256, 4096)]
    assert counts == sorted(counts) and counts[0] == pytest.approx(6) and counts[-1] == pytest.approx(64)
    assert expected_experts_touched(num_experts=8, experts_per_token=8, tokens=1) == pytest.approx(8)


def test_fp8_gemm_reads_one_byte_weights_and_inputs_and_quantizes_its_input_in_a_fused_pass():
    bf16 = linear_kernels("w", tokens=4, d_in=100, d_out=300, train=_serve())
    fp8 = linear_kernels("w", tokens=4, d_in=100, d_out=300, train=_serve(weight_dtype="fp8"))
    assert [k.bytes for k in bf16] == [100 * 300 * 2 + 4 * (100 + 300) * 2]
    gemm, quant = fp8
    assert gemm.linear and gemm.flops == bf16[0].flops == 2 * 4 * 100 * 300
    assert gemm.bytes == 100 * 300 + 4 * 100 + 4 * 300 * 2  # fp8 weight and input, bf16 output
    assert quant.fused and quant.flops == 0 and quant.bytes == 4 * 100 * (2 + 1)


@pytest.mark.parametrize("sequences, new_tokens, experts_read", [(1, 1, 2), (16, 1, 8 * (1 - 0.75 ** 16)), (1, 512, 8)])
def test_experts_cost_top_k_flops_and_the_weights_of_the_experts_touched(sequences, new_tokens, experts_read):
    tp = 2
    kernels = {k.name: k for k in layer_kernels(MOE, _serve(), Layout(tp=tp), sequences=sequences, new_tokens=new_tokens,
                                                kv_heads=1, cache_tokens=512)}
    tokens, d, f = sequences * new_tokens, 1024, 2048 / tp
    up, down = kernels["expert_up"], kernels["expert_down"]
    assert up.flops == 2 * tokens * 2 * d * 2 * f and down.flops == 2 * tokens * 2 * f * d  # k = 2 experts a token
    assert up.bytes == pytest.approx(experts_read * d * 2 * f * 2 + tokens * 2 * (d + 2 * f) * 2)
    assert kernels["router"].flops == 2 * tokens * d * 8 and not kernels["router"].linear
    assert "mlp_up" not in kernels


DENSE = ModelConfig(name="dense", hidden_size=1024, num_layers=2, num_heads=16, num_kv_heads=4, ffn_size=4096, vocab_size=1000)


def test_eager_prefill_scores_the_whole_square_and_passes_over_the_scores_and_each_operator():
    """transformers' eager attention computes every score (the causal mask shrinks no work) and writes them; a
    compiled stack's fused kernel computes the causal half and reads q, k and v once."""
    prompt = 512
    eager = {k.name: k for k in layer_kernels(DENSE, _serve("prefill", serving_stack="hf-eager"), Layout(), sequences=2,
                                              new_tokens=prompt, kv_heads=4, cache_tokens=prompt)}
    fused = {k.name: k for k in layer_kernels(DENSE, _serve("prefill", serving_stack="tensorrt-llm"), Layout(), sequences=2,
                                              new_tokens=prompt, kv_heads=4, cache_tokens=prompt)}
    square_flops = eager["attention_scores"].flops + eager["attention_values"].flops
    assert square_flops == pytest.approx(2 * fused["attention"].flops)
    scores = 2 * prompt * prompt * 16
    assert eager["attention_softmax"].bytes == scores * (6 * 2 + 2 * 4)  # scale, mask, fp32 softmax, cast back
    assert eager["repeat_kv"].bytes == 2 * 2 * prompt * (256 + 1024) * 2  # 4 KV heads copied out to 16 query heads
    assert eager["unfused_operators"].bytes > 3 * 2 * prompt * 1024 * 2 and "unfused_operators" not in fused
    assert all(eager[name].fused for name in ("attention_softmax", "repeat_kv", "unfused_operators"))  # no launch floor


def test_eager_decode_reads_the_cache_once_and_its_scores():
    eager = {k.name: k for k in layer_kernels(DENSE, _serve(serving_stack="hf-eager"), Layout(), sequences=4, new_tokens=1,
                                              kv_heads=4, cache_tokens=512)}
    keys = 4 * 512
    assert eager["attention_scores"].bytes == 4 * 1024 * 2 + keys * 1024 * 2 + keys * 16 * 2  # q, the repeated keys, scores
    assert eager["attention_softmax"].bytes == keys * 16 * 20


def test_torch_compile_streams_weight_only_gemvs_slower_and_reads_tinygemm_group_scales():
    args = {"tokens": 1, "d_in": 4096, "d_out": 4096}
    jax_int4 = linear_kernels("w", **args, train=_serve(weight_dtype="int4"))[0]
    torch_int4 = linear_kernels("w", **args, train=_serve(weight_dtype="int4", serving_stack="torch-compile", weight_group_size=32))[0]
    torch_int8 = linear_kernels("w", **args, train=_serve(weight_dtype="int8", serving_stack="torch-compile"))[0]
    torch_bf16 = linear_kernels("w", **args, train=_serve(serving_stack="torch-compile"))[0]
    activations = (4096 + 4096) * 2
    assert jax_int4.bytes == 4096 * 4096 * 0.5 + activations and jax_int4.stream_efficiency == 1.0
    assert torch_int4.bytes == pytest.approx(4096 * 4096 * (0.5 + 4 / 32) + activations)  # a bf16 scale and zero per 32 weights
    assert torch_int4.stream_efficiency < torch_int8.stream_efficiency < torch_bf16.stream_efficiency == 1.0


def test_a_kernel_with_a_block_per_query_head_reads_a_grouped_cache_once_per_query_head():
    """TensorRT-LLM's masked multi-head attention (before XQA) reads each of DENSE's 4 KV heads for each of its 4 query
    heads, in decode and in a continuous-batching iteration; prefill's fused kernel is unchanged."""
    def attention_bytes(stack, workload="decode", new_tokens=1):
        kernels = layer_kernels(DENSE, _serve(workload, serving_stack=stack), Layout(), sequences=8, new_tokens=new_tokens,
                                kv_heads=4, cache_tokens=512)
        return next(k.bytes for k in kernels if k.name == "attention")

    queries = 8 * 2 * 16 * 64 * 2  # each sequence's query in and output out
    shared, per_head = attention_bytes("tensorrt-llm"), attention_bytes("tensorrt-llm-0.6")
    assert per_head - queries == pytest.approx(4 * (shared - queries))
    assert attention_bytes("tensorrt-llm-0.6", "prefill", 512) == attention_bytes("tensorrt-llm", "prefill", 512)
    iteration = {s: next(k.bytes for k in iteration_layer_kernels(DENSE, _serve(serving_stack=s), Layout(), decode_sequences=8,
                                                                   tokens_per_sequence=1, cached_tokens=8 * 512, kv_heads=4,
                                                                   prompt_tokens=0) if k.name == "decode_attention")
                 for s in ("tensorrt-llm", "tensorrt-llm-0.6")}
    assert iteration["tensorrt-llm-0.6"] - queries == pytest.approx(4 * (iteration["tensorrt-llm"] - queries))
