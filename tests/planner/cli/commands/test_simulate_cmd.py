"""Tests `planner/cli/commands/simulate_cmd.py`: the software-stack flags reach the simulated layout and move its step time."""

import csv
import json

import pytest

from benchmarks.simulator_accuracy import DEFAULT_DATA, evaluate, model_from_row
from costmodel.inputs.stack import STACKS
from planner.cli.main import main

# Llama-3-8B on two H100 nodes: tp4 with sequence parallelism, FSDP, full recompute, micro-batch 2.
BASE = ("simulate", "--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "16", "--tp", "4", "--global-batch", "16",
        "--micro-batch", "2", "--seq-len", "4096", "--sequence-parallel", "--zero", "3", "--recompute", "full", "--json")


def _simulate(capsys, *flags):
    code = main([*BASE, *flags])
    out, _ = capsys.readouterr()
    assert code == 0
    return json.loads(out)


def test_default_stack_is_the_jax_program(capsys):
    stack = _simulate(capsys)["layout"]["stack"]
    assert stack["name"] == "jax"
    assert not any(stack[k] for k in ("batch_major", "reentrant_recompute", "fsdp_copy_out", "fused_grad_accumulation"))


@pytest.mark.parametrize(("flag", "value", "field", "slower"), [
    ("--tp-overlap", "backward", "tp_overlap", True),  # from the jax stack's collective matmul: only the backward hides
    ("--batch-major", "yes", "batch_major", True),
    ("--reentrant-recompute", "yes", "reentrant_recompute", True),
    ("--fsdp-copy-out", "yes", "fsdp_copy_out", True),
    ("--fused-grad-accumulation", "yes", "fused_grad_accumulation", False),
])
def test_each_fact_flag_overrides_one_fact_and_moves_step_time(capsys, flag, value, field, slower):
    base_s = _simulate(capsys)["step_time_s"]
    flagged = _simulate(capsys, flag, value)
    assert flagged["layout"]["stack"][field] == (value if field == "tp_overlap" else True)
    assert flagged["layout"]["stack"]["name"] == "custom"
    assert (flagged["step_time_s"] > base_s) if slower else (flagged["step_time_s"] < base_s)


def test_a_preset_sets_every_fact_and_a_flag_overrides_one(capsys):
    titan = _simulate(capsys, "--stack", "torchtitan")["layout"]["stack"]
    assert titan["name"] == "torchtitan" and titan["fsdp_copy_out"] and not titan["fused_norm"]
    fused = _simulate(capsys, "--stack", "torchtitan", "--fused-norm", "yes")["layout"]["stack"]
    assert fused["fused_norm"] and {k: v for k, v in fused.items() if k not in ("name", "fused_norm")} == {
        k: v for k, v in titan.items() if k not in ("name", "fused_norm")}


