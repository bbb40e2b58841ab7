"""Tests `planner/cli/commands/hardware_cmd.py`: which dtypes each part accelerates, and its memory."""

import json

import pytest

from costmodel.hardware.registry import load_hardware
from costmodel.hardware.reserve import GPU_RESERVE
from planner.cli.main import main


def test_json_lists_each_part_once_with_its_peaks_and_precisions(capsys):
    assert main(["hardware", "--json"]) == 0
    rows = {r["part"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["t4"]["precisions"] == ["fp32", "fp16"] and rows["t4"]["peak_tflops_by_dtype"]["float32"] == 8.1
    assert rows["v100"]["precisions"] == ["fp32", "fp16"]
    assert rows["a40"]["precisions"] == ["fp32", "tf32", "bf16", "fp16"]
    assert "float8_e4m3fn" not in rows["a100-80gb"]["peak_tflops_by_dtype"]
    assert rows["h100-sxm"]["precisions"][-1] == "fp8" and rows["h100-sxm"]["peak_tflops_by_dtype"]["float8_e4m3fn"] > 1900


def test_the_table_names_one_part(capsys):
    assert main(["hardware", "--hardware", "a100-80gb"]) == 0
    out = capsys.readouterr().out
    assert "a100-80gb" in out and "fp32 tf32 bf16 fp16" in out and "h100" not in out


def test_json_gives_each_parts_usable_memory_and_runtime_reserve_from_its_profile(capsys):
    assert main(["hardware", "--json"]) == 0
    rows = {r["part"]: r for r in json.loads(capsys.readouterr().out)}
    for part in ("h100-sxm", "a40", "tpu-v5p", "cpu"):
        device = load_hardware(part).device
        assert rows[part]["usable_memory_gib"] == device.usable_bytes / 2**30
        assert rows[part]["memory_reserve_gib"] == device.reserve_bytes / 2**30
        assert rows[part]["fit_memory_gib"] == pytest.approx(rows[part]["usable_memory_gib"] - rows[part]["memory_reserve_gib"])
    assert rows["h100-sxm"]["usable_memory_gib"] == pytest.approx(81_559 / 1024)  # the driver's MiB, not the datasheet's 80 GB
    assert rows["h100-sxm"]["memory_reserve_gib"] == pytest.approx(GPU_RESERVE.bytes_for(81_559 * 2**20) / 2**30)
    assert rows["cpu"]["memory_reserve_gib"] == 0 < rows["tpu-v5p"]["memory_reserve_gib"] < rows["h100-sxm"]["memory_reserve_gib"]


def test_the_table_shows_usable_reserve_and_what_fits(capsys):
    assert main(["hardware", "--hardware", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "h100-sxm" in line)
    assert [cell.strip() for cell in row.split("│")[-4:-1]] == ["79.6", "4.0", "75.7"]
    assert "usable" in out and "reserve" in out and "fits" in out


def test_every_2026_part_is_listed_with_its_cited_figures(capsys):
    assert main(["hardware", "--json"]) == 0
    rows = {r["part"]: r for r in json.loads(capsys.readouterr().out)}
    for part in ("b200", "gb200", "mi300x", "mi325x", "l4", "l40s", "a10g", "rtx-4090", "rtx-a6000"):
        assert rows[part]["source"] == load_hardware(part).device.source and "bf16" in rows[part]["precisions"]
    assert rows["gb200"]["peak_tflops_by_dtype"]["float4_e2m1fn"] == 10_000  # listed; no --precision runs fp4
    assert rows["rtx-4090"]["precisions"][-1] == "fp8" and "fp8" not in rows["rtx-a6000"]["precisions"]
    assert rows["b200"]["usable_memory_gib"] == pytest.approx(183_359 / 1024)
