"""Tests `validate/report.py` (and `validate/predict.py` against XLA): predicted vs compiled, item by item."""

import pytest

from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from planner.api import layout_plan
from validate.compile_check import compile_in_subprocess
from validate.report import Check, checks, predicted_argument_bytes

LLAMA = ModelConfig(name="tiny-llama", hidden_size=128, num_layers=4, num_heads=8, num_kv_heads=4, ffn_size=256, vocab_size=512)
GPT = ModelConfig(name="tiny-gpt", hidden_size=128, num_layers=2, num_heads=4, ffn_size=512, vocab_size=500, norm="layernorm",
                  mlp="gelu", positions="learned", tie_embeddings=True, qkv_bias=True, out_bias=True, mlp_bias=True,
                  max_position_embeddings=64)
MOE = ModelConfig(name="small-moe", hidden_size=512, num_layers=2, num_heads=8, num_kv_heads=4, ffn_size=1024, vocab_size=4096,
                  num_experts=4, experts_per_token=2, norm="rmsnorm", mlp="swiglu")  # as Mixtral


@pytest.mark.parametrize("model, layout", [
    (LLAMA, Layout(dp=2, tp=4, micro_batch=2, zero_stage=1, recompute="full")),
    (LLAMA, Layout(dp=4, tp=2, micro_batch=1, recompute="selective")),
    # Unpadded, vocabulary 500 is not split 4 ways: the head runs whole (padded to 512 it would split).
    (GPT.model_copy(update={"vocab_multiple": 1}), Layout(dp=2, tp=4, micro_batch=4)),
    (LLAMA, Layout(pp=2, dp=2, tp=2, micro_batch=2)),
    (LLAMA, Layout(pp=2, dp=2, tp=2, micro_batch=1, recompute="full")),
    # Every pipeline group runs the tied table's lookup and head whole. With GPT-2's 50257 rows, which ZeRO's 4 data
    # shards split by width, XLA exchanges the lookup's gradient rows in fp32; padded to 50304 rows, which it splits
    # by row, XLA gathers them in bf16, as for a table of a few thousand rows.
    (GPT.model_copy(update={"vocab_size": 50257, "vocab_multiple": 1}), Layout(pp=2, dp=4, micro_batch=1, zero_stage=1)),
    (GPT.model_copy(update={"vocab_size": 50257}), Layout(pp=2, dp=4, micro_batch=1, zero_stage=1)),
], ids=["llama-zero1-full", "llama-selective", "gpt-tied-unsplit-vocab", "llama-pipeline", "llama-pipeline-full",
        "gpt-tied-pipeline-zero1-unpadded", "gpt-tied-pipeline-zero1-padded"])
def test_collectives_flops_and_arguments_match_the_compiled_module(model, layout):
    plan = layout_plan(model, layout, hardware="a100-80gb", seq_len=64, global_batch=16)
    results = {(c.item, c.axis): c for c in checks(plan, compile_in_subprocess(plan))}
    exact = {k: c for k, c in results.items() if k[0] != "memory per device"}
    assert all(c.ok for c in exact.values()), {k: (c.predicted, c.actual) for k, c in exact.items() if not c.ok}
    assert ("all-reduce bytes", "data") in results and (layout.tp == 1 or ("all-reduce bytes", "tensor") in results)
    assert layout.pp == 1 or results[("collective-permute bytes", "pipeline")].ok


@pytest.mark.parametrize("zero, kinds", [
    (0, {"all-reduce"}), (1, {"reduce-scatter", "all-gather"}), (2, {"reduce-scatter", "all-gather"}),
    (3, {"reduce-scatter", "all-gather"}),
])
def test_the_data_parallel_region_reduces_as_each_zero_stage_needs(zero, kinds):
    # `validate.data_parallel_region`, a tied table with learned positions: every collective, the FLOPs and the arguments
    # predicted (memory per device is not: at this size fixed buffers dominate it).
    plan = layout_plan(GPT, Layout(dp=8, micro_batch=1, zero_stage=zero), hardware="a100-80gb", seq_len=64, global_batch=16)
    results = {(c.item, c.axis): c for c in checks(plan, compile_in_subprocess(plan)) if c.item != "memory per device"}
    assert all(c.ok for c in results.values()), {k: (c.predicted, c.actual) for k, c in results.items() if not c.ok}
    moved = {item.removesuffix(" bytes") for (item, _), c in results.items() if item.endswith("bytes") and c.actual > 4}
    assert moved == kinds


