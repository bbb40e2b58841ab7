"""Tests `planner/cli/commands/hardware_cmd.py`: which dtypes each part accelerates."""

import json

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