def test_help_lists_every_preset(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert all(name in out for name in STACKS)


@pytest.mark.skipif(not DEFAULT_DATA.exists(), reason=f"no shared data at {DEFAULT_DATA}")
def test_a_published_run_from_the_command_line_matches_the_benchmark(capsys, tmp_path):
    """Narayanan et al. Table 1, GPT-18.4B (fp16, megatron-lm-2021): its columns as flags give the benchmark's prediction."""
    with DEFAULT_DATA.open() as f:
        row = next(r for r in csv.DictReader(f) if r["model"] == "GPT-18.4B")
    path = tmp_path / "gpt-18.4b.json"
    path.write_text(model_from_row(row).model_dump_json(exclude={"name"}))
    code = main(["simulate", "--model", str(path), "--hardware", row["hardware"], "--devices", row["devices"],
                 "--tp", row["tp"], "--pp", row["pp"], "--global-batch", row["global_batch_seqs"], "--micro-batch", row["micro_batch"],
                 "--seq-len", row["seq_len"], "--recompute", row["recompute"], "--attention", row["attention"],
                 "--dp-overlap", row["dp_overlap"], "--stack", row["stack"], "--precision", row["precision"], "--json"])
    assert code == 0
    est = json.loads(capsys.readouterr().out)
    expected = evaluate([row])[0]["predicted_s"]
    assert est["step_time_s"] == pytest.approx(expected, rel=1e-9)
    assert abs(est["step_time_s"] - float(row["derived_step_time_s"])) / float(row["derived_step_time_s"]) < 0.08


def test_offload_optimizer_moves_the_state_to_the_host_and_adds_its_own_terms(capsys):
    on_device = _simulate(capsys)
    offloaded = _simulate(capsys, "--offload", "optimizer")
    b = offloaded["breakdown"]
    assert offloaded["layout"]["offload"] == "optimizer" and b["optimizer_s"] == 0 < on_device["breakdown"]["optimizer_s"]
    assert b["cpu_optimizer_s"] > 0 and b["offload_transfer_s"] > 0 and b["total_s"] == pytest.approx(offloaded["step_time_s"])
    assert offloaded["memory"]["optimizer_bytes"] == 0 and offloaded["memory"]["host_bytes"] > 0
    assert on_device["memory"]["host_bytes"] == 0 and on_device["breakdown"]["offload"] is None


def test_offload_activations_puts_the_saved_tensors_on_the_host(capsys):
    on_device = _simulate(capsys)
    offloaded = _simulate(capsys, "--offload-activations")
    assert offloaded["layout"]["offload_activations"] is True
    assert offloaded["memory"]["activations_bytes"] < on_device["memory"]["activations_bytes"]
    assert offloaded["memory"]["host"]["activations_bytes"] > 0 and offloaded["breakdown"]["activation_offload_s"] >= 0


LORA_70B = ("simulate", "--model", "llama2-70b", "--hardware", "h100-sxm", "--devices", "8", "--tp", "4", "--global-batch", "8",
            "--seq-len", "8192", "--sequence-parallel", "--stack", "megatron-core", "--workload", "finetune-lora", "--json")


def test_lora_over_fp8_frozen_weights_is_faster_and_lighter_than_over_bf16(capsys):
    assert main([*LORA_70B]) == 0
    bf16 = json.loads(capsys.readouterr().out)
    assert main([*LORA_70B, "--precision", "fp8", "--frozen-dtype", "fp8"]) == 0
    fp8 = json.loads(capsys.readouterr().out)
    assert fp8["step_time_s"] < 0.85 * bf16["step_time_s"]
    # 1-byte frozen weights plus TE's kept transposes weigh what 2-byte ones did: same frozen bytes.
    assert fp8["memory"]["frozen_params_bytes"] == pytest.approx(bf16["memory"]["frozen_params_bytes"], rel=0.01)


@pytest.mark.parametrize(("flags", "cause"), [
    (("--frozen-dtype", "fp8"), "needs --precision fp8, not bf16"),
    (("--precision", "fp8", "--frozen-dtype", "int4"), "int4 frozen weights under --precision fp8 are not modelled"),
    (("--precision", "fp8", "--frozen-dtype", "fp8", "--hardware", "a100-80gb"), "a100-80gb has no float8 peak"),
])
def test_fp8_frozen_dtype_is_refused_in_one_line_where_it_cannot_run(capsys, flags, cause):
    assert main([*LORA_70B, *flags]) in (2, 5)
    err = capsys.readouterr().err.strip()
    assert cause in err and "fix:" in err and len(err.splitlines()) == 1


# Llama-3-8B full fine-tuning on one 80 GB H100 at 2 × 4096 tokens with full recompute (issue 40's example).
FINETUNE = ("simulate", "--model", "llama3-8b", "--devices", "1", "--hardware", "h100-sxm", "--workload", "finetune-full",
            "--global-batch", "2", "--micro-batch", "2", "--seq-len", "4096", "--recompute", "full", "--json")


def test_the_optimizer_flags_reach_the_memory_breakdown_and_the_optimizer_time(capsys):
    def run(*flags):
        assert main([*FINETUNE, *flags]) == 0
        return json.loads(capsys.readouterr().out)

    fp32, bf16, int8 = run(), run("--optimizer-state", "bf16"), run("--optimizer-state", "8bit", "--optimizer-in-backward")
    n = fp32["memory"]["params_bytes"] / 4  # the JAX program's fp32 weights are the master copy: 4 + 4 + 8 B
    assert fp32["memory"]["grads_bytes"] == 4 * n and fp32["memory"]["optimizer_bytes"] == 8 * n and not fp32["fits"]
    assert [bf16["memory"][k] / n for k in ("params_bytes", "grads_bytes", "optimizer_bytes")] == [2, 2, 4] and bf16["fits"]
    assert int8["memory"]["optimizer_bytes"] / n == pytest.approx(2 * (1 + 4 / 2048), rel=1e-12)
    assert int8["memory"]["grads_bytes"] == 128256 * 4096 * 2  # the largest weight's bf16 gradient (the head's)
    assert fp32["breakdown"]["optimizer_s"] > bf16["breakdown"]["optimizer_s"] > int8["breakdown"]["optimizer_s"]


def test_the_step_in_backward_with_micro_batches_to_accumulate_is_refused(capsys):
    code = main([*FINETUNE, "--micro-batch", "1", "--optimizer-in-backward"])
    assert code != 0 and "cannot accumulate 2 micro-batches; fix: give --micro-batch" in capsys.readouterr().err


def test_knobs_left_auto_are_the_fastest_fitting_choice_and_are_named(capsys):
    base = [f for f in BASE if f not in ("--sequence-parallel",)]
    auto = _simulate_flags(capsys, base, "--micro-batch", "auto", "--sequence-parallel", "auto")
    assert set(auto["unstated_chosen"]) == {"micro_batch", "sequence_parallel"}
    assert auto["layout"]["micro_batch"] == auto["unstated_chosen"]["micro_batch"]
    stated = [_simulate_flags(capsys, base, "--micro-batch", str(mb), *(["--sequence-parallel"] if sp else []))
              for mb in (1, 2, 4) for sp in (False, True)]
    assert auto["step_time_s"] == min(s["step_time_s"] for s in stated if s["fits"] is not False)
    main([*base[:-1], "--micro-batch", "auto"])
    assert "chosen by the planner (auto): --micro-batch" in capsys.readouterr().out


def _simulate_flags(capsys, base, *flags):
    base = list(base)
    i = base.index("--micro-batch")
    del base[i:i + 2]
    code = main([*base, *flags])
    out, _ = capsys.readouterr()
    assert code == 0
    return json.loads(out)


def test_a_knob_left_auto_on_a_serving_step_is_refused_in_one_line(capsys):
    code = main(["simulate", "--model", "llama3-8b", "--devices", "1", "--workload", "decode", "--batch", "8", "--context-len", "2048",
                 "--micro-batch", "auto"])
    err = capsys.readouterr().err
    assert code == 3 and err.count("\n") == 1 and "--micro-batch auto: a decode step has no micro batch" in err


def test_an_eager_serving_stack_itemizes_its_host_dispatch_per_step(capsys):
    flags = ("simulate", "--model", "llama2-13b", "--hardware", "a100-80gb", "--devices", "1", "--workload", "decode",
             "--context-len", "1024")

    def serving(*more):
        assert main([*flags, *more, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    eager = serving("--serving-stack", "hf-eager")
    assert eager["serving"]["host_ops"] == 40 * 53 + 25 and eager["serving"]["host_s_per_op"] > 0
    assert eager["time_per_output_token_s"] >= eager["serving"]["host_step_s"]
    assert serving()["serving"]["host_ops"] == 0
    assert main([*flags, "--serving-stack", "hf-eager"]) == 0
    assert "host dispatch per step" in capsys.readouterr().out
