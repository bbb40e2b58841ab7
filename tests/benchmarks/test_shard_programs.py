"""Tests `benchmarks/shard_programs.py` and `benchmarks/programs.py`: library programs at test size, sharded and compiled."""

import csv
import math
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from benchmarks.programs import PROGRAMS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_program_traces_to_a_scalar_loss(name):
    program = PROGRAMS[name](small=True)
    params, opt_state, loss = jax.eval_shape(program.train_step, *program.abstract_args)
    assert loss.shape == () and program.parameters > 0
    assert jax.tree.structure(params) == jax.tree.structure(program.abstract_args[0])


@pytest.mark.slow
def test_bench_compiles_the_choice_and_every_baseline(tmp_path):
    # Its own process: the bench emulates 8 devices, which must be set before jax starts.
    out = subprocess.run([sys.executable, "-m", "benchmarks.shard_programs", "--small", "--time-limit-s", "5",
                          "--only", "penzai-llama", "transformers-gpt2"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode in (0, 1), out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1].endswith("programs: predicted memory within 15% of compiled")
    rows = list(csv.DictReader((ROOT / "benchmarks/out/shard_programs.csv").open()))
    assert [r["program"] for r in rows] == ["penzai-llama", "transformers-gpt2"]
    for row in rows:
        assert math.isfinite(float(row["ratio"])) and float(row["compiled_gib"]) > 0
        assert "/" in row["dp"] and "/" in row["fsdp"]
