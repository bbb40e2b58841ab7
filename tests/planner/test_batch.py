"""Tests `planner/batch.py`: DeepSeek LLM's batch rule, its rounding to the devices, and the starved-batch check."""

import pytest

from costmodel.inputs.layout import Layout
from planner.api import layout_plan, plan
from planner.batch import devices_batch, flops_per_token, planned_batch, starved_warning
from planner.config import load_model


def test_flops_per_token_is_the_papers_M():
    # M = 72·n_layer·d² + 6·n_layer·d·l_seq for multi-head attention and a gated MLP of width 8d/3.
    cfg = load_model("llama3-70b").model_copy(update={"num_kv_heads": 64, "ffn_size": 8 * 8192 // 3})
    assert flops_per_token(cfg, 4096) == pytest.approx(72 * 80 * 8192**2 + 6 * 80 * 8192 * 4096, rel=1e-3)


def test_the_rule_gives_deepseek_67bs_published_batch_and_grows_with_the_training_length():
    # DeepSeek LLM 67B (Table 2: 95 layers, width 8192, 64 heads, 8 KV heads, MLP 22016; 2e12 tokens of 4096) trained
    # with 4608 × 4096 = 18.9 M tokens per step.
    cfg = load_model("llama3-70b").model_copy(update={"num_layers": 95, "ffn_size": 22016, "vocab_size": 102400})
    choice = planned_batch(cfg, seq_len=4096, n_devices=1, tokens=2e12)
    assert choice.rule_tokens == pytest.approx(0.292 * choice.compute_flops ** 0.3271)
    assert choice.rule_tokens == pytest.approx(18.9e6, rel=0.1)
    longer = planned_batch(cfg, seq_len=4096, n_devices=1, tokens=8e12)
    assert longer.rule_tokens == pytest.approx(choice.rule_tokens * 4 ** 0.3271)


def test_without_tokens_the_rule_assumes_chinchilla_length_and_says_so():
    cfg = load_model("llama3-8b")
    assumed = planned_batch(cfg, seq_len=2048, n_devices=32, tokens=None)
    given = planned_batch(cfg, seq_len=2048, n_devices=32, tokens=20 * cfg.total_params)
    assert assumed.sequences == given.sequences and "Chinchilla" in assumed.reason and "Chinchilla" not in given.reason


@pytest.mark.parametrize("devices", [1, 8, 24, 1000, 65536])
def test_the_batch_is_a_multiple_of_the_devices_with_at_least_one_sequence_each(devices):
    choice = planned_batch(load_model("gpt2"), seq_len=1024, n_devices=devices, tokens=None)
    assert choice.sequences % devices == 0 and choice.sequences >= devices and choice.tokens == 1024 * choice.sequences


def test_devices_batch_and_the_warning_threshold():
    assert devices_batch(100, 32) == 96 and devices_batch(10, 32) == 32 and devices_batch(64, 32) is None
    assert starved_warning(100, 0.30, better_sequences=96, better_mfu=0.32, layout_text="a", better_layout_text="b") is None
    assert "--global-batch 96" in starved_warning(100, 0.20, better_sequences=96, better_mfu=0.30, layout_text="a",
                                                  better_layout_text="b")


def test_the_library_plans_the_batch_unless_given():
    planned = plan("gpt2", mesh="8", hardware="a100-80gb")
    given = plan("gpt2", mesh="8", hardware="a100-80gb", global_batch=64)
    assert planned.train.global_batch == planned.batch.sequences and not planned.batch.given
    assert given.train.global_batch == 64 and given.batch.given and given.batch.warning is None
    by_hand = layout_plan("gpt2", Layout(dp=8), hardware="a100-80gb")
    assert by_hand.train.global_batch == planned.train.global_batch
    assert plan("gpt2", mesh="8", workload="decode").batch is None
