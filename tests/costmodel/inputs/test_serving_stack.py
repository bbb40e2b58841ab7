"""Tests `costmodel/inputs/serving_stack.py`: who dispatches a serving step's operators, and what that costs."""

import pytest

from costmodel.hardware.machine import load_machine
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.serving_stack import HF_EAGER_OPS_PER_LAYER, HF_EAGER_OPS_PER_STEP, SERVING_STACKS, get_serving_stack
from costmodel.inputs.train_config import TrainConfig
from costmodel.inputs.workload import InferenceConfig
from costmodel.step.inference import iteration_s, simulate_inference
from costmodel.step.kernels import KernelKind

MODEL = ModelConfig(name="m", hidden_size=2048, num_layers=16, num_heads=16, num_kv_heads=16, ffn_size=5632, vocab_size=32000)


def _decode(stack: str, batch: int = 1, **settings: float) -> TrainConfig:
    return TrainConfig(workload="decode", global_batch=batch, seq_len=1024,
                       inference=InferenceConfig(serving_stack=stack, **settings))


def test_only_the_eager_stack_dispatches_operators_from_the_host():
    assert [name for name, s in SERVING_STACKS.items() if s.host_ops(num_layers=32)] == ["hf-eager"]
    eager = get_serving_stack("hf-eager")
    assert eager.host_ops(num_layers=16) == 16 * HF_EAGER_OPS_PER_LAYER + HF_EAGER_OPS_PER_STEP
    with pytest.raises(ValueError, match="unknown serving stack"):
        get_serving_stack("tgi")


def test_an_eager_decode_step_takes_at_least_its_host_dispatch_and_a_compiled_one_its_kernels_alone():
    hw = load_machine("a100-80gb")
    compiled, eager = (simulate_inference(MODEL, _decode(s), Layout(), hw) for s in ("jax", "hf-eager"))
    host_s = get_serving_stack("hf-eager").host_step_s(num_layers=MODEL.num_layers)
    assert compiled.serving.host_ops == 0 and compiled.time_per_output_token_s < host_s
    assert eager.time_per_output_token_s == pytest.approx(host_s) and eager.serving.host_step_s == pytest.approx(host_s)
    # A step whose kernels outlast the dispatch is the kernels' time: host work overlaps them.
    big = simulate_inference(MODEL, _decode("hf-eager", batch=512), Layout(), hw)
    kernels_s = big.serving.decode_compute_s + big.serving.decode_hbm_s
    assert big.time_per_output_token_s > host_s and big.time_per_output_token_s == pytest.approx(kernels_s)


def test_only_a_cache_grown_by_concatenation_is_copied_every_decode_step(monkeypatch):
    """transformers' DynamicCache rewrites each layer's cache every step: twice its bytes beside attention's read."""
    hw = load_machine("a100-80gb")
    assert [s for s in SERVING_STACKS if SERVING_STACKS[s].cache_grown_by_concatenation] == ["hf-eager"]
    eager = simulate_inference(MODEL, _decode("hf-eager", batch=64), Layout(), hw)
    monkeypatch.setitem(SERVING_STACKS, "hf-eager", SERVING_STACKS["hf-eager"].model_copy(update={"cache_grown_by_concatenation": False}))
    in_place = simulate_inference(MODEL, _decode("hf-eager", batch=64), Layout(), hw)
    cache_bytes = 64 * 1024 * 2 * MODEL.num_kv_heads * MODEL.head_dim * 2  # one layer's keys and values, bf16
    extra_s = eager.serving.decode_hbm_s - in_place.serving.decode_hbm_s
    assert extra_s == pytest.approx(MODEL.num_layers * (2 * cache_bytes / (hw.hbm_bytes_per_s * hw.efficiency.hbm_for(KernelKind.MEMORY))
                                                        + 2 * hw.efficiency.kernel_floor_s))