@pytest.mark.parametrize("layout", [
    # The experts run in a region manual over the tensor axes (`validate.mesh_hooks.expert_region`).
    Layout(dp=2, tp=4, micro_batch=2, sequence_parallel=True),
    Layout(dp=2, tp=4, micro_batch=2, recompute="full"),
    Layout(dp=4, micro_batch=2, zero_stage=3),
    # Expert parallelism: the region is manual over the data axes too; all-to-alls over the expert axis.
    Layout(dp=4, ep=4, micro_batch=2, zero_stage=1),
    Layout(dp=4, ep=2, tp=2, micro_batch=2, zero_stage=3, sequence_parallel=True),
    Layout(dp=4, ep=2, micro_batch=2, recompute="full"),
], ids=["tensor-parallel-sp", "tensor-parallel-full-recompute", "zero3", "expert-zero1", "expert-tensor-zero3", "expert-full-recompute"])
def test_moe_collectives_and_flops_match_the_compiled_module(layout):
    # 512 tokens: at 64, XLA exchanged the 4096-row table's gradient rows and split small matmuls differently.
    plan = layout_plan(MOE, layout, hardware="h100-sxm", seq_len=512, global_batch=16)
    exact = [c for c in checks(plan, compile_in_subprocess(plan)) if c.item != "memory per device"]
    assert all(c.ok for c in exact), {(c.item, c.axis): (c.predicted, c.actual) for c in exact if not c.ok}
    assert layout.ep == 1 or any(c.item == "all-to-all bytes" and c.axis == "expert" and c.actual > 0 for c in exact)


def test_a_pipeline_with_zero3_and_tensor_parallelism_reports_what_xla_made_without_predicting_it():
    plan = layout_plan(LLAMA, Layout(pp=2, dp=2, tp=2, micro_batch=1, zero_stage=3), hardware="a100-80gb", seq_len=64, global_batch=16)
    results = {(c.item, c.axis): c for c in checks(plan, compile_in_subprocess(plan))}
    assert results[("memory arguments", None)].ok and results[("flops", None)].ok is None
    assert all(c.predicted is None and c.actual > 0 for (item, _), c in results.items() if item.endswith("bytes"))


def test_a_check_without_prediction_is_not_a_failure():
    unknown = Check(item="all-to-all bytes", axis="data", predicted=None, actual=5.0, tolerance=0.05)
    assert unknown.ok is None and unknown.ratio is None
    assert Check(item="x", predicted=100.0, actual=104.0, tolerance=0.05).ok
    assert not Check(item="x", predicted=0.0, actual=1.0, tolerance=0.05).ok


def test_zero_one_shards_the_moments_over_data():
    zero0 = layout_plan(LLAMA, Layout(dp=2, tp=4, micro_batch=2), hardware="a100-80gb", seq_len=64, global_batch=16)
    zero1 = zero0.model_copy(update={"layout": zero0.layout.model_copy(update={"zero_stage": 1})})
    assert predicted_argument_bytes(zero1) < predicted_argument_bytes(zero0)


