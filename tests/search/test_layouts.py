"""Tests `search/layouts.py`: candidate generation, pruning, the exhaustive optimum."""

import math

import pytest

from costmodel.errors import InfeasibleError
from costmodel.layout import Recompute
from costmodel.machine import load_machine
from costmodel.model_config import ModelConfig
from costmodel.simulator import simulate
from costmodel.train_config import TrainConfig
from search.layouts import SearchSpace, degree_splits, grid_search

MODEL = ModelConfig(name="m", hidden_size=2048, num_layers=16, num_heads=16, num_kv_heads=4, ffn_size=5632, vocab_size=32000)
TRAIN = TrainConfig(seq_len=2048, global_batch=64)
HW = load_machine("a100-80gb")


def test_degree_splits_cover_every_factorisation_once():
    splits = list(degree_splits(24, max_cp=2))
    assert all(math.prod(s) == 24 for s in splits) and len(splits) == len(set(splits))
    assert splits == sorted(splits) and (2, 4, 3, 1) in splits and (3, 2, 2, 2) in splits


def test_search_is_deterministic_and_returns_the_fastest_fitting_layout():
    space = SearchSpace(micro_batches=(1, 2), recompute=(Recompute.NONE, Recompute.FULL), zero_stages=(0, 1))
    a = grid_search(MODEL, TRAIN, HW, n_devices=8, space=space)
    b = grid_search(MODEL, TRAIN, HW, n_devices=8, space=space)
    assert a == b
    for other in a.runners_up:
        assert other.step_time_s >= a.best.step_time_s and other.fits
    assert simulate(MODEL, TRAIN, a.best.layout, HW).step_time_s == a.best.step_time_s
    assert a.pruned["ZeRO without data parallelism"] > 0


def test_fixed_splits_restrict_the_degrees():
    result = grid_search(MODEL, TRAIN, HW, n_devices=8, space=SearchSpace(splits=((2, 4, 1, 1),)))
    assert (result.best.layout.dp, result.best.layout.tp) == (2, 4)


def test_infeasible_reports_the_closest_layout_with_numbers():
    huge = MODEL.model_copy(update={"num_layers": 400, "hidden_size": 8192, "num_heads": 64, "ffn_size": 28672})
    with pytest.raises(InfeasibleError, match=r"needs [\d.]+ GiB per device, has 80 GiB; fix: use about \d+ devices"):
        grid_search(huge, TRAIN, HW, n_devices=2)


def test_no_consistent_layout_names_the_rules():
    odd = MODEL.model_copy(update={"num_heads": 7, "num_kv_heads": 7, "head_dim": 128, "num_layers": 1})
    with pytest.raises(InfeasibleError, match="no layout .* is consistent"):
        grid_search(odd, TrainConfig(seq_len=2048, global_batch=3), HW, n_devices=2)
