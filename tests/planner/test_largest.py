"""Tests `planner/largest.py` and `plan largest`: the family's published sizes are on its grid,
the answer fits as `plan simulate` costs it and the next larger shapes of the grid fit no
layout, in a few seconds."""

import json
import time

import pytest

from costmodel.errors import InfeasibleError
from costmodel.hardware.machine import machine_for
from costmodel.hardware.registry import load_hardware
from planner.cli.main import main
from planner.config import default_seq_len, load_model, train_config
from planner.largest import FAMILIES, family_layers, family_model, next_larger_shapes
from search.layouts import grid_search


def test_scaling_rule_reproduces_the_published_sizes():
    for family, names in FAMILIES.items():
        for name in names:
            published = load_model(name)
            scaled = family_model(family, published.hidden_size)
            assert scaled.model_copy(update={"name": published.name}) == published
            assert published.num_layers in family_layers(family, published.hidden_size)


def test_grid_keeps_the_published_ratios():
    assert family_layers("llama", 8192) == range(63, 81)  # 8192/80 = 102.4 (70B) up to 16384/126 = 130.0 (405B)
    deep = family_model("llama", 8192, 63)
    assert (deep.num_heads, deep.num_kv_heads, deep.head_dim, deep.ffn_size) == (64, 8, 128, 28672)


def _simulate_flags(layout: dict) -> list[str]:
    assert layout["stage_layers"] is None and layout["offload"] == "none"
    return ["--dp", str(layout["dp"]), "--tp", str(layout["tp"]), "--pp", str(layout["pp"]), "--cp", str(layout["cp"]),
            "--ep", str(layout["ep"]), "--micro-batch", str(layout["micro_batch"]), "--interleave", str(layout["interleave"]),
            "--schedule", layout["schedule"], "--recompute", layout["recompute"], "--zero", str(layout["zero_stage"]),
            "--stack", layout["stack"]["name"], *(["--sequence-parallel"] if layout["sequence_parallel"] else [])]


def test_largest_llama_on_8_h100_fits_and_no_larger_shape_of_the_grid_does(capsys, tmp_path):
    start = time.perf_counter()
    code = main(["largest", "--devices", "8", "--hardware", "h100-sxm", "--json"])
    wall_s = time.perf_counter() - start
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and wall_s < 20
    model = out["model"]
    assert model["num_layers"] in family_layers("llama", model["hidden_size"])
    assert out["params"] == family_model("llama", model["hidden_size"], model["num_layers"]).total_params
    # More than the hidden-size-only grid found (28.2 B); 8 × 80 GiB hold tens of billions, not hundreds.
    assert 28.3e9 < out["params"] < 60e9 and out["next_params"] > out["params"]
    assert out["layout"]["dp"] * out["layout"]["tp"] * out["layout"]["pp"] * out["layout"]["cp"] == 8

    # The answer, as `plan simulate` costs it from the model file and the layout's flags: it fits.
    (tmp_path / "largest.json").write_text(json.dumps(model))
    assert main(["simulate", "--model", str(tmp_path / "largest.json"), "--devices", "8", "--hardware", "h100-sxm",
                 "--global-batch", "8", *_simulate_flags(out["layout"]), "--json"]) == 0
    simulated = json.loads(capsys.readouterr().out)
    assert simulated["fits"] is True and simulated["step_time_s"] == pytest.approx(out["step_time_s"])

    # At every width of the grid, the smallest shape above the answer fits no layout.
    above = next_larger_shapes("llama", out["params"])
    assert above and min(c.total_params for c in above) == out["next_params"]
    machine = machine_for(load_hardware("h100-sxm"))
    for cfg in above:
        with pytest.raises(InfeasibleError):
            grid_search(cfg, train_config(seq_len=default_seq_len(cfg), global_batch=8), machine, n_devices=8)


def test_more_devices_train_a_larger_model(capsys):
    sizes = []
    for devices in ("8", "16"):
        assert main(["largest", "--devices", devices, "--json"]) == 0
        sizes.append(json.loads(capsys.readouterr().out)["params"])
    assert sizes[1] > sizes[0]
