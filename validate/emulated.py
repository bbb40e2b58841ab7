"""Run Python in a fresh process that sees N emulated CPU devices.

XLA fixes the device count when JAX starts, so a check for a plan of N devices runs in a
child with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``, leaving the caller's
JAX untouched. The child prints its (JSON) answer as its last stdout line.

>>> run_emulated("import jax; print(jax.device_count())", 4, failure="counting devices", fix="-")
'4'
"""

from __future__ import annotations

import os
import subprocess
import sys

from costmodel.errors import PlannerError


def emulated_cpu_env(n_devices: int, **extra: str) -> dict[str, str]:
    """This process's environment, for a child on the CPU backend with ``n_devices`` devices."""
    return dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={n_devices}", JAX_PLATFORMS="cpu", **extra)


def run_emulated(code: str, n_devices: int, *, stdin: str | None = None, timeout_s: float = 600, failure: str, fix: str,
                 error: type[PlannerError] = PlannerError) -> str:
    """The last stdout line of ``python -c code`` on ``n_devices`` emulated CPU devices; a
    failing child raises ``error("<failure>: <its last stderr line>", fix=fix)``."""
    proc = subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, text=True, env=emulated_cpu_env(n_devices),
                          timeout=timeout_s)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise error(f"{failure}: {lines[-1][:300] if lines else f'exit code {proc.returncode}'}", fix=fix)
    return proc.stdout.strip().splitlines()[-1]
