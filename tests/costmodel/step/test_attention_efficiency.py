"""Tests `costmodel/step/attention_efficiency.py`: a fused attention kernel's efficiency against sequence length."""

import pytest

from costmodel.step.attention_efficiency import AttentionCurve, fit_attention_curve


def test_efficiency_rises_towards_the_inner_loop_fraction_and_causal_pays_the_diagonal():
    curve = AttentionCurve(peak_fraction=0.6, overhead_tokens=200)
    lengths = (256, 1024, 4096, 16384, 1 << 20)
    for causal in (False, True):
        values = [curve.efficiency(s, causal=causal) for s in lengths]
        assert values == sorted(values) and values[-1] == pytest.approx(0.6, rel=1e-3)
    # At equal length a causal row does half the useful work against the same fixed part, plus the diagonal.
    assert curve.efficiency(2048, causal=True) == pytest.approx(0.6 * 1024 / (1024 + 64 + 200))
    assert curve.efficiency(2048, causal=True) < curve.efficiency(2048, causal=False)


def test_the_fit_recovers_a_curve_and_ignores_where_the_points_lie_on_it():
    truth = AttentionCurve(peak_fraction=0.45, overhead_tokens=120)
    points = [(s, c, truth.efficiency(s, causal=c)) for s in (1024, 4096) for c in (False, True)]
    fit = fit_attention_curve(points)
    assert fit.peak_fraction == pytest.approx(0.45, rel=1e-3) and fit.overhead_tokens == pytest.approx(120, rel=0.01)
    # Noise of ±2 % moves the fit little: every point stays within a few % of its measurement.
    noisy = [(s, c, e * (1.02 if i % 2 else 0.98)) for i, (s, c, e) in enumerate(points)]
    fitted = fit_attention_curve(noisy)
    assert all(abs(fitted.efficiency(s, causal=c) / e - 1) < 0.04 for s, c, e in noisy)
