"""Tests `planner/config.py`: presets, Hugging Face configs, bad input."""

import json

import pytest

from costmodel.errors import InvalidConfigError, UnsupportedError
from planner.config import from_hf_config, load_model, model_notes, positions_note, train_config

# Published parameter counts (model cards / papers), checked within 0.5 %.
PUBLISHED_PARAMS = {
    "gpt2": 124e6,
    "gpt2-xl": 1.56e9,
    "llama3-8b": 8.03e9,
    "llama3-70b": 70.6e9,
    "llama3-405b": 405.9e9,
    "mixtral-8x7b": 46.7e9,
    "llama2-7b": 6.74e9,
    "llama2-70b": 69.0e9,
    "megatron-gpt-175b": 175e9,
    "megatron-gpt-1t": 1008e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_preset_parameter_counts_match_published(name):
    assert load_model(name).total_params == pytest.approx(PUBLISHED_PARAMS[name], rel=5e-3)


def test_megatron_presets_match_the_published_runs_table():
    # Narayanan et al. Table 1 "number of parameters (billion)" column.
    for name, billions in [("megatron-gpt-1.7b", 1.7), ("megatron-gpt-18.4b", 18.4), ("megatron-gpt-529.6b", 529.6)]:
        assert load_model(name).total_params / 1e9 == pytest.approx(billions, rel=3e-2)


def test_mixtral_active_parameters_per_token():
    cfg = load_model("mixtral-8x7b")
    active = cfg.embedding_params + cfg.num_layers * cfg.active_params_per_layer
    assert active == pytest.approx(12.9e9, rel=1e-2)  # Mixtral paper: 13B active


def _write(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_hf_llama_config_matches_preset(tmp_path):
    hf = {
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "rope_theta": 500000.0,
        "max_position_embeddings": 8192, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "architectures": ["LlamaForCausalLM"],
    }
    cfg = load_model(_write(tmp_path, hf))
    assert cfg.total_params == load_model("llama3-8b").total_params


def test_hf_gpt2_aliases(tmp_path):
    hf = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024,
          "vocab_size": 50257, "n_inner": None, "activation_function": "gelu_new"}
    cfg = load_model(_write(tmp_path, hf))
    assert (cfg.ffn_size, cfg.norm, cfg.positions, cfg.tie_embeddings) == (3072, "layernorm", "learned", True)
    assert cfg.total_params == 124439808 + 47 * 768  # GPT-2's 124,439,808 with its table padded 50257 -> 50304 rows


def test_qwen3_explicit_head_dim_and_qwen2_qkv_bias():
    qwen3 = from_hf_config({"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
                            "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
                            "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True})
    assert qwen3.head_dim == 128 and qwen3.num_heads * qwen3.head_dim != qwen3.hidden_size
    qwen2 = from_hf_config({"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
                            "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                            "vocab_size": 151936, "tie_word_embeddings": True})
    assert qwen2.qkv_bias and not qwen2.out_bias


def test_moe_configs():
    mixtral = from_hf_config({"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                              "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2})
    assert mixtral.total_params == load_model("mixtral-8x7b").total_params
    qwen_moe = from_hf_config({"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
                               "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                               "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
                               "vocab_size": 151936, "num_experts": 60, "num_experts_per_tok": 4})
    # Qwen1.5-MoE-A2.7B: 14.3 B parameters in total (model card).
    assert qwen_moe.total_params == pytest.approx(14.3e9, rel=5e-3)
    assert (qwen_moe.moe_ffn_size, qwen_moe.shared_expert_ffn_size) == (1408, 5632)


def test_native_format_round_trips(tmp_path):
    cfg = load_model("llama3-8b")
    again = load_model(_write(tmp_path, cfg.model_dump_json(), name="mine.json"))
    assert again == cfg  # the file's own name wins over the file name


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "not an object"),
        (json.dumps({"model_type": "falcon", "hidden_size": 8}), "unknown architecture model_type='falcon'"),
        (json.dumps({"foo": 1}), "cannot tell the architecture"),
        (json.dumps({"model_type": "llama", "hidden_size": 100, "intermediate_size": 8, "num_hidden_layers": 2,
                     "num_attention_heads": 3, "vocab_size": 10}), "num_attention_heads=3 does not divide hidden_size=100"),
        (json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 3, "vocab_size": 10}), "does not divide num_attention_heads"),
        (json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "vocab_size": 10}), "missing 'intermediate_size'"),
        (json.dumps({"model_type": "llama", "hidden_size": -64, "intermediate_size": 8, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "vocab_size": 10}), "hidden_size"),
        (json.dumps({"model_type": "gpt2", "n_embd": "wide", "n_layer": 2, "n_head": 2, "vocab_size": 10}), "n_embd"),
        (json.dumps({"name": "x", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "ffn_size": 8,
                     "vocab_size": 10, "colour": "red"}), "colour"),
    ],
)
def test_bad_config_files_give_one_line(tmp_path, content, message):
    with pytest.raises(InvalidConfigError, match=None) as info:
        load_model(_write(tmp_path, content))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_unknown_preset_lists_known_names():
    with pytest.raises(InvalidConfigError, match="unknown model 'llama9'.*llama3-8b"):
        load_model("llama9")
    with pytest.raises(InvalidConfigError, match=r"unknown model 'lama3-8b'; fix: did you mean 'llama3-8b', .*\? Otherwise use"):
        load_model("lama3-8b")


