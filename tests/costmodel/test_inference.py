"""Tests `costmodel/inference.py`: the KV cache, decode and prefill times, serving memory."""

import pytest

from costmodel.errors import UnsupportedError
from costmodel.inference import kv_cache_bytes, micro_batches, simulate_inference
from costmodel.layout import Layout
from costmodel.machine import load_machine
from costmodel.model_config import ModelConfig
from costmodel.train_config import TrainConfig

M = ModelConfig(name="m", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_size=14336, vocab_size=128256)
H100 = load_machine("h100-sxm")


def _decode(batch, context, **inference):
    return TrainConfig(workload="decode", global_batch=batch, seq_len=context, inference=inference or None)


def test_kv_cache_is_gqa_aware_rounded_to_blocks_and_split_by_tp_pp_dp():
    whole = 2 * 32 * 8 * 128 * 2 * 4 * 4096  # K and V · layers · kv heads · head_dim · bf16 · batch · context
    assert kv_cache_bytes(M, _decode(4, 4096), Layout()) == whole
    assert kv_cache_bytes(M, _decode(4, 4090), Layout()) == whole  # 4090 tokens take 256 whole blocks of 16
    assert kv_cache_bytes(M, _decode(4, 4096, kv_block_size=1000), Layout()) == whole * 5000 / 4096
    assert kv_cache_bytes(M, _decode(4, 4096), Layout(tp=2, pp=2, dp=2)) == whole / 4  # each replica its own batch
    assert kv_cache_bytes(M, _decode(4, 4096), Layout(tp=16)) == whole / 8  # one kv head per device, replicated twice


@pytest.mark.parametrize("batch", [2, 64])
@pytest.mark.parametrize("layout", [Layout(), Layout(tp=8), Layout(tp=2, pp=4), Layout(dp=2, tp=4)])
def test_time_per_output_token_is_at_or_above_the_hbm_floor(batch, layout):
    est = simulate_inference(M, _decode(batch, 2048), layout, H100)
    srv = est.serving
    assert srv.hbm_lower_bound_s <= est.time_per_output_token_s
    assert abs(est.breakdown.total_s - est.step_time_s) < 1e-12 and est.step_time_s == est.time_per_output_token_s
    assert est.tokens_per_s == pytest.approx(layout.dp * batch / est.time_per_output_token_s)


def test_decode_is_hbm_bound_at_batch_one_and_prefill_compute_bound():
    decode = simulate_inference(M, _decode(1, 2048), Layout(), H100)
    assert decode.serving.decode_bound == "hbm"
    weights = decode.memory.params_bytes
    assert decode.serving.hbm_lower_bound_s == pytest.approx((weights + decode.memory.kv_cache_bytes) / H100.hbm_bytes_per_s)
    prefill = simulate_inference(M, TrainConfig(workload="prefill", global_batch=1, seq_len=2048), Layout(), H100)
    flops = 2 * 2048 * M.total_params
    assert prefill.time_to_first_token_s > flops / H100.peak_flops_per_s  # at least the prompt's forward at peak
    assert prefill.step_time_s == prefill.time_to_first_token_s and prefill.tokens_per_s == pytest.approx(2048 / prefill.step_time_s)


def test_quantized_weights_shrink_memory_and_the_decode_step():
    bf16 = simulate_inference(M, _decode(1, 2048), Layout(), H100)
    int4 = simulate_inference(M, _decode(1, 2048, weight_dtype="int4"), Layout(), H100)
    assert int4.memory.params_bytes < 0.35 * bf16.memory.params_bytes
    assert int4.time_per_output_token_s < 0.5 * bf16.time_per_output_token_s


def test_replicas_multiply_throughput_and_pipelines_add_stages_in_series():
    one = simulate_inference(M, _decode(8, 2048), Layout(tp=4), H100)
    two = simulate_inference(M, _decode(8, 2048), Layout(dp=2, tp=4), H100)
    assert two.time_per_output_token_s == pytest.approx(one.time_per_output_token_s)
    assert two.tokens_per_s == pytest.approx(2 * one.tokens_per_s)
    assert micro_batches(_decode(6, 2048), Layout(pp=4)) == 3  # the largest divisor of 6 not above 4 stages
    piped = simulate_inference(M, _decode(1, 2048), Layout(pp=4), H100)
    assert piped.time_per_output_token_s > simulate_inference(M, _decode(1, 2048), Layout(), H100).time_per_output_token_s


def test_unservable_layouts_are_refused_in_one_line():
    with pytest.raises(UnsupportedError, match="tensor, pipeline and data"):
        simulate_inference(M, _decode(2, 2048), Layout(cp=2), H100)
