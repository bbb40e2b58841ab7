"""Tests `validate/predict.py` against XLA for the fp32 and fp8 precisions of the reference program."""

import pytest

from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from planner.api import layout_plan
from validate.compile_check import compile_in_subprocess
from validate.report import checks

# Large enough that the step's activations and parameters, not fixed buffers, set the peak.
LLAMA = ModelConfig(name="mid-llama", hidden_size=1024, num_layers=4, num_heads=16, num_kv_heads=4, ffn_size=3584, vocab_size=32000)


@pytest.mark.parametrize("precision", ["fp32", "fp8"])
def test_every_check_of_a_small_plan_is_predicted_and_within_tolerance(precision):
    plan = layout_plan(LLAMA, Layout(dp=2, tp=4, micro_batch=2), hardware="h100-sxm", seq_len=1024, global_batch=8,
                       precision=precision)
    assert plan.train.precision.value == precision
    results = {(c.item, c.axis): c for c in checks(plan, compile_in_subprocess(plan))}
    assert {("memory arguments", None), ("memory per device", None), ("flops", None), ("all-reduce bytes", "data"),
            ("all-reduce bytes", "tensor")} <= set(results)
    assert all(c.ok for c in results.values()), {k: (c.predicted, c.actual) for k, c in results.items() if not c.ok}


@pytest.mark.parametrize("layout", [
    Layout(pp=2, tp=2, micro_batch=1),
    Layout(pp=2, dp=2, micro_batch=1, zero_stage=1),
    Layout(pp=2, tp=2, micro_batch=1, interleave=2, schedule="interleaved"),
], ids=["split-backward", "split-backward-summed-per-replica", "interleaved"])
def test_the_one_f_one_b_programs_are_predicted_slot_by_slot_and_tick_by_tick(layout):
    # Split backward: each slot one operation a stage (idle ones do nothing) and two permutes, the head once a period.
    # Interleaved: every tick runs a forward, a backward and the head (bubbles included) and permutes both ways.
    plan = layout_plan(LLAMA, layout, hardware="h100-sxm", seq_len=1024, global_batch=4)
    assert plan.layout.schedule.value != "gpipe"
    results = {(c.item, c.axis): c for c in checks(plan, compile_in_subprocess(plan))}
    # At this size fixed buffers, not activations, set the compiled peak: the suite checks memory at full size.
    compared = {k: c for k, c in results.items() if k != ("memory per device", None)}
    reduced = ("all-reduce bytes", "data") if layout.dp > 1 else ("all-reduce bytes", "tensor")
    assert {("flops", None), ("collective-permute bytes", "pipeline"), ("all-reduce bytes", "pipeline"), reduced} <= set(compared)
    assert all(c.ok for c in compared.values()), {k: (c.predicted, c.actual) for k, c in compared.items() if not c.ok}


def test_a_plan_offloading_its_activations_is_predicted_as_lowered_with_them_on_the_device():
    from validate.predict import predicted_memory_bytes
    from validate.report import offload_not_checked

    kept = layout_plan("llama3-8b", Layout(dp=8, micro_batch=2, zero_stage=3), hardware="h100-sxm", global_batch=16, seq_len=4096)
    offloaded = layout_plan("llama3-8b", Layout(dp=8, micro_batch=2, zero_stage=3, offload_activations=True), hardware="h100-sxm",
                            global_batch=16, seq_len=4096)
    assert offloaded.predicted.memory.total_bytes < kept.predicted.memory.total_bytes
    assert predicted_memory_bytes(offloaded, platform="cpu") == predicted_memory_bytes(kept, platform="cpu")
    assert "memory per device is checked" in offload_not_checked(offloaded)
