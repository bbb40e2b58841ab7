"""Tests `validate/program_runs.py`: how often a plan's program runs its parts, and its parameter shards."""

import pytest

from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from planner.api import layout_plan
from validate.program_runs import param_shards, pipeline_ticks, program_runs

LLAMA = ModelConfig(name="tiny-llama", hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, ffn_size=512, vocab_size=1024)


def test_without_a_pipeline_every_layer_runs_once_per_micro_batch():
    plan = layout_plan(LLAMA, Layout(dp=2, tp=2, micro_batch=1), hardware="h100-sxm", seq_len=128, global_batch=8)
    runs = program_runs(plan)
    assert (runs.layer_runs, runs.layers_held, runs.outer_calls, runs.head_gradients) == (4 * 4, 4, 4, 4)


@pytest.mark.parametrize("schedule, interleave", [("gpipe", 1), ("interleaved", 2)])
def test_a_pipeline_runs_its_stage_on_every_tick_bubbles_included(schedule, interleave):
    plan = layout_plan(LLAMA, Layout(pp=2, micro_batch=1, schedule=schedule, interleave=interleave), hardware="h100-sxm", seq_len=128,
                       global_batch=4)
    runs, ticks = program_runs(plan), pipeline_ticks(plan)
    assert ticks > 4 * interleave + 2 - 2  # more ticks than work items: the fill (and, 1F1B, the drain) run too
    assert (runs.layer_runs, runs.layers_held, runs.outer_calls, runs.outer_micro_batches) == (2 // interleave * ticks, 2, 1, 4)
    assert runs.head_calls == (ticks if schedule == "interleaved" else 1)


def test_the_split_backward_pipeline_runs_each_layer_once_a_micro_batch_and_the_head_once_a_period():
    plan = layout_plan(LLAMA, Layout(pp=2, micro_batch=1), hardware="h100-sxm", seq_len=128, global_batch=4)
    runs = program_runs(plan)
    assert (runs.layer_runs, runs.head_calls, runs.head_gradients) == (2 * 4, 4 + 2 - 1, 4 + 2 - 1)
    assert pipeline_ticks(plan) == 3 * (4 + 2 - 1)  # slots, each ending with its hand-offs


def test_param_shards_divide_each_parameter_by_the_axes_its_spec_names():
    plan = layout_plan(LLAMA, Layout(tp=4), hardware="h100-sxm", seq_len=128, global_batch=4)
    elements, spec, shape = param_shards(plan)["layers/mlp/w_in"]
    split = 4 if any(spec) else 1
    assert elements * split == pytest.approx(shape[0] * shape[1] * shape[2])
