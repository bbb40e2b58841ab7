"""Tests `planner/cli/commands/plan_cmd.py`: plans at the device-count extremes, time limits, atomic writes."""

import argparse
import json
import os
import stat
import time

import pytest

from planner.cli.commands.plan_cmd import FORMATS, Shown, add_arguments, write_atomic
from planner.cli.main import main


def _plan(capsys, *argv):
    start = time.perf_counter()
    code = main(["--json", *argv])
    wall_s = time.perf_counter() - start
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else None, err, wall_s


def test_one_device_plans_within_the_time_limit(capsys):
    code, plan, err, wall_s = _plan(capsys, "--model", "gpt2", "--devices", "1", "--time-limit-s", "20")
    assert code == 0 and err == "" and wall_s < 20
    assert plan["layout"]["dp"] == plan["layout"]["tp"] == plan["layout"]["pp"] == 1 and plan["solver"]["status"] == "OPTIMAL"


def test_65536_devices_plan_within_the_time_limit(capsys):
    # 4096 sequences: with 256, every layout left needs interleaved or uneven stages over 80 layers, which plan does not emit.
    code, plan, _, wall_s = _plan(capsys, "--model", "llama3-70b", "--devices", "65536", "--global-batch", "4096",
                                  "--time-limit-s", "20")
    lay = plan["layout"]
    assert code == 0 and wall_s < 20 and plan["solver"]["status"] == "OPTIMAL"
    assert lay["dp"] * lay["tp"] * lay["pp"] * lay["cp"] == 65536 and sum(a["size"] > 1 for a in plan["mesh"]) >= 2


def test_time_limit_keeps_the_best_layout_found_and_says_feasible(capsys, monkeypatch):
    # A clock that advances one second per reading: the layout search stops after a few candidates.
    ticks = iter(range(10**9))
    monkeypatch.setattr("search.layouts.time.perf_counter", lambda: float(next(ticks)))
    code, plan, _, _ = _plan(capsys, "--model", "gpt2", "--devices", "8", "--global-batch", "64", "--time-limit-s", "300")
    assert code == 0 and plan["solver"]["status"] == "FEASIBLE"
    assert plan["solver"]["pruned"]["not costed: time limit reached"] > 0


