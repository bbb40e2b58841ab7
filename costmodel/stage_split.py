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
    if min_layers == 1 and pp > 2 and len(set(layer_s)) == 1 and layer_s[0] > 0:
        return _identical_layers(n, pp, layer_s[0], first_extra_s, last_extra_s)
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


def _identical_layers(n: int, pp: int, layer_s: float, first_extra_s: float, last_extra_s: float) -> tuple[int, ...]:
    """The same answer for identical layers in O(n log n): bisect on the slowest stage's time.

    With time T, the first stage takes at most ⌊(T − first)/c⌋ layers, the last ⌊(T − last)/c⌋,
    each middle one ⌊T/c⌋; T is feasible when those add up to n. The least feasible T is one
    of k·c, k·c + first, k·c + last.
    """
    def capacity(t: float) -> tuple[int, int, int]:
        return (int((t - first_extra_s) / layer_s + 1e-9), int((t - last_extra_s) / layer_s + 1e-9), int(t / layer_s + 1e-9))

    def feasible(t: float) -> bool:
        first, last, middle = capacity(t)
        return min(first, last, middle) >= 1 and first + last + (pp - 2) * middle >= n

    times = sorted({k * layer_s + extra for k in range(1, n + 1) for extra in (0.0, first_extra_s, last_extra_s)})
    low, high = 0, len(times) - 1
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if feasible(times[mid]) else (mid + 1, high)
    first, last, middle = capacity(times[low])
    counts = [first, *([middle] * (pp - 2)), last]
    extras = [first_extra_s, *([0.0] * (pp - 2)), last_extra_s]
    # Fill every stage to its capacity, then take the surplus from the slowest stages: same
    # slowest time, as even as it can be.
    for _ in range(sum(counts) - n):
        slowest = max((i for i in range(pp) if counts[i] > 1), key=lambda i: (counts[i] * layer_s + extras[i], -i))
        counts[slowest] -= 1
    return tuple(counts)