def test_a_pipeline_holds_its_bubble_ticks_activations_and_with_one_micro_batch_a_ticks_gradient():
    from costmodel.hardware.machine import load_machine
    from costmodel.inputs.layout import Schedule
    from costmodel.step.data_parallel import stage_params_per_device
    from costmodel.step.memory import activation_bytes_per_layer, micro_batch_gradient_bytes
    from costmodel.step.simulator import simulate
    from validate.predict import ends_elsewhere_bytes, predicted_memory_bytes

    plan = layout_plan(LLAMA, Layout(pp=2, dp=2, tp=2, micro_batch=8, schedule=Schedule.GPIPE), hardware="a100-80gb",
                       seq_len=64, global_batch=16)
    simulated = simulate(plan.model, plan.train, plan.layout, load_machine("a100-80gb")).memory
    tick_gradient = micro_batch_gradient_bytes(stage_params_per_device(LLAMA, plan.layout), LLAMA, plan.train, plan.layout)
    assert tick_gradient == stage_params_per_device(LLAMA, plan.layout) * 4  # fp32, whole: the tick loop sums it unsplit
    bubble_ticks = (plan.layout.pp - 1) * (LLAMA.num_layers // 2) * activation_bytes_per_layer(LLAMA, plan.train, plan.layout)
    # Every stage also holds the embedding (the busiest, last stage's own end is the head).
    assert simulated.stage == "last" and ends_elsewhere_bytes(plan, simulated) > 0
    assert predicted_memory_bytes(plan) == pytest.approx(simulated.total_bytes + tick_gradient + bubble_ticks
                                                         + ends_elsewhere_bytes(plan, simulated))


def test_fp8_frozen_lora_plans_say_their_emulated_memory_peak_is_not_checked():
    from validate.report import fp8_frozen_not_checked

    lora = {"workload": "finetune-lora", "lora": {"frozen_dtype": "fp8"}, "precision": "fp8", "global_batch": 8, "seq_len": 64}
    p = layout_plan(LLAMA, Layout(dp=2, micro_batch=1), **lora)
    assert "memory per device is not checked" in fp8_frozen_not_checked(p)
    assert fp8_frozen_not_checked(p, platform="gpu") is None
    assert fp8_frozen_not_checked(layout_plan(LLAMA, Layout(dp=2, micro_batch=1), **{**lora, "lora": None})) is None


def test_nf4_plans_are_refused_in_one_line_not_checked_as_int4():
    from costmodel.errors import UnsupportedError
    from validate.report import refuse_unlowered_weights

    lora = {"workload": "finetune-lora", "global_batch": 8, "seq_len": 64}
    with pytest.raises(UnsupportedError, match="nf4 frozen weights .* not lowered"):
        refuse_unlowered_weights(layout_plan(LLAMA, Layout(dp=2, micro_batch=1), **lora, lora={"frozen_dtype": "nf4"}))
    refuse_unlowered_weights(layout_plan(LLAMA, Layout(dp=2, micro_batch=1), **lora, lora={"frozen_dtype": "int4"}))


def test_a_plan_with_a_sliding_window_shorter_than_its_sequences_is_refused_with_the_reason():
    from costmodel.errors import UnsupportedError
    from validate.report import refuse_unlowered_attention

    windowed = LLAMA.model_copy(update={"sliding_window": 64})
    with pytest.raises(UnsupportedError, match=r"sliding-window attention \(64 of 128 tokens\) is not lowered.*--seq-len 64"):
        refuse_unlowered_attention(layout_plan(windowed, Layout(dp=2, micro_batch=1), hardware="a100-80gb", seq_len=128, global_batch=2))
    refuse_unlowered_attention(layout_plan(windowed, Layout(dp=2, micro_batch=1), hardware="a100-80gb", seq_len=64, global_batch=2))


def test_the_fine_tuning_optimizer_options_are_refused_not_compared():
    from costmodel.errors import UnsupportedError
    from costmodel.inputs.train_config import OptimizerState
    from validate.report import refuse_optimizer_options
    plan = layout_plan(LLAMA, Layout(micro_batch=2), hardware="a100-80gb", seq_len=64, global_batch=2)
    refuse_optimizer_options(plan)
    odd = plan.model_copy(update={"train": plan.train.with_optimizer_state(OptimizerState.INT8)})
    with pytest.raises(UnsupportedError, match="not lowered by the reference program"):
        refuse_optimizer_options(odd)
    # The step in backward is lowered (`planner.programs.fused_step`), with either state, any ZeRO stage.
    for state in (OptimizerState.FP32, OptimizerState.BF16):
        refuse_optimizer_options(plan.model_copy(update={"train": plan.train.with_optimizer_state(state, in_backward=True)}))
    # Pure bf16 is lowered; its memory is checked with ZeRO 3 only (the CPU backend reduces bf16 gradients in fp32).
    pure = plan.train.with_optimizer_state(OptimizerState.BF16)
    with pytest.raises(UnsupportedError, match="checked with ZeRO 3 only"):
        refuse_optimizer_options(plan.model_copy(update={"train": pure}))
    sharded = layout_plan(LLAMA, Layout(dp=2, micro_batch=1, zero_stage=3), hardware="a100-80gb", seq_len=64, global_batch=2)
    refuse_optimizer_options(sharded.model_copy(update={"train": pure}))
    lora = layout_plan(LLAMA, Layout(micro_batch=2), hardware="a100-80gb", seq_len=64, global_batch=2, workload="finetune-lora")
    for state, in_bwd in ((OptimizerState.BF16, False), (OptimizerState.FP32, True)):
        with pytest.raises(UnsupportedError, match="not lowered by the reference program"):
            refuse_optimizer_options(lora.model_copy(update={"train": lora.train.with_optimizer_state(state, in_backward=in_bwd)}))


def test_tensor_axes_compiled_with_collective_matmul_on_a_gpu_are_reported_not_predicted():
    plan = layout_plan(LLAMA, Layout(dp=2, tp=4, micro_batch=2, sequence_parallel=True), hardware="a100-80gb", seq_len=64,
                       global_batch=16)
    report = compile_in_subprocess(plan)
    tensor = set(plan.axes_of("tp"))
    on_gpu = {(c.item, c.axis): c for c in checks(plan, report.model_copy(update={"platform": "gpu"}))}
    on_cpu = {(c.item, c.axis): c for c in checks(plan, report)}
    collective_rows = [key for key in on_cpu if key[0].endswith("bytes") and key[0] != "memory arguments"]
    assert any(set(axis.split("+")) & tensor for _, axis in collective_rows)
    for item, axis in collective_rows:
        windowed = bool(set(axis.split("+")) & tensor)
        assert (on_gpu[item, axis].predicted is None) == windowed and on_cpu[item, axis].predicted is not None
