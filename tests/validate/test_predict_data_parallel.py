"""Tests `validate/predict_data_parallel.py`: the data-axis collectives predicted for a plan's program."""

import pytest

from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from planner.api import layout_plan
from validate.compile_check import compile_in_subprocess
from validate.predict_data_parallel import data_parallel_collectives
from validate.program_runs import param_shards, program_runs
from validate.report import checks

LLAMA = ModelConfig(name="tiny-llama", hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, ffn_size=512, vocab_size=1024)


def _collectives(zero_stage):
    plan = layout_plan(LLAMA, Layout(dp=4, micro_batch=1, zero_stage=zero_stage), hardware="h100-sxm", seq_len=128, global_batch=8)
    return plan, data_parallel_collectives(plan, program_runs(plan), param_shards(plan), experts_bytes=0)


def test_layer_gradients_are_all_reduced_every_micro_batch_in_the_compute_dtype():
    plan, out = _collectives(0)
    layers = next(c for c in out if c.why.startswith("layer gradients"))
    layer_elements = sum(el for n, (el, _, _) in param_shards(plan).items() if n.startswith("layers/")) / LLAMA.num_layers
    norms = 2 * LLAMA.hidden_size  # two fp32 norm scales per layer
    assert layers.calls == LLAMA.num_layers * 2
    assert layers.bytes_per_call == pytest.approx((layer_elements - norms) * 2 + norms * 4)
    assert {c.kind for c in out} == {"all-reduce"}


@pytest.mark.parametrize("zero_stage", [1, 3])
def test_zero_gathers_the_updated_parameters_and_zero3_the_layer_weights(zero_stage):
    _, out = _collectives(zero_stage)
    whys = " | ".join(c.why for c in out if c.kind == "all-gather")
    assert "updated fp32 parameters" in whys
    assert ("forward and again for its backward" in whys) == (zero_stage == 3)


def test_zero3_gathers_tensor_parallel_experts_in_the_dtype_their_region_computes_in():
    # On the CPU backend the experts' tensor-parallel region computes in fp32, so it gathers its weights as stored.
    moe = ModelConfig(name="tiny-moe", hidden_size=512, num_layers=2, num_heads=8, num_kv_heads=4, ffn_size=1024, vocab_size=4096,
                      num_experts=4, experts_per_token=2, mlp="swiglu")
    plan = layout_plan(moe, Layout(dp=2, tp=4, micro_batch=1, zero_stage=3, recompute="full", sequence_parallel=True),
                       mesh="data=2,tensor=4", seq_len=512, global_batch=4)
    gather = next(c for c in checks(plan, compile_in_subprocess(plan)) if c.item == "all-gather bytes" and c.axis == "data")
    assert gather.ok, (gather.predicted, gather.actual)


@pytest.mark.parametrize("zero_stage", [0, 1, 2])
def test_gradients_formed_per_replica_beside_tensor_axes_are_reduced_as_zero_needs(zero_stage):
    # Each replica's gradient formed on its own devices: over the data axes only ZeRO's reductions (after
    # the loop, or every micro-batch under ZeRO 2) and the updated weights' gather, all as predicted;
    # under sequence parallelism each row-parallel output's gradient gathered once over the tensor axes.
    # KV heads the tensor axes divide: fewer are replicated, and XLA reshards them beyond what `validate.predict` counts.
    model = LLAMA.model_copy(update={"num_kv_heads": 4})
    plan = layout_plan(model, Layout(dp=2, tp=4, micro_batch=1, zero_stage=zero_stage, sequence_parallel=True), mesh="data=2,tensor=4",
                       hardware="h100-sxm", seq_len=128, global_batch=4)
    found = [c for c in checks(plan, compile_in_subprocess(plan)) if c.item.endswith("bytes")]
    assert all(c.ok for c in found), [(c.item, c.axis, c.predicted, c.actual) for c in found if not c.ok]
    over_data = {c.item.split(" bytes")[0]: c.actual for c in found if c.axis == "data"}
    assert over_data.get("all-reduce", 0) == (over_data["all-reduce"] if zero_stage == 0 else 4)  # ZeRO ≥ 1: only the loss
    assert ("reduce-scatter" in over_data) == (zero_stage >= 1)
    assert any(c.item.startswith("all-gather") and c.axis == "tensor" for c in found)
