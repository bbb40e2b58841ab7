"""The inter-op DP: contiguous layer ranges to stages, minimizing the slowest stage."""

import itertools
import time

import pytest

from costmodel.step.stage_split import balanced_stage_layers, identical_stage_layers


def brute_force(layer_s, pp, first, last):
    n = len(layer_s)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), pp - 1):
        bounds = (0, *cuts, n)
        stages = [sum(layer_s[a:b]) for a, b in zip(bounds, bounds[1:])]
        stages[0] += first
        stages[-1] += last
        best = min(best, max(stages))
    return best


def slowest(split, layer_s, first, last):
    bounds = [0, *itertools.accumulate(split)]
    stages = [sum(layer_s[a:b]) for a, b in zip(bounds, bounds[1:])]
    stages[0] += first
    stages[-1] += last
    return max(stages)


@pytest.mark.parametrize("layer_s, pp, first, last", [
    ([1.0] * 12, 4, 0.0, 0.0),
    ([1.0] * 12, 4, 1.5, 2.5),
    ([1.0] * 10, 3, 0.3, 4.0),
    ([2.0, 1.0, 3.0, 1.0, 1.0, 2.0, 5.0, 1.0], 3, 1.0, 0.5),
    ([1.0] * 9, 2, 0.0, 3.0),
])
def test_split_is_optimal(layer_s, pp, first, last):
    split = balanced_stage_layers(layer_s, pp=pp, first_extra_s=first, last_extra_s=last)
    assert len(split) == pp and sum(split) == len(layer_s) and min(split) >= 1
    assert slowest(split, layer_s, first, last) == pytest.approx(brute_force(layer_s, pp, first, last))


def test_identical_layers_fast_path_matches_the_dp():
    for n, pp, first, last in itertools.product((8, 13, 32), (3, 4, 8), (0.0, 0.7, 2.2), (0.0, 1.3, 3.9)):
        if n < pp:
            continue
        layer_s = [1.0] * n
        fast = balanced_stage_layers(layer_s, pp=pp, first_extra_s=first, last_extra_s=last)
        general = balanced_stage_layers([1.0] * (n - 1) + [1.0 + 1e-12], pp=pp, first_extra_s=first, last_extra_s=last)
        assert slowest(fast, layer_s, first, last) == pytest.approx(slowest(general, layer_s, first, last))


def test_too_few_layers_is_an_error():
    with pytest.raises(ValueError, match="cannot fill"):
        balanced_stage_layers([1.0] * 3, pp=4)


def test_identical_layers_match_the_dp_for_two_stages_too():
    for n, first, last in itertools.product((2, 3, 9, 20), (0.0, 0.7, 2.2, 30.0), (0.0, 1.3, 3.9, 30.0)):
        fast = identical_stage_layers(n, pp=2, layer_s=1.0, first_extra_s=first, last_extra_s=last)
        assert sum(fast) == n and min(fast) >= 1
        assert slowest(fast, [1.0] * n, first, last) == pytest.approx(brute_force([1.0] * n, 2, first, last))


def test_identical_layers_time_does_not_grow_with_depth():
    start = time.perf_counter()
    split = identical_stage_layers(10**9, pp=64, layer_s=0.013, first_extra_s=0.2, last_extra_s=0.9)
    assert time.perf_counter() - start < 0.1
    assert sum(split) == 10**9 and min(split) >= 1
    assert max(k * 0.013 + e for k, e in zip(split, [0.2, *[0.0] * 62, 0.9])) <= (10**9 * 0.013 + 1.1) / 64 + 0.013
