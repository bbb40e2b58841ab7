"""Tests `planner/commands/workload_args.py`: --workload and LoRA's flags."""

import argparse

import pytest

from costmodel.errors import InvalidConfigError
from planner.commands.workload_args import add_workload_arguments, workload_from_args


def _parse(*argv):
    parser = argparse.ArgumentParser()
    add_workload_arguments(parser)
    return parser.parse_args(list(argv))


def test_lora_flags_become_settings():
    out = workload_from_args(_parse("--workload", "finetune-lora", "--lora-rank", "64", "--frozen-dtype", "int4"))
    assert out["workload"] == "finetune-lora" and out["lora"].rank == 64 and out["lora"].frozen_dtype == "int4"
    assert out["lora"].targets == ("attn",)


def test_pretraining_has_no_lora_settings_and_refuses_lora_flags():
    assert workload_from_args(_parse()) == {"workload": "pretrain", "lora": None}
    with pytest.raises(InvalidConfigError, match="--lora-rank applies to --workload finetune-lora.*fix: add --workload"):
        workload_from_args(_parse("--lora-rank", "8"))


def test_unknown_target_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        _parse("--workload", "finetune-lora", "--lora-targets", "attn,ffn")
    assert "'ffn' is not a LoRA target group" in capsys.readouterr().err
