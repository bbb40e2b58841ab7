"""Tests `planner/budget.py`: the compute-optimal size meets the Chinchilla rule at the plan's delivered compute."""

import pytest

from costmodel.errors import InvalidConfigError
from planner.budget import CHINCHILLA_TOKENS_PER_PARAM, compute_optimal_model


def test_rule_compute_matches_the_compute_the_plan_delivers_and_neighbours_bracket_it():
    r = compute_optimal_model(devices=64, hardware="h100-sxm", days=7)
    assert r.tokens == CHINCHILLA_TOKENS_PER_PARAM * r.params
    assert r.delivered_tokens == pytest.approx(r.plan.predicted.tokens_per_s * 7 * 86_400)
    assert r.compute_flops == pytest.approx(r.delivered_flops, rel=0.05)
    # The sizes planned bracket the answer: a bigger model delivers fewer tokens than the rule asks, a smaller one more.
    planned = [p for p in r.probes if p.delivered_tokens is not None]
    assert any(p.params > r.params and 20 * p.params > p.delivered_tokens for p in planned)
    assert any(p.params < r.params and 20 * p.params < p.delivered_tokens for p in planned)


def test_more_days_buy_a_bigger_model():
    small = compute_optimal_model(devices=8, hardware="a100-80gb", days=0.01, family="gpt2")
    big = compute_optimal_model(devices=8, hardware="a100-80gb", days=0.1, family="gpt2")
    assert big.params > small.params and big.tokens > small.tokens


def test_unknown_family_and_nonpositive_days_get_one_line_errors():
    with pytest.raises(InvalidConfigError, match="unknown family"):
        compute_optimal_model(devices=8, days=1, family="bert")
    with pytest.raises(InvalidConfigError, match="days"):
        compute_optimal_model(devices=8, days=0)
