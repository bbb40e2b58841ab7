"""Tests `planner/cli/commands/serve_cmd.py`: the serving question in one command, on the user's path."""

import json

import pytest

from planner.cli.main import main

MUST_SHOW = ("serve", "--model", "llama3-8b", "--devices", "1", "--hardware", "h100-sxm", "--rate", "2", "--input-len", "512",
             "--output-len", "256")


def _json(capsys, *flags):
    assert main([*MUST_SHOW, *flags, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_llama3_8b_on_one_h100_prints_latencies_throughput_and_kv_blocks(capsys):
    assert main([*MUST_SHOW, "--requests", "200"]) == 0
    out = capsys.readouterr().out
    for row in ("time to first token p50 / p99", "time per output token p50 / p99", "throughput", "KV blocks a device"):
        assert row in out


def test_the_same_seed_gives_the_same_numbers(capsys):
    first, again = _json(capsys, "--requests", "200"), _json(capsys, "--requests", "200")
    assert first == again
    chosen = first["chosen"]
    assert (chosen["tp"], chosen["replicas"]) == (1, 1) and chosen["at_rate"]["requests_per_s"] == pytest.approx(2, rel=0.2)
    assert _json(capsys, "--requests", "200", "--seed", "3")["chosen"]["at_rate"] != chosen["at_rate"]


def test_a_draft_model_gives_the_speed_up_and_its_acceptance_assumption(capsys):
    spec = _json(capsys, "--requests", "200", "--draft-model", "llama3.2-1b", "--acceptance-rate", "0.8")["speculative"]
    assert spec["acceptance_rate"] == 0.8 and spec["draft_model"] == "llama3.2-1b" and spec["tpot_speedup_p50"] > 1
    assert main([*MUST_SHOW, "--requests", "100", "--draft-model", "llama3.2-1b"]) == 0
    assert "acceptance rate 0.7 assumed" in " ".join(capsys.readouterr().out.split())  # the terminal's line breaks aside


def test_lengths_from_a_histogram_file(capsys, tmp_path):
    histogram = tmp_path / "lengths.csv"
    histogram.write_text("tokens,weight\n128,1\n1024,3\n")
    result = _json(capsys, "--requests", "100", "--input-len", str(histogram))
    assert result["chosen"]["at_rate"]["completed"] == 100


@pytest.mark.parametrize("flag, value", [("--input-len", "many"), ("--acceptance-rate", "1.5"), ("--prefill-chunk", "0")])
def test_a_bad_value_is_one_line_and_exit_2(capsys, flag, value):
    with pytest.raises(SystemExit) as exit_:
        main([*MUST_SHOW, flag, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "fix:" in err


def test_an_eager_serving_stack_holds_every_iteration_to_its_host_dispatch(capsys):
    from costmodel.inputs.serving_stack import get_serving_stack

    eager = _json(capsys, "--requests", "100", "--serving-stack", "hf-eager")["chosen"]["at_rate"]
    compiled = _json(capsys, "--requests", "100")["chosen"]["at_rate"]
    host_s = get_serving_stack("hf-eager").host_step_s(num_layers=32)  # llama3-8b
    assert eager["tpot_p50_s"] == pytest.approx(host_s, rel=0.01) and compiled["tpot_p50_s"] < 0.5 * host_s


def test_an_fp8_kv_cache_holds_twice_the_blocks(capsys):
    plain = _json(capsys, "--requests", "50")["chosen"]["at_rate"]["kv_blocks"]
    fp8 = _json(capsys, "--requests", "50", "--kv-cache-dtype", "fp8")["chosen"]["at_rate"]["kv_blocks"]
    assert fp8 == pytest.approx(2 * plain, rel=0.01)


def test_int4_weights_hold_more_blocks_and_a_gptq_kernel_prefills_slower(capsys):
    plain = _json(capsys, "--requests", "50")["chosen"]["at_rate"]
    fused = _json(capsys, "--requests", "50", "--frozen-dtype", "int4")["chosen"]["at_rate"]
    exllama = _json(capsys, "--requests", "50", "--frozen-dtype", "int4", "--weight-kernel", "exllama")["chosen"]["at_rate"]
    assert fused["kv_blocks"] > plain["kv_blocks"] and exllama["kv_blocks"] == fused["kv_blocks"]
    assert exllama["ttft_p50_s"] > fused["ttft_p50_s"]  # a 512-token prompt reconstructs every fp16 weight
    assert main([*MUST_SHOW, "--weight-kernel", "exllama"]) == 2
    assert "runs int4 weights, not bf16" in capsys.readouterr().err


def test_torch_compiles_int4_decode_reads_its_group_scales(capsys):
    base = ("--requests", "50", "--frozen-dtype", "int4", "--serving-stack", "torch-compile")
    coarse = _json(capsys, *base, "--weight-group-size", "128")["chosen"]["at_rate"]
    fine = _json(capsys, *base, "--weight-group-size", "32")["chosen"]["at_rate"]
    assert fine["tpot_p50_s"] > coarse["tpot_p50_s"]  # a bf16 scale and zero per 32 weights instead of per 128
