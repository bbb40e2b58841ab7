"""Tests `costmodel/inputs/workload.py` and the workload fields of `costmodel/inputs/train_config.py`."""

import pytest
from pydantic import ValidationError

from costmodel.errors import UnsupportedError
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.inputs.workload import FrozenDtype, LoraConfig, adapted_matrices, adapter_params_per_layer

LLAMA = ModelConfig(name="l", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_size=14336, vocab_size=128256)
MOE = ModelConfig(name="moe", hidden_size=256, num_layers=2, num_heads=4, ffn_size=512, vocab_size=100, num_experts=4,
                  experts_per_token=2)


def test_adapters_of_the_attention_and_mlp_match_hand_counts():
    r = 16
    attn = r * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096))
    mlp = r * 3 * (4096 + 14336)
    assert adapter_params_per_layer(LLAMA, LoraConfig(rank=r)) == attn
    assert adapter_params_per_layer(LLAMA, LoraConfig(rank=r, targets=("mlp", "attn"))) == attn + mlp


def test_tensor_parallelism_splits_one_half_of_each_adapter():
    lora = LoraConfig(rank=8)
    whole = adapter_params_per_layer(LLAMA, lora)
    split = adapter_params_per_layer(LLAMA, lora, tp=4)
    # wq: A whole, B split; wo: A split, B whole.
    assert split == 8 * ((4096 + 4096 / 4) + 2 * (4096 + 1024 / 4) + (4096 / 4 + 4096))
    assert whole / 4 < split < whole


def test_mlp_adapters_on_experts_are_refused_in_one_line():
    assert [a.name for a in adapted_matrices(MOE, LoraConfig())] == ["wq", "wk", "wv", "wo"]
    with pytest.raises(UnsupportedError, match="mixture-of-experts.*fix: use --lora-targets attn"):
        adapted_matrices(MOE, LoraConfig(targets=("attn", "mlp")))


def test_frozen_formats_bytes():
    assert [FrozenDtype(d).bytes for d in ("bf16", "int8", "int4", "fp8")] == [2.0, 1.0, 0.5, 1.0]
    assert FrozenDtype.FP8.jax_name == "float8_e4m3fn"


def test_nf4_counts_bitsandbytes_block_scales_and_double_quantization():
    n = 4096 * 11008  # one Llama 2 7B MLP matrix
    nf4_bytes = n / 2 + (n / 64) * 4  # 4-bit codes + one fp32 absmax per 64 weights
    nf4_dq_bytes = n / 2 + (n / 64) * 1 + (n / 64 / 256) * 4  # 8-bit absmax per 64 + fp32 absmax per 256 of them
    assert n * FrozenDtype.NF4.bytes == pytest.approx(nf4_bytes, rel=1e-12)
    assert n * FrozenDtype.NF4_DQ.bytes == pytest.approx(nf4_dq_bytes, rel=1e-12)
    # What double quantization saves per weight: Lit-GPT's 7B table rows differ by 0.279 GiB over ~6.5e9 weights.
    assert FrozenDtype.NF4.bytes - FrozenDtype.NF4_DQ.bytes == pytest.approx(0.0466, abs=1e-4)
    assert FrozenDtype.NF4.is_bitsandbytes and not FrozenDtype.INT4.is_bitsandbytes


def test_nf4_has_no_jax_format_and_says_so_in_one_line():
    with pytest.raises(UnsupportedError, match="nf4-dq frozen weights .* are not lowered") as err:
        FrozenDtype.NF4_DQ.jax_name
    assert "\n" not in str(err.value) and "fix:" in str(err.value)
    assert FrozenDtype.INT4.jax_name == "int4"


def test_train_config_fills_lora_defaults_and_refuses_lora_settings_elsewhere():
    assert TrainConfig().workload.trains_base_weights and TrainConfig().workload.adapter_rank == 0
    assert TrainConfig(workload="finetune-lora").workload.lora == LoraConfig()
    assert TrainConfig(workload="finetune-full").workload.trains_base_weights
    with pytest.raises(ValidationError, match="apply to finetune-lora only"):
        TrainConfig(workload="pretrain", lora=LoraConfig())
    with pytest.raises(ValidationError):
        LoraConfig(targets=())


def test_workload_round_trips_through_json():
    t = TrainConfig(workload="finetune-lora", lora=LoraConfig(rank=64, frozen_dtype="int4", targets=("mlp", "attn", "mlp")))
    assert TrainConfig.model_validate_json(t.model_dump_json()) == t
    assert t.workload.lora.target_label == "attn,mlp" and len(t.workload.lora.targets) == 7


def test_fused_qkv_adapter_has_one_a_and_the_qkv_width_of_b():
    r = 16
    fused = adapted_matrices(LLAMA, LoraConfig(rank=r, fused_qkv=True))
    assert [(a.name, a.d_in, a.d_out) for a in fused] == [("wqkv", 4096, 4096 + 2 * 1024), ("wo", 4096, 4096)]
    assert adapter_params_per_layer(LLAMA, LoraConfig(rank=r, fused_qkv=True)) == r * ((4096 + 6144) + (4096 + 4096))
    with pytest.raises(ValidationError):
        LoraConfig(dropout=1.0)


def test_single_matrix_targets_have_the_napkin_count_and_groups_are_shorthands():
    r, d, kv, f = 8, 4096, 1024, 14336
    assert adapter_params_per_layer(LLAMA, LoraConfig(rank=r, targets="q,v")) == r * (d + d) + r * (d + kv)
    assert adapter_params_per_layer(LLAMA, LoraConfig(rank=r, targets=("gate", "down"))) == r * (d + f) + r * (f + d)
    assert LoraConfig(targets="attn") == LoraConfig(targets="q,k,v,o") == LoraConfig()
    assert [a.name for a in adapted_matrices(LLAMA, LoraConfig(targets="down,up,o"))] == ["wo", "w_in", "w_out"]
    with pytest.raises(ValidationError, match="'qkv' is not a LoRA target"):
        LoraConfig(targets="qkv")


def test_a_fused_qkv_adapter_needs_all_three_projections():
    assert [a.name for a in adapted_matrices(LLAMA, LoraConfig(targets="q,k,v", fused_qkv=True))] == ["wqkv"]
    with pytest.raises(ValidationError, match="fused qkv adapter adapts q, k and v together"):
        LoraConfig(targets="q,v", fused_qkv=True)
