"""Tests `planner/largest.py` and `plan largest`: the family's published sizes are on its scaling
rule, the answer fits and the next size does not, in a few seconds."""

import json
import time

from planner.cli.main import main
from planner.config import load_model
from planner.largest import FAMILIES, family_model


def test_scaling_rule_reproduces_the_published_sizes():
    for family, names in FAMILIES.items():
        for name in names:
            published = load_model(name)
            scaled = family_model(family, published.hidden_size)
            assert scaled.model_copy(update={"name": published.name}) == published


def test_largest_llama_on_8_h100_fits_and_the_next_size_does_not(capsys):
    start = time.perf_counter()
    code = main(["largest", "--devices", "8", "--hardware", "h100-sxm", "--json"])
    wall_s = time.perf_counter() - start
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and wall_s < 15
    assert out["params"] == family_model("llama", out["model"]["hidden_size"]).total_params
    # 8 × 80 GiB hold at most ~640 GiB of bf16 weights + fp32 grads and Adam state: tens of billions, not hundreds.
    assert 8e9 < out["params"] < 60e9 and out["next_params"] > out["params"]
    assert out["memory"]["total_bytes"] <= out["memory"]["hbm_bytes"]
    assert out["layout"]["dp"] * out["layout"]["tp"] * out["layout"]["pp"] * out["layout"]["cp"] == 8
    assert out["bound"] in ("parameters + optimizer state", "activations")


def test_more_devices_train_a_larger_model(capsys):
    sizes = []
    for devices in ("8", "16"):
        assert main(["largest", "--devices", devices, "--json"]) == 0
        sizes.append(json.loads(capsys.readouterr().out)["params"])
    assert sizes[1] > sizes[0]
