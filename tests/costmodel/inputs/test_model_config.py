"""Tests `costmodel/inputs/model_config.py`: the padded vocabulary and what it splits."""

import pytest

from costmodel.inputs.model_config import ModelConfig
from costmodel.workloads.flops import matmul_params
from planner.config import load_model


def _model(vocab_size: int, **kw) -> ModelConfig:
    return ModelConfig(name="m", hidden_size=64, num_layers=1, num_heads=4, ffn_size=256, vocab_size=vocab_size, **kw)


@pytest.mark.parametrize(("vocab_size", "multiple", "padded"), [
    (50257, 128, 50304),    # GPT-2 as nanoGPT and Megatron-LM at tp 1 pad it
    (50257, 1024, 51200),   # Megatron-LM at tp 8: 128 · 8
    (50304, 128, 50304),    # already a multiple: unchanged
    (32000, 128, 32000),    # Llama 2
    (128256, 128, 128256),  # Llama 3
    (151646, 128, 151680),  # Qwen2's tokenizer, padded as its checkpoints' 151936 rows are not
    (50, 128, 128),
    (50257, 1, 50257),      # unpadded
])
def test_padded_vocab_rounds_up_to_the_multiple(vocab_size, multiple, padded):
    assert _model(vocab_size, vocab_multiple=multiple).padded_vocab_size == padded


def test_gpt2_vocabulary_splits_over_power_of_two_tensor_axes_once_padded():
    gpt2 = load_model("gpt2")
    assert (gpt2.vocab_size, gpt2.padded_vocab_size) == (50257, 50304)
    assert [gpt2.vocab_shards(tp) for tp in (2, 4, 8, 16, 128)] == [2, 4, 8, 16, 128]
    assert gpt2.vocab_shards(5) == 1  # 50304 = 2^7 · 3 · 131: five does not divide it
    assert gpt2.vocab_per_shard(4) == 50304 / 4
    unpadded = gpt2.model_copy(update={"vocab_multiple": 1})
    assert [unpadded.vocab_shards(tp) for tp in (2, 4, 8)] == [1, 1, 1]


def test_params_and_model_flops_count_the_padded_rows():
    gpt2 = load_model("gpt2")
    unpadded = gpt2.model_copy(update={"vocab_multiple": 1})
    # A tied table: one padded 768-wide row per padding token.
    assert gpt2.embedding_params - unpadded.embedding_params == 47 * 768
    assert gpt2.total_params == 124_475_904 and unpadded.total_params == 124_439_808
    # Megatron-LM's num_floating_point_operations counts the padded vocabulary in the head's d·V.
    assert matmul_params(gpt2) - matmul_params(unpadded) == 47 * 768


def test_vocab_multiple_must_be_positive():
    with pytest.raises(ValueError, match="vocab_multiple"):
        _model(50257, vocab_multiple=0)
