"""Inter-op planning: contiguous layer ranges → pipeline stages, by dynamic programming.

The step time of a synchronous pipeline is set by its slowest stage, so layers are cut into
``pp`` contiguous ranges minimizing the slowest stage's time per micro-batch, where the
first stage also runs the embedding and the last the head and loss (Alpa's inter-op pass,
here with one sub-mesh shape for every stage). Megatron-LM runs such uneven splits
(``--decoder-first/last-pipeline-num-layers``); with equal layers they shorten the end
stages that carry the embedding and the head.

>>> balanced_stage_layers([1.0] * 6, pp=2, last_extra_s=2.0)  # the head costs two layers
(4, 2)
"""

from __future__ import annotations

import heapq
import itertools
from typing import Sequence


def balanced_stage_layers(layer_s: Sequence[float], *, pp: int, first_extra_s: float = 0.0, last_extra_s: float = 0.0,
                          min_layers: int = 1) -> tuple[int, ...]:
    """Layers per stage, first to last, minimizing the slowest stage (the earliest best cut on ties).

    Args:
      layer_s: seconds of each layer (forward plus backward of one micro-batch), in order.
      pp: pipeline stages.
      first_extra_s, last_extra_s: work only the first / last stage does (embedding; head and loss).
      min_layers: fewest layers a stage may hold.
    """
    n = len(layer_s)
    if pp < 1 or n < pp * min_layers:
        raise ValueError(f"{n} layers cannot fill {pp} stages of at least {min_layers}")
    if min_layers == 1 and len(set(layer_s)) == 1 and layer_s[0] > 0:
        return identical_stage_layers(n, pp=pp, layer_s=layer_s[0], first_extra_s=first_extra_s, last_extra_s=last_extra_s)
    prefix = [0.0, *itertools.accumulate(layer_s)]

    def stage_s(stage: int, start: int, end: int) -> float:
        extra = (first_extra_s if stage == 0 else 0.0) + (last_extra_s if stage == pp - 1 else 0.0)
        return prefix[end] - prefix[start] + extra

    # best[k][i]: least possible slowest-stage time with the first i layers on stages 0..k-1.
    best = [[float("inf")] * (n + 1) for _ in range(pp + 1)]
    cut = [[0] * (n + 1) for _ in range(pp + 1)]
    best[0][0] = 0.0
    for k in range(1, pp + 1):
        for i in range(k * min_layers, n - (pp - k) * min_layers + 1):
            for j in range((k - 1) * min_layers, i - min_layers + 1):
                value = max(best[k - 1][j], stage_s(k - 1, j, i))
                if value < best[k][i] - 1e-15:
                    best[k][i], cut[k][i] = value, j
    counts, i = [], n
    for k in range(pp, 0, -1):
        counts.append(i - cut[k][i])
        i = cut[k][i]
    return tuple(reversed(counts))


def identical_stage_layers(n_layers: int, *, pp: int, layer_s: float, first_extra_s: float = 0.0,
                           last_extra_s: float = 0.0) -> tuple[int, ...]:
    """`balanced_stage_layers` for ``n_layers`` layers of ``layer_s`` seconds each, in O(pp log pp + log n_layers).

    Transformer layers are identical, so planning time must not grow with depth (DESIGN, "Plan a
    layer"): no per-layer list is built. Two stages take the earliest best cut, as the DP does;
    more stages bisect on the slowest stage's time T: the first stage holds at most
    ⌊(T − first)/c⌋ layers, the last ⌊(T − last)/c⌋, each middle one ⌊T/c⌋, and T is feasible when
    those add up to ``n_layers``. The least feasible T is one of k·c, k·c + first, k·c + last.

    >>> identical_stage_layers(10**9, pp=4, layer_s=1.0, last_extra_s=2.0)
    (250000000, 250000000, 250000001, 249999999)
    """
    if pp < 1 or n_layers < pp or layer_s <= 0:
        raise ValueError(f"{n_layers} layers of {layer_s} s cannot fill {pp} stages of at least 1")
    if pp == 1:
        return (n_layers,)
    if pp == 2:
        return _two_stages(n_layers, layer_s, first_extra_s, last_extra_s)
    c, first_s, last_s = layer_s, first_extra_s, last_extra_s

    def capacity(t: float) -> tuple[int, int, int]:
        return int((t - first_s) / c + 1e-9), int((t - last_s) / c + 1e-9), int(t / c + 1e-9)

    def feasible(t: float) -> bool:
        first, last, middle = capacity(t)
        return min(first, last, middle) >= 1 and first + last + (pp - 2) * middle >= n_layers

    def least_k(extra: float) -> int:  # feasibility is monotone in k; k = n_layers + 1 always fits
        low, high = 0, n_layers + 1
        while low < high:
            mid = (low + high) // 2
            low, high = (low, mid) if feasible(mid * c + extra) else (mid + 1, high)
        return low

    extras = {0.0, first_s, last_s}
    slowest_s = min(least_k(extra) * c + extra for extra in extras if feasible((n_layers + 1) * c + extra))
    first, last, middle = capacity(slowest_s)
    return _shed_surplus([first, *([middle] * (pp - 2)), last], n_layers, c, [first_s, *([0.0] * (pp - 2)), last_s])


def _shed_surplus(counts: list[int], n_layers: int, layer_s: float, extras_s: list[float]) -> tuple[int, ...]:
    """Every stage filled to capacity; take the surplus (fewer than pp + 2 layers) from the slowest
    stages, earliest first: the same slowest time, as even as it can be."""
    heap = [(-(k * layer_s + e), i) for i, (k, e) in enumerate(zip(counts, extras_s)) if k > 1]
    heapq.heapify(heap)
    for _ in range(sum(counts) - n_layers):
        _, i = heapq.heappop(heap)
        counts[i] -= 1
        if counts[i] > 1:
            heapq.heappush(heap, (-(counts[i] * layer_s + extras_s[i]), i))
    return tuple(counts)


def _two_stages(n_layers: int, layer_s: float, first_s: float, last_s: float) -> tuple[int, int]:
    """The first stage's layer count j minimizing max(j·c + first, (n − j)·c + last), earliest on ties
    (within the DP's 1e-15); the two sides cross near j = (n·c + last − first) / 2c."""
    def slowest(j: int) -> float:
        return max(j * layer_s + first_s, (n_layers - j) * layer_s + last_s)

    cross = int((n_layers * layer_s + last_s - first_s) / (2 * layer_s))
    candidates = sorted({min(max(j, 1), n_layers - 1) for j in range(cross - 2, cross + 3)})
    best = min(slowest(j) for j in candidates)
    j = next(j for j in candidates if slowest(j) <= best + 1e-15)
    return j, n_layers - j
