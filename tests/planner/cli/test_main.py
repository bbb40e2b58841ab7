"""Tests `planner/cli/main.py` end to end: JSON outputs and one-line errors with exit codes."""

import json
import subprocess
import sys

import pytest

from planner.cli.main import main


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
    assert code == 0 and data["params"] == 124475904  # GPT-2's 124,439,808 with its table padded to 50304 rows
    assert (data["vocab_size"], data["padded_vocab_size"]) == (50257, 50304)
    assert {"params", "flops_per_step", "ops", "extract_time_s"} <= set(data)


def test_inspect_mesh_links(capsys):
    code, out, _ = _run(capsys, "inspect", "--model", "gpt2", "--global-batch", "2", "--mesh", "4x8", "--hardware", "h100-sxm", "--json")
    axes = json.loads(out)["mesh_axes"]
    assert code == 0 and axes["axis1"]["tiers"] == ["nvlink4"] and axes["axis0"]["tiers"] == ["ib-ndr400"]


def test_inspect_a_mesh_on_a_cluster_preset_without_a_model(capsys):
    code, out, _ = _run(capsys, "inspect", "--mesh", "8x4", "--hardware", "dgx-h100", "--json")
    data = json.loads(out)
    data_axis, tensor_axis = data["mesh_axes"]["axis0"], data["mesh_axes"]["axis1"]
    assert code == 0 and set(data) == {"cluster", "mesh_axes"} and data["cluster"].startswith("dgx-h100: 8× h100-sxm per node")
    assert data_axis["crosses"] == "2 per node over NVSwitch (nvlink4), then across 4 nodes over 8× 400 Gb/s NICs each, rail-aligned"
    assert (data_axis["rail_aligned"], data_axis["inter_bytes_per_s"]) == (True, 400e9 / 8 * 0.9)
    assert tensor_axis["crosses"] == "within a node over NVSwitch (nvlink4)" and tensor_axis["inter_bytes_per_s"] is None
    code, out, _ = _run(capsys, "inspect", "--mesh", "2x4x2", "--hardware", "a100-pcie-server")
    assert code == 0 and "through the spine" in out and "NVLink bridge" in out  # table cells wrap at 80 columns


def test_inspect_a_mesh_on_a_cluster_file(capsys, tmp_path):
    from costmodel.hardware.clusters import HARDWARE

    path = tmp_path / "mine.json"
    doc = json.loads(HARDWARE["dgx-a100"].model_dump_json())
    doc["inter_node"].update(nics_per_node=4, rail_optimized=False, spine_oversubscription=2)
    path.write_text(json.dumps({**doc, "name": "mine", "device": "a100-80gb"}))
    code, out, _ = _run(capsys, "inspect", "--mesh", "4x8", "--hardware", str(path), "--json")
    axis = json.loads(out)["mesh_axes"]["axis0"]
    assert code == 0 and axis["rail_aligned"] and "through the spine (not rail-optimised, spine 2:1 oversubscribed)" in axis["crosses"]
    assert axis["inter_bytes_per_s"] == pytest.approx(4 * 200e9 / 8 / 8 / 2 * 0.9)


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
    (["inspect"], 2, "plan inspect needs --model, --mesh or both"),
    (["inspect", "--mesh", "8x4", "--hardware", "t4", "--devices-per-node", "2"], 2, "would split t4's NICs"),
    (["inspect", "--model", "gpt2", "--seq-len", "4096"], 2, "learned positions"),
    (["inspect", "--model", "gpt2", "--global-batch", "0"], 2, "argument --global-batch: '0' is not a positive"),
    (["simulate", "--model", "llama3-8b", "--devices", "8", "--tp", "3", "--global-batch", "8"], 3, "not divisible by tp·pp·cp"),
    (["simulate", "--model", "llama3-8b", "--devices", "8", "--dp", "2", "--global-batch", "8"], 3, "but --devices=8"),
    (["simulate", "--model", "llama3-8b", "--devices", "6", "--tp", "6", "--global-batch", "8"], 3,
     "num_heads=32 is not divisible by tp=6"),
    (["simulate", "--model", "llama3-8b", "--devices", "8", "--global-batch", "12"], 3, "global_batch=12 is not divisible"),
    (["simulate", "--model", "llama3-8b", "--devices", "64", "--pp", "64", "--global-batch", "64"], 3, "num_layers=32 < pp"),
    (["simulate", "--model", "llama3-8b", "--hardware", "v100", "--devices", "8", "--global-batch", "8"], 2,
     "v100 has no bfloat16 peak; parts with one: "),
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


def test_plan_searches_and_writes_its_json_without_importing_jax(tmp_path):
    out = tmp_path / "plan.json"
    argv = ["--model", "gpt2", "--devices", "8", "--out", str(out)]
    probe = f"import sys; from planner.cli.main import main; main({argv!r}); print('jax' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "False", proc.stderr[-2000:]  # JAX's import would be a third of the run
    assert json.loads(out.read_text())["param_specs"]["layers/mlp/w_in"]


def test_fp8_on_a_part_without_an_fp8_peak_exits_2_with_one_line(capsys):
    code, out, err = _run(capsys, "--model", "llama3-8b", "--devices", "8", "--hardware", "a100-80gb", "--precision", "fp8")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("plan: error: a100-80gb has no float8 peak; parts with one: ") and "h100-sxm" in err


def test_simulate_fp8_json_has_the_fields_of_bf16(capsys):
    args = ("simulate", "--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "8", "--tp", "8", "--global-batch", "8",
            "--micro-batch", "1", "--seq-len", "2048", "--json")
    _, bf16, _ = _run(capsys, *args)
    code, fp8, _ = _run(capsys, *args, "--precision", "fp8")
    bf16, fp8 = json.loads(bf16), json.loads(fp8)
    assert code == 0 and set(fp8) == set(bf16) and fp8["step_time_s"] < bf16["step_time_s"]


def test_tf32_on_a_v100_is_refused(capsys):
    code, _, err = _run(capsys, "simulate", "--model", "gpt2", "--hardware", "v100", "--devices", "1", "--global-batch", "1",
                        "--precision", "tf32")
    assert code == 2 and "v100 has no tf32 peak" in err
