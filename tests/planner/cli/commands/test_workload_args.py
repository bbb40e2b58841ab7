"""Tests `planner/cli/commands/workload_args.py`: --workload, LoRA's flags and the serving flags."""

import argparse

import pytest

from costmodel.errors import InvalidConfigError
from planner.cli.commands.workload_args import add_workload_arguments, serving_sizes, workload_from_args


def _parse(*argv):
    parser = argparse.ArgumentParser()
    add_workload_arguments(parser)
    return parser.parse_args(list(argv))


def test_lora_flags_become_settings():
    out = workload_from_args(_parse("--workload", "finetune-lora", "--lora-rank", "64", "--frozen-dtype", "int4"))
    assert out["workload"] == "finetune-lora" and out["lora"].rank == 64 and out["lora"].frozen_dtype == "int4"
    assert out["lora"].targets == ("q", "k", "v", "o") and out["lora"].target_label == "attn"


def test_lora_targets_name_single_matrices_and_groups():
    qv = workload_from_args(_parse("--workload", "finetune-lora", "--lora-targets", "v,q"))["lora"]
    assert qv.targets == ("q", "v")
    mixed = workload_from_args(_parse("--workload", "finetune-lora", "--lora-targets", "o,mlp,down"))["lora"]
    assert mixed.targets == ("o", "gate", "up", "down") and mixed.target_label == "o,mlp"


def test_pretraining_has_no_lora_settings_and_refuses_lora_flags():
    assert workload_from_args(_parse()) == {"workload": "pretrain", "lora": None, "inference": None}
    with pytest.raises(InvalidConfigError, match="--lora-rank applies to --workload finetune-lora.*fix: add --workload"):
        workload_from_args(_parse("--lora-rank", "8"))


def test_unknown_target_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        _parse("--workload", "finetune-lora", "--lora-targets", "attn,ffn")
    err = capsys.readouterr().err
    assert "'ffn' is not a LoRA target" in err and "fix: name matrices or groups, e.g. --lora-targets q,v" in err


def test_serving_flags_become_settings_and_sizes():
    args = _parse("--workload", "decode", "--batch", "8", "--context-len", "1024", "--kv-block-size", "32", "--frozen-dtype", "int8")
    out = workload_from_args(args)
    assert out["inference"].kv_block_size == 32 and out["inference"].weight_dtype == "int8" and out["lora"] is None
    assert serving_sizes(args) == {"global_batch": 8, "seq_len": 1024}
    assert serving_sizes(_parse("--workload", "prefill")) == {"global_batch": 1}
    assert serving_sizes(_parse()) == {}


def test_serving_flags_refused_for_training_and_latency_for_prefill():
    with pytest.raises(InvalidConfigError, match="--batch applies to --workload decode.*fix: add --workload decode"):
        workload_from_args(_parse("--batch", "8"))
    with pytest.raises(InvalidConfigError, match="--max-token-latency-ms bounds decode steps"):
        workload_from_args(_parse("--workload", "prefill", "--max-token-latency-ms", "10"))
    with pytest.raises(InvalidConfigError, match="--frozen-dtype applies to finetune-lora, prefill and decode"):
        workload_from_args(_parse("--frozen-dtype", "int8"))


def test_fp8_frozen_dtype_is_a_lora_choice():
    out = workload_from_args(_parse("--workload", "finetune-lora", "--frozen-dtype", "fp8"))
    assert out["lora"].frozen_dtype == "fp8"


def test_serving_takes_fp8_weights_and_an_fp8_kv_cache():
    out = workload_from_args(_parse("--workload", "decode", "--frozen-dtype", "fp8", "--kv-cache-dtype", "fp8"))
    assert out["inference"].weight_dtype == "fp8" and out["inference"].kv_cache_dtype == "fp8"
    assert workload_from_args(_parse("--workload", "prefill"))["inference"].kv_cache_dtype == "auto"
    with pytest.raises(InvalidConfigError, match="--kv-cache-dtype applies to --workload decode"):
        workload_from_args(_parse("--kv-cache-dtype", "fp8"))


def test_gptq_kernels_run_int4_serving_weights():
    out = workload_from_args(_parse("--workload", "decode", "--frozen-dtype", "int4", "--weight-kernel", "exllama"))
    assert out["inference"].weight_kernel == "exllama"
    assert workload_from_args(_parse("--workload", "decode"))["inference"].weight_kernel == "fused"
    with pytest.raises(InvalidConfigError, match="--weight-kernel autogptq-cuda-old runs int4 weights, not int8"):
        workload_from_args(_parse("--workload", "decode", "--frozen-dtype", "int8", "--weight-kernel", "autogptq-cuda-old"))
    with pytest.raises(InvalidConfigError, match="--weight-kernel applies to --workload decode"):
        workload_from_args(_parse("--weight-kernel", "exllama"))


def test_document_length_packs_training_sequences_only():
    assert workload_from_args(_parse("--document-len", "512"))["document_len"] == 512
    assert workload_from_args(_parse("--workload", "finetune-lora", "--document-len", "512"))["document_len"] == 512
    with pytest.raises(InvalidConfigError, match="--document-len packs training sequences, not decode"):
        workload_from_args(_parse("--workload", "decode", "--document-len", "512"))


def test_an_int4_group_size_is_a_serving_setting():
    out = workload_from_args(_parse("--workload", "decode", "--frozen-dtype", "int4", "--weight-group-size", "32"))
    assert out["inference"].weight_group_size == 32
    assert workload_from_args(_parse("--workload", "decode"))["inference"].weight_group_size == 128
    with pytest.raises(InvalidConfigError, match="--weight-group-size applies to --workload decode"):
        workload_from_args(_parse("--weight-group-size", "32"))
