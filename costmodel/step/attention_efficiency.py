"""A fused attention kernel's efficiency as a function of sequence length.

FlashAttention-style kernels (FlashAttention-2/3, cuDNN's, Triton's tutorial kernel) give each
thread block a tile of queries and stream every key and value tile past it. A block's time is
its tiles' work plus a fixed part (loading its queries, the softmax's final rescale, writing its
output), so for ``S`` keys the fraction of time doing useful work is ``S / (S + S₀)``, with ``S₀``
the fixed part in key tokens. A causal kernel skips the tiles above the diagonal: a query row
does ``S/2`` keys' work on average, plus half a tile on the diagonal, which it computes and masks
(FlashAttention counts causal FLOPs as half the square). So

    efficiency(S) = peak_fraction · u / (u + w + S₀),   u = S (causal: S/2),  w = 0 (causal: diagonal_tokens)

``peak_fraction`` (the inner loop's fraction of the tensor-core peak) and ``S₀`` are fitted to a
kernel benchmark (`fit_attention_curve`); ``diagonal_tokens`` is half a 128-wide key tile. What
this leaves out: wave quantization over the SMs (a benchmark with few blocks per SM), head
dimension (Triton's tutorial kernel fitted at 64 predicts 128 within 10 %), and a backward of its
own (the simulator applies the forward's curve to it; the one published backward sweep, Triton's,
does not follow this curve when causal). `benchmarks.attention_accuracy` fits it on one published
benchmark and checks it on another.

>>> curve = AttentionCurve(peak_fraction=0.5, overhead_tokens=256)
>>> round(curve.efficiency(1024, causal=False), 3), round(curve.efficiency(1024, causal=True), 3)
(0.4, 0.308)
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

# Half of a 128-key tile: what a causal query row computes and masks on the diagonal.
DIAGONAL_TOKENS = 64.0


class AttentionCurve(BaseModel):
    """A fused attention kernel's fraction of peak against sequence length (module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    peak_fraction: PositiveFloat = Field(description="Fraction of the tensor-core peak the inner loop reaches (long sequences).")
    overhead_tokens: float = Field(ge=0, description="A thread block's fixed work, in key tokens (S₀).")
    diagonal_tokens: float = Field(DIAGONAL_TOKENS, ge=0, description="Keys a causal query row computes and masks on the diagonal.")

    def efficiency(self, seq_len: float, *, causal: bool) -> float:
        """Fraction of peak at ``seq_len`` keys per query (FlashAttention's FLOP count: causal is half the square)."""
        useful = seq_len / 2 if causal else seq_len
        return self.peak_fraction * useful / (useful + (self.diagonal_tokens if causal else 0.0) + self.overhead_tokens)


def fit_attention_curve(points: list[tuple[float, bool, float]], *, diagonal_tokens: float = DIAGONAL_TOKENS) -> AttentionCurve:
    """The curve with the least mean squared relative error over ``points`` (sequence length,
    causal, measured fraction of peak): for each ``S₀`` on a log grid from 1 to 65,536 tokens the
    best ``peak_fraction`` is closed-form, and the best pair is kept.

    >>> truth = AttentionCurve(peak_fraction=0.6, overhead_tokens=300)
    >>> fit = fit_attention_curve([(s, c, truth.efficiency(s, causal=c)) for s in (512, 2048, 8192) for c in (False, True)])
    >>> round(fit.peak_fraction, 3), round(fit.overhead_tokens)
    (0.6, 300)
    """
    seq_S = np.array([p[0] for p in points], dtype=float)
    causal_S = np.array([p[1] for p in points], dtype=bool)
    measured_S = np.array([p[2] for p in points], dtype=float)
    useful_S = np.where(causal_S, seq_S / 2, seq_S)
    overhead_O = np.concatenate([[0.0], np.geomspace(1, 65536, 4001)])
    shape_OxS = useful_S / (useful_S + np.where(causal_S, diagonal_tokens, 0.0) + overhead_O[:, None])
    ratio_OxS = shape_OxS / measured_S  # prediction / measurement = fraction · ratio: minimise Σ(fraction · ratio − 1)²
    fraction_O = ratio_OxS.sum(axis=1) / (ratio_OxS**2).sum(axis=1)
    best = int(np.argmin(((fraction_O[:, None] * ratio_OxS - 1) ** 2).mean(axis=1)))
    return AttentionCurve(peak_fraction=float(fraction_O[best]), overhead_tokens=float(overhead_O[best]), diagonal_tokens=diagonal_tokens)