def test_missing_file():
    with pytest.raises(InvalidConfigError, match="does not exist"):
        load_model("/nonexistent/config.json")


def test_train_config_reports_the_flag():
    with pytest.raises(InvalidConfigError, match="--seq-len=0"):
        train_config(seq_len=0)


MISTRAL_7B_V01_HF = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
                     "rope_theta": 10000.0, "sliding_window": 4096}  # HF mistralai/Mistral-7B-v0.1 config.json


def test_mistral_sliding_window_and_rope_scaling_are_read():
    assert from_hf_config(MISTRAL_7B_V01_HF).sliding_window == 4096
    assert from_hf_config(MISTRAL_7B_V01_HF | {"sliding_window": None}).sliding_window is None
    # Qwen2 configs carry a window that use_sliding_window leaves off.
    qwen = {**MISTRAL_7B_V01_HF, "model_type": "qwen2", "sliding_window": 131072, "use_sliding_window": False}
    assert from_hf_config(qwen).sliding_window is None
    with pytest.raises(UnsupportedError, match="mixes full and sliding-window layers"):
        from_hf_config(qwen | {"use_sliding_window": True, "max_window_layers": 28})
    # Llama 3.1's: factor 8 over the 8192 trained positions, max_position_embeddings already 131072.
    llama31 = from_hf_config(MISTRAL_7B_V01_HF | {"model_type": "llama", "sliding_window": None, "max_position_embeddings": 131072,
                                                  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}})
    assert llama31.rope_scaling.kind == "llama3" and llama31.max_seq_len == 131072
    with pytest.raises(InvalidConfigError, match="rope_scaling"):
        from_hf_config(MISTRAL_7B_V01_HF | {"rope_scaling": "yarn"})


def test_a_sequence_beyond_the_positions_is_refused_or_served_by_rope_scaling():
    with pytest.raises(InvalidConfigError, match=r"seq_len=100000 exceeds llama3-8b's 8192 positions .*--seq-len 8192 or less"):
        positions_note(load_model("llama3-8b"), 100000)
    assert positions_note(load_model("llama3-8b"), 8192) is None
    yarn = from_hf_config(MISTRAL_7B_V01_HF | {"rope_scaling": {"type": "yarn", "factor": 4.0}})
    assert "rope_scaling yarn ×4" in positions_note(yarn, 131072)
    with pytest.raises(InvalidConfigError, match=r"131072 with its rope_scaling.*--seq-len 131072 or less"):
        positions_note(yarn, 131073)
    assert any("sliding-window" in note for note in model_notes(from_hf_config(MISTRAL_7B_V01_HF), 8192))
    assert model_notes(from_hf_config(MISTRAL_7B_V01_HF), 4096) == ()