def test_side_kernels_cost_a_launch_floor_each_on_gpus_and_are_itemized():
    """The jax stack's 14 side kernels a layer each pay the GPU's launch floor (TensorRT-LLM's 3 for this multi-head
    model, 5 with grouped-query attention's XQA preparation; torch.compile's not counted); a TPU runs its fusions back
    to back."""
    gpu = simulate_inference(MODEL, _decode("jax"), Layout(), load_machine("h100-sxm"))
    uncounted = simulate_inference(MODEL, _decode("torch-compile"), Layout(), load_machine("h100-sxm"))
    trt = simulate_inference(MODEL, _decode("tensorrt-llm"), Layout(), load_machine("h100-sxm"))
    srv = gpu.serving
    assert srv.side_kernels_per_layer == 14 and uncounted.serving.side_kernels_per_layer == 0
    grouped = MODEL.model_copy(update={"num_kv_heads": 4})
    assert trt.serving.side_kernels_per_layer == 3
    assert simulate_inference(grouped, _decode("tensorrt-llm"), Layout(), load_machine("h100-sxm")).serving.side_kernels_per_layer == 5
    floors_s = 14 * MODEL.num_layers * srv.side_kernel_floor_s
    assert floors_s < srv.decode_side_kernels_s < 1.1 * floors_s  # at batch 1 the floors are nearly all of it
    assert gpu.time_per_output_token_s == pytest.approx(uncounted.time_per_output_token_s + srv.decode_side_kernels_s)
    tpu = simulate_inference(MODEL, _decode("jax"), Layout(), load_machine("tpu-v5p"))
    assert tpu.serving.side_kernels_per_layer == 0 and tpu.serving.decode_side_kernels_s == 0


def test_a_measured_per_operator_cost_replaces_the_fitted_one_also_in_continuous_batching():
    hw, lay = load_machine("a100-80gb"), Layout()
    slow = _decode("hf-eager", host_s_per_op=60e-6)
    ops = get_serving_stack("hf-eager").host_ops(num_layers=MODEL.num_layers)
    assert simulate_inference(MODEL, slow, lay, hw).time_per_output_token_s == pytest.approx(ops * 60e-6)
    assert iteration_s(MODEL, slow, lay, hw, decode_sequences=1, cached_tokens=1024) == pytest.approx(ops * 60e-6)


def test_an_eager_stacks_operator_traffic_is_itemized_apart_from_launched_side_kernels():
    """hf-eager's operators launch from the host dispatch (no floor to count); their HBM traffic is its own term."""
    hw = load_machine("a100-80gb")
    eager, jax = (simulate_inference(MODEL, _decode(s, batch=16), Layout(), hw).serving for s in ("hf-eager", "jax"))
    assert eager.side_kernels_per_layer == 0 and eager.decode_side_kernels_s == 0 and eager.decode_unfused_operators_s > 0
    assert jax.side_kernels_per_layer == 14 and jax.decode_unfused_operators_s == 0


def test_an_eager_continuous_batching_iteration_costs_its_decode_as_the_static_step_does():
    """Materialized attention, unfused operators and the cache's concatenation in both: one decoding sequence per
    cached context and nothing else is `simulate_inference`'s time per output token (kernels past the host dispatch)."""
    hw = load_machine("a100-80gb")
    static = simulate_inference(MODEL, _decode("hf-eager", batch=512), Layout(), hw)
    iteration = iteration_s(MODEL, _decode("hf-eager", batch=512), Layout(), hw, decode_sequences=512, cached_tokens=512 * 1024)
    assert iteration == pytest.approx(static.time_per_output_token_s)


def test_torch_weight_only_stream_rates_are_the_means_of_torchaos_published_ratios():
    import csv
    import statistics
    from pathlib import Path

    from costmodel.inputs.serving_stack import TINYGEMM_GROUP_BYTES, TORCH_INT4_WEIGHT_ONLY_STREAM, TORCH_INT8_WEIGHT_ONLY_STREAM

    rows = list(csv.DictReader((Path(__file__).resolve().parents[3] / "benchmarks" / "data" / "weight_only_kernels.csv").open()))
    bf16 = {(r["hardware"], r["model"]): float(r["memory_bandwidth_gb_per_s"]) for r in rows if r["quantization"] == "bf16"}

    def mean_ratio(quantization: str) -> float:
        return statistics.mean(float(r["memory_bandwidth_gb_per_s"]) / bf16[r["hardware"], r["model"]]
                               for r in rows if r["quantization"] == quantization)

    assert TORCH_INT8_WEIGHT_ONLY_STREAM == pytest.approx(mean_ratio("int8wo"), abs=0.001)
    assert TORCH_INT4_WEIGHT_ONLY_STREAM == pytest.approx(mean_ratio("int4wo-64"), abs=0.001)
    assert {float(r["stored_bytes_per_weight"]) for r in rows if r["quantization"] == "int4wo-64"} == {0.5 + TINYGEMM_GROUP_BYTES / 64}
    compiled = get_serving_stack("torch-compile")
    assert compiled.weight_only_stream == {"int8": TORCH_INT8_WEIGHT_ONLY_STREAM, "int4": TORCH_INT4_WEIGHT_ONLY_STREAM}
    assert all(not s.weight_only_stream and not s.int4_group_bytes for s in SERVING_STACKS.values() if s is not compiled)
