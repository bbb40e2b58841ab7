"""Tests `planner/budget.py`: the compute-optimal size meets the Chinchilla rule at the plan's delivered compute."""

import pytest

from costmodel.errors import InvalidConfigError
from planner.budget import CHINCHILLA_TOKENS_PER_PARAM, MFU_GUESS, compute_optimal_model


def test_rule_compute_matches_the_compute_the_plan_delivers_and_neighbours_bracket_it():
    r = compute_optimal_model(devices=64, hardware="h100-sxm", days=7)
    assert r.tokens == CHINCHILLA_TOKENS_PER_PARAM * r.params
    assert r.delivered_tokens == pytest.approx(r.plan.predicted.tokens_per_s * 7 * 86_400)
    assert r.compute_flops == pytest.approx(r.delivered_flops, rel=0.05)
    # The sizes planned bracket the answer: a bigger model delivers fewer tokens than the rule asks, a smaller one more.
    planned = [p for p in r.probes if p.delivered_tokens is not None]
    assert any(p.params > r.params and 20 * p.params > p.delivered_tokens for p in planned)
    assert any(p.params < r.params and 20 * p.params < p.delivered_tokens for p in planned)


def test_the_batch_rule_is_evaluated_once_at_the_budgets_compute_and_every_size_uses_it():
    r = compute_optimal_model(devices=8, hardware="a100-80gb", days=0.01, family="gpt2")
    budget_flops = 8 * 312e12 * MFU_GUESS * 0.01 * 86_400
    assert not r.batch.given and r.batch.compute_flops == pytest.approx(budget_flops)
    assert r.batch.sequences % 8 == 0 and r.plan.train.global_batch == r.batch.sequences
    assert r.batch.tokens == r.batch.sequences * r.plan.train.seq_len == r.batch.sequences * 1024  # gpt2's positions
    assert "guessed" in r.batch.reason and "8 × 312 TFLOP/s" in r.batch.reason


def test_a_given_batch_is_kept_for_every_size():
    r = compute_optimal_model(devices=8, hardware="a100-80gb", days=0.01, family="gpt2", global_batch=64)
    assert r.batch.given and r.batch.sequences == r.plan.train.global_batch == 64


def test_more_days_buy_a_bigger_model():
    small = compute_optimal_model(devices=8, hardware="a100-80gb", days=0.01, family="gpt2")
    big = compute_optimal_model(devices=8, hardware="a100-80gb", days=0.1, family="gpt2")
    assert big.params > small.params and big.tokens > small.tokens


def test_unknown_family_and_nonpositive_days_get_one_line_errors():
    with pytest.raises(InvalidConfigError, match="unknown family"):
        compute_optimal_model(devices=8, days=1, family="bert")
    with pytest.raises(InvalidConfigError, match="days"):
        compute_optimal_model(devices=8, days=0)
