"""Tests `costmodel/step/inference.py`: the KV cache, decode and prefill times, serving memory."""

import pytest

from costmodel.errors import InvalidPlanError, UnsupportedError
from costmodel.hardware.machine import load_machine, train_machine
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.inference import kv_cache_bytes, micro_batches, simulate_inference, tensor_parallel_s
from costmodel.step.kernels import KernelKind

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
    # The weights' stream shrinks; the side kernels' launch floors do not.
    assert (int4.time_per_output_token_s - int4.serving.decode_side_kernels_s
            < 0.5 * (bf16.time_per_output_token_s - bf16.serving.decode_side_kernels_s))


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


MIXTRAL = ModelConfig(name="mixtral", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_size=14336,
                      vocab_size=32000, num_experts=8, experts_per_token=2)


def _h100_for(train):
    return train_machine(load_hardware("h100-sxm"), train)


def test_fp8_weights_halve_the_bytes_read_and_prefill_runs_its_gemms_at_the_fp8_peak():
    bf16, fp8 = _decode(1, 4096), _decode(1, 4096, weight_dtype="fp8")
    d, q, kv, f = 4096, 4096, 1024, 14336
    matrices = 32 * (d * (q + 2 * kv) + q * d + 3 * d * f)  # qkv, out, gated MLP per layer
    est_bf16, est_fp8 = simulate_inference(M, bf16, Layout(), _h100_for(bf16)), simulate_inference(M, fp8, Layout(), _h100_for(fp8))
    assert est_bf16.memory.params_bytes - est_fp8.memory.params_bytes == pytest.approx(matrices)  # 2 bytes -> 1
    floor_gap_s = est_bf16.serving.hbm_lower_bound_s - est_fp8.serving.hbm_lower_bound_s
    assert floor_gap_s == pytest.approx(matrices / H100.hbm_bytes_per_s)
    assert est_fp8.time_per_output_token_s < est_bf16.time_per_output_token_s
    # Prefill of 4096 tokens: the linear GEMMs are compute-bound, so fp8 takes each one's time at
    # twice the peak; the fused per-tensor quantization adds a read (bf16) and a write (fp8) of each input.
    prefill = {w: TrainConfig(workload="prefill", global_batch=1, seq_len=4096, inference={"weight_dtype": w}) for w in ("bf16", "fp8")}
    hw = {w: _h100_for(t) for w, t in prefill.items()}
    assert hw["fp8"].linear_peak == load_hardware("h100-sxm").device.peak_for("float8_e4m3fn")
    n = 4096
    gemms = [(d, q + 2 * kv), (q, d), (d, 2 * f), (f, d)]
    def linear_s(peak):
        return sum(2 * n * i * o / (peak * H100.efficiency.matmul(2 * n * i * o)) for i, o in gemms)
    quant_s = sum(n * i * 3 / (H100.hbm_bytes_per_s * H100.efficiency.hbm) for i, _ in gemms)
    ttft = {w: simulate_inference(M, t, Layout(), hw[w]).time_to_first_token_s for w, t in prefill.items()}
    gain_s = linear_s(hw["bf16"].peak_flops_per_s) - linear_s(hw["fp8"].linear_peak) - quant_s
    assert ttft["bf16"] - ttft["fp8"] == pytest.approx(32 * gain_s, rel=1e-6)


def test_fp8_weights_are_refused_on_a_part_without_an_fp8_peak():
    with pytest.raises(UnsupportedError, match="a100-80gb has no fp8 peak"):
        train_machine(load_hardware("a100-80gb"), _decode(1, 4096, weight_dtype="fp8"))


def test_an_fp8_kv_cache_takes_one_byte_an_element():
    assert kv_cache_bytes(M, _decode(4, 4096, kv_cache_dtype="fp8"), Layout()) * 2 == kv_cache_bytes(M, _decode(4, 4096), Layout())


def _mixtral_layer_params(experts_read, tp=8):
    """One layer's parameters a device of ``tp`` holds: attention, experts and router split, the two norms whole."""
    d, q, kv, f = 4096, 4096, 1024, 14336
    return (d * (q + 2 * kv) + q * d + experts_read * 3 * d * f + d * 8) / tp + 2 * d


@pytest.mark.parametrize("batch, experts_read", [(1, 2), (64, 8 * (1 - 0.75 ** 64))])
def test_mixtral_decode_reads_the_experts_its_tokens_touch(batch, experts_read):
    train = _decode(batch, 4096)
    est = simulate_inference(MIXTRAL, train, Layout(tp=8), H100)
    outer = 2 * 32000 * 4096 / 8 + 4096  # embedding and head split by tp, the final norm whole
    weights_read = 2 * (32 * _mixtral_layer_params(experts_read) + outer)
    cache = 2 * 32 * 1 * 128 * 2 * batch * 4096  # one kv head per device
    assert est.serving.hbm_lower_bound_s == pytest.approx((weights_read + cache) / H100.hbm_bytes_per_s, rel=1e-9)
    assert est.memory.params_bytes == pytest.approx(2 * (32 * _mixtral_layer_params(8) + outer))  # every expert held
    # At the HBM bound, within the GEMMs' streaming efficiency, the launch floors and the tp all-reduces
    # (the side kernels' activations apart).
    kernels = 32 * 7 + 1  # qkv, attention, out, router, two expert GEMMs... per layer, and the head
    srv = est.serving
    assert srv.decode_bound == "hbm" and est.time_per_output_token_s >= srv.hbm_lower_bound_s
    slowest_hbm = min(H100.efficiency.hbm_for(k) for k in KernelKind)
    assert (srv.decode_hbm_s + srv.decode_compute_s - srv.decode_side_kernels_s
            <= srv.hbm_lower_bound_s / slowest_hbm + kernels * H100.efficiency.kernel_floor_s)


