"""Tests `benchmarks/attention_accuracy.py`: the fit on one published kernel benchmark, checked on another."""

from benchmarks.attention_accuracy import CHECKS, DEFAULT_DATA, load_rows, main, run_check


def test_every_check_selects_rows_and_fits_a_physical_curve():
    rows = load_rows(DEFAULT_DATA)
    for check in CHECKS:
        curve, results = run_check(rows, check)
        assert results and 0.2 < curve.peak_fraction < 1 and curve.overhead_tokens < 4096


def test_the_cross_author_check_holds_within_ten_percent():
    """FlashAttention-3 fitted on its FP8 pull request's sweep predicts another author's 16-bit sweep."""
    rows = load_rows(DEFAULT_DATA)
    _, results = run_check(rows, CHECKS[0])
    assert {r["source"] for r in results} == {"flash-attention-issue1777"} and len(results) == 4
    assert max(abs(r["error_pct"]) for r in results) <= 10


def test_main_writes_the_csv(tmp_path, capsys):
    out = tmp_path / "attention.csv"
    assert main(["--out", str(out)]) == 0
    assert out.read_text().count("\n") == 1 + sum(len(run_check(load_rows(DEFAULT_DATA), c)[1]) for c in CHECKS)
    assert "Fits and checks" in capsys.readouterr().out


def test_the_catalog_takes_its_attention_overhead_from_these_fits():
    from costmodel.hardware.catalog import AMPERE_ATTENTION_OVERHEAD_TOKENS, HOPPER_ATTENTION_OVERHEAD_TOKENS

    rows = load_rows(DEFAULT_DATA)
    fits = {check.fit: run_check(rows, check)[0] for check in CHECKS}
    assert round(fits[("flash-attention-pr1075", "fwd", None)].overhead_tokens) == HOPPER_ATTENTION_OVERHEAD_TOKENS
    assert round(fits[("triton-tutorial-06", "fwd", "64")].overhead_tokens) == AMPERE_ATTENTION_OVERHEAD_TOKENS
