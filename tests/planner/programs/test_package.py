"""Tests `planner/programs/__init__.py`: importing the package (as `plan simulate`'s tables do, for the XLA options) imports
no JAX, which would double a simulate's start-up."""

import subprocess
import sys


def test_the_package_and_the_simulate_tables_import_no_jax():
    probe = "import sys, planner.programs, planner.programs.xla_options, planner.cli.tables; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "False"
