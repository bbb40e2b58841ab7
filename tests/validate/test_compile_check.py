"""Tests `validate/compile_check.py`: a plan compiles on emulated devices and reports what XLA made of it."""

import pytest

from costmodel.errors import InvalidPlanError
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from planner.api import layout_plan
from validate.compile_check import compile_in_subprocess

TINY = ModelConfig(name="tiny", hidden_size=128, num_layers=4, num_heads=8, num_kv_heads=4, ffn_size=256, vocab_size=512)


@pytest.fixture(scope="module")
def tp_plan():
    return layout_plan(TINY, Layout(dp=2, tp=4, micro_batch=2, zero_stage=1), mesh="data=2,tensor=4", hardware="a100-80gb",
                       seq_len=64, global_batch=16)


@pytest.fixture(scope="module")
def tp_report(tp_plan):
    return compile_in_subprocess(tp_plan)


def test_the_report_reads_memory_flops_and_collectives(tp_report):
    assert tp_report.n_devices == 8 and tp_report.compile_time_s > 0 and tp_report.peak_rss_bytes > 0
    assert tp_report.alias_bytes > 0  # parameters and optimizer state are donated
    # The layer loop runs 4 times per micro-batch, 16 / (2 × 2) = 4 micro-batches: its dots count 16 times,
    # which cost_analysis() does not do.
    assert tp_report.matmul_flops > 4 * tp_report.flops_as_reported / 16
    kinds = {(c.kind, c.axes) for c in tp_report.collectives}
    assert ("all-reduce", ("tensor",)) in kinds and ("all-reduce", ("data",)) in kinds and ("all-gather", ("data",)) in kinds
    assert max(c.calls for c in tp_report.collectives) == 4 * 4


@pytest.mark.parametrize("spec, message", [
    (("nope", None, None, None), r'param_specs\["layers/attn/wq"\] = \(\'nope\', None, None, None\): the mesh has no axis \'nope\''),
    ((None, None, "tensor"), r"3 entries for a 4-dimensional parameter"),
    ((None, "tensor", "tensor", None), r"axis 'tensor' splits two dimensions"),
    ((("data", "tensor"), None, None, None), r"a dimension of size 4 cannot be split 8 ways"),
])
def test_a_hand_broken_spec_names_the_parameter_and_spec(tp_plan, spec, message):
    broken = tp_plan.model_copy(update={"param_specs": {**tp_plan.param_specs, "layers/attn/wq": spec}})
    with pytest.raises(InvalidPlanError, match=message):
        compile_in_subprocess(broken)


def test_a_pipeline_plan_compiles_with_stage_to_stage_sends():
    plan = layout_plan(TINY, Layout(pp=2, dp=2, tp=2, micro_batch=2), hardware="a100-80gb", seq_len=64, global_batch=16)
    report = compile_in_subprocess(plan)
    sends = [c for c in report.collectives if c.kind == "collective-permute" and c.axes == ("pipeline",)]
    assert sends and all(c.calls >= plan.layout.micro_batches(plan.train) for c in sends)
