"""Tests `planner/cli/commands/inspect_cmd.py`: what plan inspect refuses before tracing."""

from planner.cli.main import main


def test_fp8_frozen_weights_are_refused_in_one_line_since_inspect_traces_bf16(capsys):
    assert main(["inspect", "--model", "gpt2", "--workload", "finetune-lora", "--frozen-dtype", "fp8"]) == 5
    err = capsys.readouterr().err.strip()
    assert "--frozen-dtype fp8 needs --precision fp8" in err and "fix:" in err and len(err.splitlines()) == 1