def test_mixtral_decode_counts_the_top_k_experts_flops():
    est = simulate_inference(MIXTRAL, _decode(1, 4096), Layout(tp=8), H100)
    # N: the layers less six of eight experts idle per token, and the head (the input embedding is a lookup)
    active = MIXTRAL.num_layers * MIXTRAL.params_per_layer - 32 * 6 * 3 * 4096 * 14336 + 4096 * 32000
    assert est.model_flops == pytest.approx(2 * active + 4 * 32 * 32 * 128 * 4096)  # a decoded token attends its whole cache
    dense_equivalent = simulate_inference(MIXTRAL.model_copy(update={"experts_per_token": 8}), _decode(1, 4096), Layout(tp=8), H100)
    streamed_s = [e.time_per_output_token_s - e.serving.decode_side_kernels_s for e in (est, dense_equivalent)]
    assert streamed_s[0] < 0.5 * streamed_s[1]  # 2 of 8 experts streamed


def test_a_sliding_window_caps_the_decode_kv_cache_and_its_reads_at_the_window():
    full = ModelConfig(name="m", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_size=14336, vocab_size=32000)
    windowed = full.model_copy(update={"sliding_window": 4096})
    decode = TrainConfig(workload="decode", global_batch=8, seq_len=32768)
    assert kv_cache_bytes(windowed, decode, Layout()) == kv_cache_bytes(full, decode, Layout()) / 8
    short = TrainConfig(workload="decode", global_batch=8, seq_len=2048)
    assert kv_cache_bytes(windowed, short, Layout()) == kv_cache_bytes(full, short, Layout())
    hw = load_machine("h100-sxm")
    assert simulate_inference(windowed, decode, Layout(), hw).step_time_s < simulate_inference(full, decode, Layout(), hw).step_time_s


def test_a_2d_weight_stationary_split_shards_the_cache_and_moves_fewer_bytes_in_smaller_groups():
    tpu, train = load_machine("tpu-v5p"), _decode(64, 4096)
    one, two = Layout(tp=32), Layout(tp=32, tp_embed=4)  # heads over 8, the model dimension over 4
    # Each device: one of the 8 kv heads for a quarter of the sequences (1D tp32 keeps a head for every sequence).
    assert kv_cache_bytes(M, train, two) == kv_cache_bytes(M, train, one) / 4
    def comm_s(layout, tokens):
        return tensor_parallel_s(M, train, layout, tpu, tokens=tokens, layers=32, last_stage=False)

    assert all(s > 0 for s in comm_s(two, 64))
    # More, smaller collectives: dearer at one token a step, where latency rules; cheaper where bytes do.
    assert sum(comm_s(two, 1)) > sum(comm_s(one, 1)) and sum(comm_s(two, 512)) < sum(comm_s(one, 512))
    one_est, two_est = (simulate_inference(M, train, lay, tpu) for lay in (one, two))
    assert two_est.breakdown.comm_s_by_axis["tp_embed"] == pytest.approx(two_est.serving.decode_tp_embed_comm_s)
    assert two_est.serving.decode_tp_embed_comm_s > 0
    assert one_est.breakdown.comm_s_by_axis["tp_embed"] == 0
    # The same weights but the K and V projections, which 1D tp32 replicates over each KV head's 4 devices.
    kv_replicas = 2 * M.num_layers * M.hidden_size * M.head_dim * (1 - 8 / 32) * 2
    assert one_est.memory.params_bytes - two_est.memory.params_bytes == pytest.approx(kv_replicas)


@pytest.mark.parametrize("layout, train", [
    (Layout(tp=8, tp_embed=2), TrainConfig(workload="prefill", global_batch=4, seq_len=1024)),  # decode only
    (Layout(tp=32, tp_embed=2), _decode(4, 1024)),  # 16 heads' worth of devices for 8 kv heads
    (Layout(tp=8, tp_embed=8), _decode(4, 1024)),  # 4 sequences cannot split 8 ways
])
def test_a_2d_split_the_model_or_workload_cannot_run_is_refused_in_one_line(layout, train):
    with pytest.raises(InvalidPlanError, match="tp_embed"):
        simulate_inference(M, train, layout, H100)


def test_a_stacks_int4_group_scales_are_held_and_read_with_the_weights():
    from costmodel.step.inference import layer_weight_bytes

    def weights(**inference):
        return layer_weight_bytes(M, _decode(1, 1024, **inference), Layout())

    per_matrix_byte = (weights() - weights(weight_dtype="int4")) / 1.5  # bf16's 2 bytes against int4's 0.5
    g32 = weights(weight_dtype="int4", serving_stack="torch-compile", weight_group_size=32)
    g64 = weights(weight_dtype="int4", serving_stack="torch-compile", weight_group_size=64)
    assert g32 - g64 == pytest.approx(per_matrix_byte * (4 / 32 - 4 / 64))  # a bf16 scale and zero a group
    est = simulate_inference(M, _decode(1, 1024, weight_dtype="int4", serving_stack="torch-compile", weight_group_size=32),
                             Layout(), H100)
    assert est.time_per_output_token_s >= est.serving.hbm_lower_bound_s
