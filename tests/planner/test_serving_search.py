"""Tests `planner/serving_search.py`: serving layouts under memory and the per-token latency bound."""

import pytest

from costmodel.errors import InfeasibleError
from costmodel.machine import load_machine
from costmodel.train_config import TrainConfig
from planner.config import load_model
from planner.serving_search import choose_serving_layout

H100 = load_machine("h100-sxm")


def _decode(batch, context, **inference):
    return TrainConfig(workload="decode", global_batch=batch, seq_len=context, inference=inference or None)


def test_the_choice_has_the_most_tokens_per_s_and_the_runners_up_say_why_they_lost():
    choice = choose_serving_layout(load_model("llama3-8b"), _decode(64, 4096), H100, splits=None, n_devices=8)
    assert all(e.tokens_per_s <= choice.best.tokens_per_s for e, _ in choice.runners_up)
    assert all("fewer tokens/s" in why or "does not fit" in why for _, why in choice.runners_up)


def test_a_latency_bound_trades_throughput_for_latency():
    model, mesh = load_model("llama3-8b"), ((4, 2, 1, 1), (1, 8, 1, 1), (8, 1, 1, 1), (2, 4, 1, 1))
    free = choose_serving_layout(model, _decode(64, 512), H100, splits=mesh, n_devices=8)
    quickest = min(e.time_per_output_token_s for e in [free.best, *(e for e, _ in free.runners_up)])
    if free.best.time_per_output_token_s == quickest:
        pytest.skip("the throughput choice is already the quickest")
    bound_ms = 1e3 * (quickest + free.best.time_per_output_token_s) / 2
    bounded = choose_serving_layout(model, _decode(64, 512, max_token_latency_ms=bound_ms), H100, splits=mesh, n_devices=8)
    assert bounded.latency_bound and bounded.best.time_per_output_token_s * 1e3 <= bound_ms


def test_an_unreachable_bound_names_the_best_latency():
    with pytest.raises(InfeasibleError, match=r"within 0.1 ms per output token: the best reachable is \d+\.\d+ ms"):
        choose_serving_layout(load_model("llama3-8b"), _decode(1, 2048, max_token_latency_ms=0.1), H100, splits=None, n_devices=8)


def test_a_model_too_large_for_the_devices_is_refused_with_its_least_memory():
    with pytest.raises(InfeasibleError, match="llama3-70b does not fit for decode on 1× h100-sxm.*fix: use more devices"):
        choose_serving_layout(load_model("llama3-70b"), _decode(1, 2048), H100, splits=None, n_devices=1)
    int4 = choose_serving_layout(load_model("llama3-70b"), _decode(1, 2048, weight_dtype="int4"), H100, splits=None, n_devices=1)
    assert int4.best.fits
