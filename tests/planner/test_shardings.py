"""Tests `planner/shardings.py`: the PartitionSpec pytree goes straight into jax.jit."""

import subprocess
import sys
from pathlib import Path


def test_partition_spec_tree_is_what_jit_takes_for_the_reference_model():
    check = Path(__file__).with_name("specs_check.py")
    run = subprocess.run([sys.executable, str(check)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[-2] == "P(None, 'data', 'tensor', None) P(None, 'data', 'tensor') True"
