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


def test_maxtext_refuses_an_axis_its_ici_and_dcn_degrees_cannot_split_and_names_the_expert_axis():
    from costmodel.errors import InvalidConfigError

    racks = layout_plan("mixtral-8x7b", Layout(dp=72, tp=2, ep=8), hardware="gb200-nvl72", global_batch=144, seq_len=1024)
    with pytest.raises(InvalidConfigError, match="data axis of 9 spans 2 nodes unevenly"):
        to_maxtext(racks)
    node = layout_plan("mixtral-8x7b", Layout(dp=8, ep=8), hardware="h100-sxm", global_batch=16, seq_len=1024)
    assert to_maxtext(node)["ici_expert_parallelism"] == 8


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


# Launcher exports: every name and value each emits is one its launcher's source defines
# (planner/cli/export_schemas/, read by benchmarks/export_schemas.py at a pinned commit).
from benchmarks.export_check import EXPORTERS, schema, schema_problems  # noqa: E402
from costmodel.inputs.stack import STACKS  # noqa: E402
from planner.cli.commands.plan_cmd import FORMAT_STACKS  # noqa: E402
from planner.cli.exports import to_deepspeed, to_megatron, to_torchtitan_toml  # noqa: E402
from planner.cli.main import main  # noqa: E402

_LAYOUTS = (
    dict(dp=4, tp=8, micro_batch=2, sequence_parallel=True, recompute="selective", zero_stage=1),
    dict(dp=2, tp=4, pp=4, micro_batch=1, interleave=2, schedule="interleaved", recompute="full"),
    dict(dp=32, micro_batch=4, recompute="selective-layer", zero_stage=3),
    dict(dp=8, tp=4, micro_batch=1, recompute="selective-op", offload="optimizer", zero_stage=2),
)


@pytest.mark.parametrize("stack", list(EXPORTERS))
@pytest.mark.parametrize("model", ["llama3-70b", "mixtral-8x7b", "gpt2-xl"])
def test_each_launcher_export_uses_only_names_and_values_its_source_defines(stack, model):
    for fields in _LAYOUTS:
        layout = Layout(**fields, stack=STACKS[FORMAT_STACKS[stack][0]], **({"ep": 2} if model == "mixtral-8x7b" else {}))
        if model == "gpt2-xl" and fields.get("tp", 1) > 1 and 25 % fields["tp"]:
            continue  # 25 heads split over no tensor degree but 1
        p = layout_plan(model, layout, hardware="h100-sxm", global_batch=256, seq_len=1024)
        assert schema_problems(stack, EXPORTERS[stack](p)) == [], (stack, model, fields)


def test_the_check_catches_a_name_or_value_the_source_does_not_define():
    assert schema_problems("megatron", ["--tensor-model-parallel-size", "two"]) == [
        "--tensor-model-parallel-size: int expected, given 'two'"]
    assert schema_problems("megatron", ["--recompute-granularity", "some"])[0].startswith("--recompute-granularity: 'some' not one of")
    assert schema_problems("torchtitan", {"parallelism": {"tensor_degree": 2}}) == ["parallelism.tensor_degree: not in the source"]


@pytest.mark.parametrize("stack", list(EXPORTERS))
def test_schema_files_name_their_source(stack):
    data = schema(stack)
    assert data["repository"].startswith("https://github.com/") and len(data["commit"]) == 40 and data["files"]
    assert len(data["keys"]) > 100 and data["extracted_by"] == "python -m benchmarks.export_schemas"


def test_megatron_export_sets_virtual_stages_recompute_and_the_distributed_optimizer():
    layout = Layout(dp=2, tp=4, pp=4, micro_batch=1, interleave=2, schedule="interleaved", recompute="full", zero_stage=1,
                    sequence_parallel=True, stack=STACKS["megatron-core"])
    args = to_megatron(layout_plan("llama3-70b", layout, hardware="h100-sxm", global_batch=256))
    value = lambda flag: args[args.index(flag) + 1]  # noqa: E731
    assert (value("--tensor-model-parallel-size"), value("--pipeline-model-parallel-size")) == ("4", "4")
    assert value("--num-layers-per-virtual-pipeline-stage") == "10"  # 80 layers over 4 stages × 2 chunks
    assert value("--recompute-granularity") == "full" and "--use-distributed-optimizer" in args and "--sequence-parallel" in args
    assert (value("--num-query-groups"), value("--global-batch-size")) == ("8", "256")


def test_deepspeed_batch_sizes_multiply_and_torchtitan_degrees_cover_the_devices():
    layout = Layout(dp=8, tp=4, micro_batch=2, zero_stage=3, recompute="selective-op", stack=STACKS["torchtitan"])
    p = layout_plan("llama3-8b", layout, hardware="h100-sxm", global_batch=256)
    ds = to_deepspeed(p)["config"]
    assert ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 8 == ds["train_batch_size"] == 256
    toml = to_torchtitan_toml(p)
    assert "data_parallel_shard_degree = 8" in toml and "tensor_parallel_degree = 4" in toml and 'mode = "selective"' in toml


def test_format_maxtext_plans_on_the_maxtext_stack_and_refuses_another(capsys):
    assert main(["--model", "gpt2", "--mesh", "4", "--global-batch", "16", "--format", "json"]) == 0
    assert '"name":"jax"' in capsys.readouterr().out.replace(" ", "")
    assert main(["--model", "gpt2", "--mesh", "4", "--global-batch", "16", "--format", "maxtext"]) == 0
    assert "ici_data_parallelism" in capsys.readouterr().out
    assert main(["--model", "gpt2", "--mesh", "4", "--global-batch", "16", "--format", "maxtext", "--stack", "megatron-core"]) == 2
    assert "--format maxtext exports a plan for maxtext, but --stack is megatron-core" in capsys.readouterr().err
