"""Tests `planner/cli/exports.py`: MaxText overrides, logical rules, Markdown."""

import math
import subprocess
import sys
from pathlib import Path

import pytest

from costmodel.inputs.layout import Layout
from planner.api import layout_plan, plan
from planner.cli.exports import flax_logical_rules, markdown_report, to_maxtext


@pytest.fixture(scope="module")
def tp_plan():
    return plan("llama3-8b", mesh="data=4,tensor=8", hardware="h100-sxm", global_batch=64)


def test_maxtext_parallelism_multiplies_to_the_device_count(tp_plan):
    mt = to_maxtext(tp_plan)
    degrees = [v for k, v in mt.items() if k.endswith("_parallelism")]
    assert math.prod(degrees) == tp_plan.layout.n_devices
    assert mt["ici_tensor_parallelism"] == 8 and mt["dcn_data_parallelism"] * mt["dcn_fsdp_parallelism"] == 4
    # MaxText's global batch: per-device batch × devices × accumulation steps
    assert mt["per_device_batch_size"] * 32 * mt.get("gradient_accumulation_steps", 1) == 64


def test_logical_rules_put_heads_and_mlp_on_the_tensor_axis(tp_plan):
    rules = dict(flax_logical_rules(tp_plan))
    assert rules["heads"] == ("tensor",) and rules["mlp"] == ("tensor",) and rules["head_dim"] is None


def test_markdown_names_the_layout_and_the_alternatives(tp_plan):
    text = markdown_report(tp_plan)
    assert text.startswith("# Plan: llama3-8b on 32× h100-sxm") and "| tensor | 8 | tp | nvlink4 |" in text
    assert text.count("\n| dp") == len(tp_plan.alternatives)


def test_maxtext_names_slices_for_dcn_axes_and_keeps_its_own_logical_rules(tp_plan):
    mt = to_maxtext(tp_plan)
    dcn = math.prod(v for k, v in mt.items() if k.startswith("dcn_"))
    assert dcn == 4 and mt["num_slices"] == dcn  # data=4 crosses nodes: MaxText needs a slice per node
    assert "logical_axis_rules" not in mt and not any("axis" in k for k in mt)
    assert mt["remat_policy"] in ("minimal_with_context", "minimal", "save_dot_except_mlpwi", "save_dot_except_mlp", "full")


def test_maxtext_pipeline_sets_microbatches_and_layers_per_stage():
    p = plan("llama3-70b", mesh="pipeline=8,tensor=4", hardware="h100-sxm")  # a mesh whose axis names pin a pipeline
    mt = to_maxtext(p)
    assert mt["ici_pipeline_parallelism"] * mt["dcn_pipeline_parallelism"] == p.layout.pp > 1
    assert mt["num_layers_per_pipeline_stage"] * p.layout.pp * p.layout.interleave == p.model.num_layers
    assert mt["per_device_batch_size"] * p.layout.n_devices % mt["num_pipeline_microbatches"] == 0


def test_flax_rules_shard_and_compile_a_flax_transformer_on_emulated_devices():
    check = Path(__file__).with_name("flax_check.py")
    run = subprocess.run([sys.executable, str(check)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    # wq (embed, heads, head_dim): ZeRO 3 puts embed on data, tensor parallelism the heads
    assert run.stdout.split("\n")[-2] == "P('data', 'tensor', None) P('data', 'tensor') P('tensor', 'data')"


def test_markdown_itemises_an_offloaded_step_and_its_host_memory():
    plan = layout_plan("gpt2", Layout(micro_batch=8, offload="optimizer"), hardware="a100-40gb", global_batch=8, seq_len=256)
    text = markdown_report(plan)
    b = plan.predicted.breakdown
    assert f"| offload: exposed device-host copies | {b.offload_transfer_s:.3f} |" in text
    assert f"| offload: CPU Adam | {b.cpu_optimizer_s:.3f} |" in text
    assert f"| host (offloaded optimizer state) | {plan.predicted.memory.host_bytes / 2**30:.2f} |" in text
    assert "offload" not in markdown_report(layout_plan("gpt2", Layout(micro_batch=8), hardware="a100-40gb", global_batch=8,
                                                        seq_len=256))
