"""Tests `validate/one_f_one_b.py`: the interleaved 1F1B schedule computes the single-device loss and gradients."""

import json

import pytest

from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import Dtype
from planner.api import layout_plan
from tests.validate.test_gpipe import _RUN, LLAMA
from validate.emulated import run_emulated
from validate.one_f_one_b import runs_one_f_one_b

# Layer norms, biases, learned positions and a tied table: the layer's vjp holds its weights in another order.
# No QKV biases: the key bias's gradient is zero (softmax ignores a shift), so its relative error is noise.
GPT = ModelConfig(name="tiny-gpt-8", hidden_size=64, num_layers=8, num_heads=4, ffn_size=128, vocab_size=256, norm="layernorm",
                  mlp="gelu", positions="learned", tie_embeddings=True, out_bias=True, mlp_bias=True, max_position_embeddings=64)


@pytest.mark.parametrize("model, layout", [
    pytest.param(LLAMA, Layout(pp=2, dp=2, micro_batch=1, interleave=2, schedule="interleaved"), marks=pytest.mark.slow),
    (GPT, Layout(pp=4, micro_batch=2, interleave=2, schedule="interleaved", recompute="full")),
], ids=["pp2-dp2-v2", "gpt-pp4-v2-full"])
def test_one_f_one_b_step_matches_the_single_device_loss_and_gradients(model, layout):
    plan = layout_plan(model, layout, hardware="a100-80gb", seq_len=16, global_batch=8)
    plan = plan.model_copy(update={"train": plan.train.model_copy(update={"compute_dtype": Dtype("float32")})})
    assert runs_one_f_one_b(plan)
    out = json.loads(run_emulated(_RUN, 4, stdin=plan.model_dump_json(), timeout_s=300, failure="the step failed", fix="-"))
    assert out["loss"] == pytest.approx(out["reference"], rel=1e-5)
    assert out["grad_error"] < 1e-4  # relative to each gradient's largest entry


def test_only_gpipe_plans_keep_the_gpipe_program():
    def one_f_one_b(layout: Layout) -> bool:
        return runs_one_f_one_b(layout_plan(LLAMA, layout, hardware="a100-80gb", seq_len=16, global_batch=8))

    assert not one_f_one_b(Layout(pp=2, micro_batch=1, schedule="gpipe"))
    assert not one_f_one_b(Layout(pp=2, micro_batch=1, schedule="gpipe", interleave=2))
    assert one_f_one_b(Layout(pp=2, micro_batch=1)) and one_f_one_b(Layout(pp=2, micro_batch=1, schedule="interleaved", interleave=2))
