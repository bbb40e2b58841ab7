"""Tests `planner/cli.py` end to end: JSON outputs and one-line errors with exit codes."""

import json
import subprocess
import sys

import pytest

from planner.cli import main


def _run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as parse_error:  # argparse refuses a flag's value with the same one line
        code = parse_error.code
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_json(capsys):
    code, out, _ = _run(capsys, "inspect", "--model", "gpt2", "--global-batch", "2", "--json")
    data = json.loads(out)
    assert code == 0 and data["params"] == 124439808
    assert {"params", "flops_per_step", "ops", "extract_time_s"} <= set(data)


def test_inspect_mesh_links(capsys):
    code, out, _ = _run(capsys, "inspect", "--model", "gpt2", "--global-batch", "2", "--mesh", "4x8", "--hardware", "h100-sxm", "--json")
    axes = json.loads(out)["mesh_axes"]
    assert code == 0 and axes["axis1"]["tiers"] == ["nvlink4"] and axes["axis0"]["tiers"] == ["ib-ndr400"]


def test_simulate_json_has_the_documented_keys(capsys):
    code, out, _ = _run(capsys, "simulate", "--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "16", "--tp", "2",
                        "--global-batch", "32", "--micro-batch", "2", "--seq-len", "4096", "--recompute", "selective", "--json")
    data = json.loads(out)
    assert code == 0
    assert {"step_time_s", "mfu", "hfu", "tokens_per_s", "fits", "memory", "breakdown"} <= set(data)
    items = {"per_device_bytes", "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "temporary_bytes"}
    assert items <= set(data["memory"])
    assert data["layout"]["dp"] == 8 and data["step_time_s"] > 0


def test_simulate_table_and_timeline(capsys, tmp_path):
    png = tmp_path / "timeline.png"
    code, out, _ = _run(capsys, "simulate", "--model", "megatron-gpt-22b", "--hardware", "a100-80gb", "--devices", "16",
                        "--tp", "8", "--pp", "2", "--global-batch", "8", "--attention", "materialized", "--timeline", str(png))
    assert code == 0 and "step time" in out and "pipeline bubble" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["inspect", "--model", "llama9"], 2, "unknown model 'llama9'"),
    (["inspect", "--model", "/nonexistent/config.json"], 2, "does not exist"),
    (["inspect", "--model", "gpt2", "--mesh", "0x4"], 2, "not a positive axis size"),
    (["inspect", "--model", "gpt2", "--mesh", "8x4", "--hardware", "h900"], 2, "unknown hardware 'h900'"),
    (["inspect", "--model", "gpt2", "--seq-len", "4096"], 2, "learned positions"),
    (["inspect", "--model", "gpt2", "--global-batch", "0"], 2, "argument --global-batch: '0' is not a positive"),
    (["simulate", "--model", "llama3-8b", "--devices", "8", "--tp", "3", "--global-batch", "8"], 3, "not divisible by tp·pp·cp"),
    (["simulate", "--model", "llama3-8b", "--devices", "8", "--dp", "2", "--global-batch", "8"], 3, "but --devices=8"),
    (["simulate", "--model", "llama3-8b", "--devices", "6", "--tp", "6", "--global-batch", "8"], 3,
     "num_heads=32 is not divisible by tp=6"),
    (["simulate", "--model", "llama3-8b", "--devices", "8", "--global-batch", "12"], 3, "global_batch=12 is not divisible"),
    (["simulate", "--model", "llama3-8b", "--devices", "64", "--pp", "64", "--global-batch", "64"], 3, "num_layers=32 < pp"),
    (["simulate", "--model", "llama3-8b", "--hardware", "v100", "--devices", "8", "--global-batch", "8"], 5, "v100 has no bfloat16"),
    (["validate", "/nonexistent/plan.json", "--compile-only"], 2, "does not exist"),
    (["validate", "/nonexistent/plan.json", "--processes", "2"], 5, "add --compile-only"),
])
def test_bad_input_gets_one_line_and_an_exit_code(capsys, argv, code, message):
    got, out, err = _run(capsys, *argv)
    assert got == code and out == ""
    assert err.startswith("plan: error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("content", ["{oops", '{"model_type": "falcon"}', '{"model_type": "llama", "hidden_size": 10, '
                                     '"intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 3, "vocab_size": 9}'])
def test_bad_config_files_from_the_command_line(capsys, tmp_path, content):
    path = tmp_path / "config.json"
    path.write_text(content)
    code, _, err = _run(capsys, "inspect", "--model", str(path))
    assert code == 2 and err.startswith("plan: error: ") and err.count("\n") == 1
    assert path.read_text() == content  # never touched


def test_console_script_prints_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "inspect", "--model", "nope"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "unknown model 'nope'" in proc.stderr