def test_no_progress_display_when_output_is_not_a_terminal(capsys):
    # capsys streams are not terminals: stdout holds only the plan, stderr nothing.
    assert main(["--model", "gpt2", "--mesh", "2x4", "--global-batch", "64"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "plan found in" in out and "\x1b[?25l" not in out  # no cursor hiding from a live display


@pytest.mark.parametrize("text", ["first", ""])
def test_write_atomic_replaces_in_one_step_and_leaves_no_temporary(tmp_path, text):
    path = tmp_path / "plan.json"
    path.write_text("old")
    write_atomic(path, text)
    assert path.read_text() == text and [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_written_plan_gets_the_usual_file_mode(tmp_path):
    path = tmp_path / "plan.json"
    write_atomic(path, "{}")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


def test_write_atomic_failure_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "plan.json"
    path.write_text("old")

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("planner.cli.commands.plan_cmd.os.replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_tokens_gives_days_to_train_as_the_6NT_arithmetic_at_the_plans_mfu(capsys):
    code, plan, _, _ = _plan(capsys, "--model", "llama3-70b", "--devices", "1024", "--hardware", "h100-sxm", "--tokens", "15e12")
    from costmodel.hardware.catalog import H100_SXM
    from planner.config import load_model

    pred = plan["predicted"]
    # Dense model: N = all parameters. (For MoE the planner's MFU counts the active, top-k, parameters.)
    n_params = load_model("llama3-70b").total_params
    six_nt_s = 6 * n_params * 15e12 / (pred["mfu"] * H100_SXM.peak_flops_per_s["bfloat16"] * 1024)
    assert code == 0 and pred["time_to_train_s"] == pytest.approx(six_nt_s, rel=0.05)  # attention FLOPs: the rest
    assert pred["device_hours"] == pytest.approx(pred["time_to_train_s"] * 1024 / 3600, rel=1e-9)
    assert 100 < pred["time_to_train_s"] / 86400 < 300  # at the planned batch (the next test)


def test_without_a_batch_the_planned_one_trains_70b_on_15T_tokens_near_the_napkin_days_and_says_why(capsys, monkeypatch):
    # The napkin: 6·N·D FLOPs at 40 % MFU on 1024 H100s (989 TFLOP/s dense bf16) is about 181 days.
    monkeypatch.setenv("COLUMNS", "300")  # one line per row
    start = time.perf_counter()
    code, plan, _, _ = _plan(capsys, "--model", "llama3-70b", "--devices", "1024", "--hardware", "h100-sxm", "--tokens", "15e12")
    from planner.config import load_model
    from planner.plan_schema import Plan

    napkin_days = 6 * load_model("llama3-70b").total_params * 15e12 / (1024 * 989e12 * 0.40) / 86400
    batch = plan["batch"]
    assert code == 0 and napkin_days == pytest.approx(181, rel=0.01)
    assert plan["predicted"]["time_to_train_s"] / 86400 == pytest.approx(napkin_days, rel=0.20)
    assert not batch["given"] and batch["sequences"] == plan["train"]["global_batch"] and batch["sequences"] % 1024 == 0
    assert "DeepSeek LLM" in batch["reason"] and batch["warning"] is None
    FORMATS["summary"](Plan.model_validate(plan), Shown(plan_time_s=0.0, html_page=None, html_written=False))
    out = capsys.readouterr().out
    assert f"{batch['sequences']:,} × 2048" in out and batch["reason"] in " ".join(out.split())
    assert time.perf_counter() - start < 30


def test_a_batch_the_devices_do_not_divide_is_warned_about_with_one_they_do(capsys):
    code, plan, err, _ = _plan(capsys, "--model", "llama3-8b", "--mesh", "8x4", "--global-batch", "100")
    warning = plan["batch"]["warning"]
    assert code == 0 and plan["batch"]["given"] and "--global-batch 96 plans" in warning and f"warning: {warning}" in err
    code, plan, err, _ = _plan(capsys, "--model", "llama3-8b", "--mesh", "8x4", "--global-batch", "96")
    assert code == 0 and plan["batch"]["warning"] is None and err == ""


def test_time_to_train_is_the_steps_plus_the_checkpoint_and_input_overheads(capsys):
    args = ("--model", "llama3-70b", "--devices", "1024", "--hardware", "h100-sxm", "--tokens", "15e12")
    code, plan, _, _ = _plan(capsys, *args)
    pred, run = plan["predicted"], plan["predicted"]["run_overheads"]
    steps_s = 15e12 / pred["tokens_per_s"]
    assert code == 0 and run["steps_s"] == pytest.approx(steps_s)
    assert pred["time_to_train_s"] == pytest.approx(steps_s + pred["checkpoint_overhead_s"] + pred["input_overhead_s"])
    # One checkpoint an hour of fp32 master weights and two fp32 Adam moments, at 1024 GPUs' share of 20 GB/s per 256.
    from planner.config import load_model

    assert run["checkpoint_bytes"] == pytest.approx(12 * load_model("llama3-70b").total_params)
    assert run["checkpoint_bytes"] / run["write_bytes_per_s"] == pytest.approx(run["checkpoint_write_s"])
    assert run["write_bytes_per_s"] == pytest.approx(80e9) and run["n_checkpoints"] == int(steps_s // 3600)
    assert pred["checkpoint_overhead_s"] == pytest.approx(run["n_checkpoints"] * run["checkpoint_write_s"])
    assert pred["input_overhead_s"] == 0 and run["input_bytes_per_s"] < run["read_bytes_per_s"]  # the loader keeps up
    code, halved, _, _ = _plan(capsys, *args, "--checkpoint-every-s", "1800")
    assert halved["predicted"]["checkpoint_overhead_s"] == pytest.approx(2 * pred["checkpoint_overhead_s"], rel=0.01)


def test_summary_prints_the_checkpoint_and_input_lines_with_what_they_assumed(capsys):
    code = main(["--model", "gpt2", "--devices", "8", "--hardware", "a100-80gb", "--tokens", "1e11", "--loader", "blocking"])
    out = capsys.readouterr().out
    assert code == 0 and "checkpoints" in out and "input pipeline" in out and "blocking loader" in out
    assert "assumed:" in out  # a100-80gb has no vendor storage figure


def test_without_tokens_the_training_time_is_absent(capsys):
    code, plan, _, _ = _plan(capsys, "--model", "gpt2", "--devices", "8")
    assert code == 0 and plan["predicted"]["time_to_train_s"] is None and plan["predicted"]["device_hours"] is None
    assert plan["predicted"]["checkpoint_overhead_s"] is None and plan["predicted"]["run_overheads"] is None


def test_lora_summary_names_the_workload_and_itemizes_frozen_weights_and_adapters():
    from planner.api import plan
    from planner.cli.tables import memory_rows, titled_workload

    p = plan("llama3-8b", mesh="8", global_batch=64, workload="finetune-lora", lora={"frozen_dtype": "int8"})
    assert titled_workload(p.train) == " (finetune-lora: rank 16 on attn, frozen weights int8)"
    (label, values), _ = memory_rows(p.predicted.memory, lora=True, digits=1)
    # 7.0 B layer weights at 1 B, embedding and head (1.05 B) at 2 B: 9.1 GB.
    assert label.strip() == "frozen weights / adapters / grads / optimizer" and values.startswith("8.5 / 0.0 / 0.1")
    assert titled_workload(plan("gpt2", mesh="2", global_batch=16).train) == ""


def test_plan_json_contract_for_lora(capsys):
    assert main(["--model", "gpt2", "--mesh", "2", "--global-batch", "16", "--workload", "finetune-lora", "--lora-rank", "8",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workload"] == "finetune-lora" and data["train"]["workload"]["lora"]["rank"] == 8
    assert data["predicted"]["memory"]["per_device_bytes"] > 0


def test_plan_json_contract_for_lora_over_fp8_frozen_weights_and_the_ilp_refusal(capsys):
    flags = ("--model", "gpt2", "--mesh", "2", "--hardware", "h100-sxm", "--global-batch", "16", "--workload", "finetune-lora",
             "--precision", "fp8", "--frozen-dtype", "fp8")
    code, data, err, _ = _plan(capsys, *flags)
    assert code == 0 and data["train"]["workload"]["lora"]["frozen_dtype"] == "fp8" and data["train"]["linear_dtype"] == "float8_e4m3fn"
    assert data["predicted"]["memory"]["per_device_bytes"] > 0
    code, _, err, _ = _plan(capsys, *flags, "--planner", "ilp")
    assert code == 5 and "grid planner" in err and "fix:" in err


def test_plan_json_contract_for_decode(capsys):
    # The contract: latency, first-token time, throughput, memory with the KV cache.
    code, data, err, _ = _plan(capsys, "--model", "llama3-8b", "--mesh", "8", "--workload", "decode", "--batch", "64",
                               "--context-len", "4096", "--max-token-latency-ms", "7")
    predicted, memory = data["predicted"], data["predicted"]["memory"]
    assert code == 0 and err == "" and data["workload"] == "decode"
    assert 0 < predicted["time_per_output_token_s"] <= 7e-3 < predicted["time_to_first_token_s"]
    assert predicted["tokens_per_s"] == pytest.approx(64 * data["layout"]["dp"] / predicted["time_per_output_token_s"], rel=1e-6)
    # 32 layers × 8 KV heads × 128 × 2 (K and V) × 2 bytes × 64 × 4096 tokens = 32 GiB, split over 8 devices' KV heads.
    assert memory["kv_cache_bytes"] == 32 * 8 * 128 * 2 * 2 * 64 * 4096 / 8 and memory["per_device_bytes"] > memory["kv_cache_bytes"]


def test_decode_with_fp8_weights_and_of_a_mixture_of_experts(capsys):
    serve = ("--mesh", "1x8", "--workload", "decode", "--batch", "1", "--context-len", "4096")
    tpot = {}
    for dtype in ("bf16", "fp8"):
        code, data, err, _ = _plan(capsys, "--model", "llama3-70b", *serve, "--hardware", "h100-sxm", "--frozen-dtype", dtype)
        assert code == 0 and err == ""
        tpot[dtype] = data["predicted"]["serving"]["hbm_lower_bound_s"] * data["layout"]["tp"]  # the replica's bytes read
    assert tpot["fp8"] < 0.6 * tpot["bf16"]  # layer matrices at 1 byte, embedding and head still 2
    code, _, err, _ = _plan(capsys, "--model", "llama3-70b", *serve, "--hardware", "a100-80gb", "--frozen-dtype", "fp8")
    assert code == 5 and "no fp8 peak" in err and "fix:" in err and "Traceback" not in err
    code, data, err, _ = _plan(capsys, "--model", "mixtral-8x7b", *serve, "--hardware", "h100-sxm")
    held = data["predicted"]["memory"]["params_bytes"] * data["layout"]["tp"] * data["layout"]["pp"]
    assert code == 0 and held > 2 * 46e9  # every expert of 46.7B parameters held, in bf16


def test_decode_at_batch_1_takes_the_least_time_per_token_and_the_summary_prints_serving_terms_only(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one line per row
    serve = ("--model", "llama3-70b", "--hardware", "h100-sxm", "--workload", "decode", "--batch", "1", "--context-len", "4096")
    code, plan, _, _ = _plan(capsys, *serve, "--devices", "8")
    assert code == 0 and (plan["layout"]["dp"], plan["layout"]["tp"]) == (1, 8)
    assert plan["predicted"]["time_per_output_token_s"] < min(a["step_time_s"] for a in plan["alternatives"])
    assert plan["solver"]["objective"].startswith("latency: the least time per output token")
    assert main([*serve, "--devices", "8"]) == 0
    out = capsys.readouterr().out
    assert "dp1 tp8 pp1 · 1 replica(s) of 8 device(s)" in out and "why this layout" in out and "latency: the least" in out
    assert not any(term in out for term in ("micro-batch 1", "recompute", "ZeRO", " z0", " mb1"))
    assert main(["--model", "llama3-8b", "--devices", "1", "--workload", "decode", "--batch", "1"]) == 0
    assert "alternatives" not in capsys.readouterr().out  # one device: nothing to compare with


def test_a_2d_decode_plan_prints_both_tensor_axes_and_refuses_a_launcher_export_in_one_line(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    serve = ("--model", "llama3-405b", "--devices", "32", "--hardware", "tpu-v5p", "--workload", "decode", "--batch", "64")
    assert main(list(serve)) == 0
    out = capsys.readouterr().out
    assert "dp1 tp32=4x8 pp1" in out and "tp: heads axis / model-dimension axis" in out and "│ dp1 tp32 pp1" in out
    assert main([*serve, "--format", "maxtext"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no 2D weight-stationary split" in err and "--format specs" in err


@pytest.mark.parametrize("argv", [("--model", "gpt2", "--mesh", "2x4", "--global-batch", "64"),
                                  ("--model", "llama3-70b", "--devices", "8", "--workload", "decode", "--batch", "1")])
def test_the_summary_fits_80_columns_without_cutting_a_word(capsys, monkeypatch, argv):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(list(argv)) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80 and "…" not in out


def test_serving_flags_without_a_serving_workload_are_refused(capsys):
    assert main(["--model", "gpt2", "--mesh", "2", "--context-len", "1024"]) == 2
    assert "--context-len" in capsys.readouterr().err


def test_llama3_8b_on_one_a100_40gb_fits_only_offloaded_and_the_summary_says_what_it_costs(capsys, monkeypatch):
    args = ("--model", "llama3-8b", "--devices", "1", "--hardware", "a100-40gb")
    code, _, err, _ = _plan(capsys, *args, "--offload", "none")
    assert code == 4 and "does not fit on 1× a100-40gb" in err
    assert err.endswith("or let the optimizer state go to the host (--offload optimizer)\n")
    code, plan, _, _ = _plan(capsys, *args)
    mem, off = plan["predicted"]["memory"], plan["predicted"]["breakdown"]["offload"]
    assert plan["layout"]["offload"] == "optimizer" and plan["predicted"]["fits"]
    assert plan["solver"]["offload_reason"] == "nothing fits in 37.0 GiB per device (usable less the runtime reserve) without offloading"
    assert mem["optimizer_bytes"] == 0 and mem["host_bytes"] == mem["host"]["total_bytes"] > mem["host"]["moments_bytes"] > 0
    assert plan["predicted"]["breakdown"]["offload_transfer_s"] == off["exposed_transfer_s"] > 0
    monkeypatch.setenv("COLUMNS", "400")  # rows unwrapped
    assert main([*args]) == 0
    out = capsys.readouterr().out
    reason = "nothing fits in 37.0 GiB per device (usable less the runtime reserve) without offloading"
    assert f"optimizer state on the host because {reason}; costs" in out
    assert "· ZeRO 0 · optimizer offloaded" in out and "s/step of PCIe and" in out
    assert "master / moments / grads / 16-bit copy / accumulators" in out


def test_offload_optimizer_is_refused_for_intra_op_planners(capsys):
    code = main(["--model", "gpt2", "--devices", "1", "--offload", "optimizer", "--planner", "ilp"])
    assert code == 5 and "does not plan offloaded layouts" in capsys.readouterr().err


def test_every_format_choice_has_its_renderer():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    choices = next(a.choices for a in parser._actions if a.dest == "format")
    assert list(choices) == list(FORMATS) == ["summary", "json", "specs", "maxtext", "megatron", "deepspeed", "torchtitan", "flax",
                                              "markdown", "html"]


@pytest.mark.parametrize("fmt, opening", [("json", "{"), ("specs", "{"), ("maxtext", "{"), ("megatron", "--tensor-model-parallel-size"),
                                          ("deepspeed", "{"), ("torchtitan", "[parallelism]"), ("flax", "["), ("markdown", "#"),
                                          ("html", "<!doctype html>")])
def test_each_format_prints_its_rendering(capsys, fmt, opening):
    assert main(["--model", "gpt2", "--mesh", "2x4", "--hardware", "a100-80gb", "--global-batch", "64", "--format", fmt]) == 0
    assert capsys.readouterr().out.lower().startswith(opening)


def test_html_written_to_out_is_not_printed(tmp_path, capsys):
    out = tmp_path / "plan.html"
    assert main(["--model", "gpt2", "--mesh", "2x4", "--hardware", "a100-80gb", "--global-batch", "64", "--format", "html",
                 "--out", str(out)]) == 0
    assert capsys.readouterr().out == "" and out.read_text().lower().startswith("<!doctype html>")


def test_a_sequence_beyond_the_models_positions_is_refused_in_one_line(capsys):
    assert main(["--model", "llama3-8b", "--mesh", "8", "--seq-len", "100000"]) == 2
    err = capsys.readouterr().err
    assert "seq_len=100000 exceeds llama3-8b's 8192 positions" in err and "--seq-len 8192 or less" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_and_micro_batch_pins_give_that_layout_say_so_and_are_written(capsys, monkeypatch, tmp_path, zero):
    # Issue 35's must-show: plan --model llama3-8b --mesh data=8 --zero Z --micro-batch 2 --global-batch 64 --out pZ.json
    monkeypatch.setenv("COLUMNS", "300")  # one line per row
    out_path = tmp_path / f"p{zero}.json"
    code = main(["--model", "llama3-8b", "--mesh", "data=8", "--zero", str(zero), "--micro-batch", "2", "--global-batch", "64",
                 "--out", str(out_path)])
    out = capsys.readouterr().out
    assert code == 0 and "dp8 tp1 pp1 · micro-batch 2 · " in out and f" · ZeRO {zero}" in out
    pinned_row = next(line for line in out.splitlines() if "pinned" in line)
    assert f"--micro-batch 2 --zero {zero}   (the planner chose the rest)" in pinned_row
    written = json.loads(out_path.read_text())
    assert (written["layout"]["dp"], written["layout"]["zero_stage"], written["layout"]["micro_batch"]) == (8, zero, 2)
    assert {k: v for k, v in written["solver"]["pins"].items() if v is not None} == {"micro_batch": 2, "zero_stage": zero}


def test_unpinned_plans_print_no_pinned_row(capsys):
    code, plan, _, _ = _plan(capsys, "--model", "gpt2", "--mesh", "2x4", "--global-batch", "64")
    assert code == 0 and plan["solver"]["pins"] is None
    assert main(["--model", "gpt2", "--mesh", "2x4", "--global-batch", "64"]) == 0
    assert "pinned" not in capsys.readouterr().out


def test_the_optimizer_flags_reach_the_request():
    from planner.cli.commands.plan_cmd import request_from_args
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    request = request_from_args(parser.parse_args(["--model", "llama3-8b", "--devices", "1", "--workload", "finetune-full",
                                                   "--optimizer-state", "bf16", "--optimizer-in-backward"]))
    assert request.optimizer_state == "bf16" and request.optimizer_in_backward
