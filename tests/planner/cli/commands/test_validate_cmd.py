"""Tests `planner/cli/commands/validate_cmd.py`: ``plan validate`` end to end, compile-only and timed."""

import json

from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import stack_with
from planner.api import layout_plan
from planner.cli.main import main
from validate import cpu_profile
from validate.cpu_profile import CpuMeasurement, host_name

TINY = ModelConfig(name="tiny", hidden_size=64, num_layers=2, num_heads=4, ffn_size=128, vocab_size=256)


def _plan_file(tmp_path, layout):
    path = tmp_path / "plan.json"
    path.write_text(layout_plan(TINY, layout, hardware="a100-80gb", seq_len=16, global_batch=4).model_dump_json())
    return str(path)


def test_compile_only_prints_a_table_of_checks(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rows unwrapped
    code = main(["validate", _plan_file(tmp_path, Layout(dp=2, tp=2, micro_batch=1)), "--compile-only"])
    out = capsys.readouterr().out
    # Exit 1: at this size the simulator's fixed workspace outweighs the whole compiled step (memory per device).
    assert code == 1 and "memory arguments" in out and "KiB" in out and "all-reduce" in out and "step time" not in out


def test_without_compile_only_the_step_is_timed_against_the_cpu_profile(capsys, tmp_path, monkeypatch):
    profile = CpuMeasurement(n_devices=1, matmul_flops_per_s=((1e6, 1e10), (1e9, 4e10)), memory_kernel_bytes_per_s=4e9,
                             first_touch_s_per_byte=1e-9, transpose_s_per_byte=1e-10,
                             fused_transpose_s_per_byte=1e-9, kernel_floor_s=1e-6, link_bytes_per_s=4e9, link_latency_s=0.0,
                             load_average=0.0, other_cpu_share=None, host=host_name(), jax_version="0")
    monkeypatch.setattr(cpu_profile, "cached_measurement", lambda n: profile)  # the micro-benchmarks are tested on their own
    code = main(["validate", _plan_file(tmp_path, Layout(micro_batch=2)), "--json", "--steps", "1", "--repeats", "2",
                 "--time-tolerance", "1000", "--tolerance", "1000"])
    out = json.loads(capsys.readouterr().out)
    step = next(c for c in out["checks"] if c["item"] == "step time")
    assert code == 0 and step["source"] == "measured" and step["predicted"] > 0 and step["actual"] > 0
    assert len(out["timed"]["repeat_step_s"]) == 2 and out["compile"]["n_devices"] == 1


def test_an_offloaded_plan_compiles_and_says_what_is_not_checked(capsys, tmp_path):
    path = _plan_file(tmp_path, Layout(micro_batch=2, offload="optimizer"))
    code = main(["validate", path, "--compile-only", "--json", "--tolerance", "0.05"])
    out = json.loads(capsys.readouterr().out)
    items = {c["item"] for c in out["checks"]}
    assert code == 0 and "memory per device" not in items and {"memory arguments", "flops"} <= items
    assert out["not_checked"].startswith("offload optimizer: lowered without it")
    assert main(["validate", path]) == 5 and "add --compile-only" in capsys.readouterr().err


def test_a_lora_plan_over_fp8_frozen_weights_validates_and_says_what_it_leaves_unchecked(capsys, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(layout_plan(TINY, Layout(dp=2, tp=2, micro_batch=1), hardware="h100-sxm", seq_len=16, global_batch=4,
                                workload="finetune-lora", lora={"frozen_dtype": "fp8"}, precision="fp8").model_dump_json())
    main(["validate", str(path), "--compile-only", "--json"])
    report = json.loads(capsys.readouterr().out)
    items = {c["item"] for c in report["checks"]}
    assert "memory arguments" in items and "flops" in items and "memory per device" not in items
    assert "frozen fp8 weights" in report["not_checked"]
    assert next(c for c in report["checks"] if c["item"] == "memory arguments")["ok"]


def test_a_pipelined_prefill_plan_compiles_with_every_check_predicted_and_is_not_timed(capsys, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(layout_plan(TINY, Layout(pp=2, tp=2), hardware="h100-sxm", seq_len=32, global_batch=4, workload="prefill",
                                inference={"prompt_len": 16}).model_dump_json())
    code = main(["validate", str(path), "--compile-only", "--json"])
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert code == 0 and all(c["ok"] for c in checks)
    assert {"memory arguments", "flops", "collective-permute bytes"} <= {c["item"] for c in checks}
    assert main(["validate", str(path)]) == 5 and "add --compile-only" in capsys.readouterr().err


def test_a_lora_plan_over_nf4_weights_is_refused_in_one_line_before_compiling(capsys, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(layout_plan(TINY, Layout(dp=2, micro_batch=1), hardware="a100-80gb", seq_len=16, global_batch=4,
                                workload="finetune-lora", lora={"frozen_dtype": "nf4-dq"}).model_dump_json())
    code = main(["validate", str(path), "--compile-only"])
    captured = capsys.readouterr()
    assert code != 0 and captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "nf4-dq frozen weights" in lines[0] and "not lowered" in lines[0] and "fix:" in lines[0]


def test_a_plan_with_an_optimizer_option_the_program_does_not_lower_is_refused_in_one_line(capsys, tmp_path):
    from costmodel.inputs.train_config import OptimizerState
    plan = layout_plan(TINY, Layout(micro_batch=4), hardware="a100-80gb", seq_len=16, global_batch=4)
    path = tmp_path / "plan.json"
    path.write_text(plan.model_copy(update={"train": plan.train.with_optimizer_state(OptimizerState.INT8, in_backward=True)})
                    .model_dump_json())
    code = main(["validate", str(path), "--compile-only"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1
    assert "--optimizer-state 8bit is not lowered by the reference program" in err


def test_a_plan_with_the_loss_in_pieces_validates_its_flops_and_memory(capsys, tmp_path):
    path = _plan_file(tmp_path, Layout(micro_batch=2, stack=stack_with("jax", cross_entropy_chunks=4)))
    code = main(["validate", path, "--compile-only", "--json"])
    out = json.loads(capsys.readouterr().out)
    checks = {c["item"]: c for c in out["checks"]}
    assert code == 0 and checks["flops"]["ok"] and checks["memory per device"]["ok"]
