"""Tests `planner/cli/commands/budget_cmd.py`: the JSON contract and the 1024 × H100, 30-day answer."""

import json

import pytest

from planner.cli.main import main


def test_1024_h100_for_30_days_meets_the_rule_within_5_percent_of_the_delivered_flops(capsys):
    code = main(["budget", "--devices", "1024", "--hardware", "h100-sxm", "--days", "30", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and {"params", "tokens", "model", "layout", "predicted", "batch"} <= out.keys()
    assert out["batch"]["sequences"] % 1024 == 0 and out["batch"]["sequences"] > 1024  # the rule's, not one per device
    n, d = out["params"], out["tokens"]
    assert d / n == 20 and "Chinchilla" in out["rule"]
    # Delivered: the plan's tokens/s over 30 days of seconds, 6 FLOPs per parameter per token.
    delivered_flops = 6 * n * out["predicted"]["tokens_per_s"] * 30 * 86_400
    assert 6 * n * d == pytest.approx(delivered_flops, rel=0.05)
    assert 0 < out["predicted"]["mfu"] < 1 and out["model"]["num_layers"] > 0
    lay = out["layout"]
    assert lay["dp"] * lay["tp"] * lay["pp"] * lay["cp"] == 1024


def test_summary_names_the_rule_and_the_plan(capsys):
    code = main(["budget", "--devices", "8", "--hardware", "a100-80gb", "--days", "0.05", "--family", "gpt2"])
    out = capsys.readouterr().out
    assert code == 0 and "D/N = 20" in out and "MFU" in out and "delivered" in out
    assert "batch: " in out and "DeepSeek LLM's B = 0.292·C^0.3271" in out and "guessed" in out


def test_negative_days_exit_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["budget", "--devices", "8", "--days", "-3"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "--days" in err
