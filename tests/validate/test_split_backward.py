"""Tests `validate/split_backward.py`: the split-backward 1F1B computes the single-device loss and gradients, and keeps
S micro-batches in flight: its compiled temporaries stop growing once the ring is full."""

import json

import pytest

from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import Dtype
from costmodel.step.activations import activation_bytes_per_layer
from planner.api import layout_plan
from tests.validate.test_gpipe import _RUN, LLAMA
from tests.validate.test_one_f_one_b import GPT
from validate.compile_check import compile_in_subprocess
from validate.emulated import run_emulated
from validate.split_backward import accumulates_over_data_locally, branch_shares, runs_split_backward

LLAMA_6 = LLAMA.model_copy(update={"name": "tiny-llama-6", "num_layers": 6})


@pytest.mark.parametrize("model, layout", [
    (LLAMA, Layout(pp=4, micro_batch=1)),
    # 3 layers a stage (the forward of one, an idle step); ZeRO 1: each replica's sums reduced after the loop.
    (GPT.model_copy(update={"num_layers": 6}), Layout(pp=2, dp=2, micro_batch=1, zero_stage=1)),
    pytest.param(LLAMA, Layout(pp=2, tp=2, micro_batch=2, recompute="selective"), marks=pytest.mark.slow),
    pytest.param(LLAMA, Layout(pp=2, dp=2, micro_batch=1, recompute="full"), marks=pytest.mark.slow),
    pytest.param(LLAMA, Layout(pp=2, dp=2, micro_batch=1, zero_stage=2), marks=pytest.mark.slow),  # XLA's reductions
    pytest.param(LLAMA, Layout(pp=2, dp=2, tp=2, micro_batch=1, zero_stage=1), marks=pytest.mark.slow),
    pytest.param(LLAMA_6, Layout(pp=2, micro_batch=1, stage_layers=(2, 4)), marks=pytest.mark.slow),
], ids=["pp4", "gpt-pp2-dp2-odd-zero1", "pp2-tp2-selective", "pp2-dp2-full", "pp2-dp2-zero2", "pp2-dp2-tp2-zero1", "uneven"])
def test_split_backward_step_matches_the_single_device_loss_and_gradients(model, layout):
    plan = layout_plan(model, layout, hardware="a100-80gb", seq_len=16, global_batch=8)
    plan = plan.model_copy(update={"train": plan.train.model_copy(update={"compute_dtype": Dtype("float32")})})
    assert runs_split_backward(plan)
    # Summed per replica under ZeRO 0, and ZeRO 1 without tensor axes.
    assert accumulates_over_data_locally(plan) == (layout.dp > 1 and (layout.zero_stage == 0 or layout.zero_stage == 1 and layout.tp == 1))
    out = json.loads(run_emulated(_RUN, layout.n_devices, stdin=plan.model_dump_json(), timeout_s=300, failure="the step failed",
                                  fix="-"))
    assert out["loss"] == pytest.approx(out["reference"], rel=1e-5)
    assert out["grad_error"] < 1e-4  # relative to each gradient's largest entry


def test_interleaved_and_gpipe_plans_run_other_programs():
    def split(layout: Layout) -> bool:
        return runs_split_backward(layout_plan(LLAMA, layout, hardware="a100-80gb", seq_len=16, global_batch=8))

    assert split(Layout(pp=2, micro_batch=1)) and not split(Layout(pp=2, micro_batch=1, schedule="gpipe"))
    assert not split(Layout(pp=2, micro_batch=1, schedule="interleaved", interleave=2)) and not split(Layout(dp=2, micro_batch=1))


def test_branch_shares_count_each_layer_forward_and_backward_once_a_micro_batch():
    plan = layout_plan(LLAMA_6, Layout(pp=2, micro_batch=1), hardware="a100-80gb", seq_len=16, global_batch=8)
    two, one, backward, idle = branch_shares(plan)
    steps = 3 * (8 + 2 - 1) * 2  # slots × ⌈3/2⌉ steps
    assert (2 * two + one) * steps == pytest.approx(8 * 3) and backward * steps == pytest.approx(8 * 3)
    assert idle > 0 and two + one + backward + idle == pytest.approx(1.0)


# Large enough that the layers' residuals, not fixed buffers, set the temporaries.
MID = ModelConfig(name="mid-llama-8", hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, ffn_size=1536, vocab_size=1024)


def test_temporaries_grow_until_s_micro_batches_are_in_flight_then_stay_flat():
    def plan(global_batch: int):
        return layout_plan(MID, Layout(pp=4, micro_batch=1), hardware="a100-80gb", seq_len=512, global_batch=global_batch)

    temp_bytes = {m: compile_in_subprocess(plan(m), timeout_s=300).temp_bytes for m in (2, 4, 32)}
    stage_residuals = 2 * activation_bytes_per_layer(MID, plan(4).train, plan(4).layout)  # one micro-batch's, 2 layers a stage
    act_bytes = 512 * 512 * 2  # one micro-batch's bf16 activation
    # Two more micro-batches fill the ring of S = 4 (the 2S − 1 lockstep program kept 7).
    assert temp_bytes[4] - temp_bytes[2] > 1.8 * stage_residuals
    # 28 more add only their embedded input and stage 0's input gradient (a few activations each), no residuals
    # (with 2S − 1 in flight, three more micro-batches of residuals would come on top: 50 MB).
    assert temp_bytes[32] - temp_bytes[4] < 28 * 4 * act_bytes
