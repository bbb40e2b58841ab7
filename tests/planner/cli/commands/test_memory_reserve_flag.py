"""``--memory-reserve-gib`` on plan, plan simulate, plan largest and plan budget: it moves the fit threshold, never the
predicted memory, and the summaries say what the plan has of the part's usable memory."""

import json

import pytest

from planner.cli.main import main

# Llama 3 8B on 8 H100 with ZeRO 3 and full recompute needs 18.0 GiB a device: inside 79.6 usable less the
# default 4.0 GiB reserve, outside it less a 70 GiB one.
SIMULATE = ("simulate", "--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "8", "--zero", "3", "--global-batch", "8",
            "--micro-batch", "1", "--seq-len", "1024", "--recompute", "full", "--json")


def _simulate(capsys, *flags):
    assert main([*SIMULATE, *flags]) == 0
    return json.loads(capsys.readouterr()[0])


def test_the_reserve_moves_the_fit_threshold_not_the_prediction(capsys):
    default, tight = _simulate(capsys), _simulate(capsys, "--memory-reserve-gib", "70")
    assert default["memory"]["total_bytes"] == tight["memory"]["total_bytes"] and default["step_time_s"] == tight["step_time_s"]
    assert default["memory"]["hbm_bytes"] == 81559 * 2**20 and tight["memory"]["reserve_bytes"] == 70 * 2**30
    assert default["fits"] is True and tight["fits"] is False


def test_the_summary_states_usable_memory_the_reserve_and_jax_fraction(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one table row a line
    assert main([*SIMULATE[:-1], "--memory-reserve-gib", "2"]) == 0
    out = " ".join(capsys.readouterr()[0].split())
    assert "GiB of 79.6 GiB usable (2.0 GiB reserved)" in out and "XLA_PYTHON_CLIENT_MEM_FRACTION" in out


@pytest.mark.parametrize("command", [("--model", "gpt2", "--devices", "1"), ("largest", "--devices", "1", "--family", "gpt2"),
                                     ("budget", "--devices", "1", "--days", "1", "--family", "gpt2")])
def test_every_planning_command_takes_the_flag(capsys, command):
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--hardware", "a100-80gb", "--memory-reserve-gib", "-1"])
    assert exit_.value.code == 2 and "--memory-reserve-gib: '-1' is not a finite non-negative number" in capsys.readouterr()[1]
