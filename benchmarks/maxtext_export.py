"""Check `plan --format maxtext` against MaxText's own config loader.

    python -m benchmarks.maxtext_export [--venv ~/.cache/jax-parallel-planner/maxtext-venv]

MaxText 0.2.5 needs Python >= 3.12, so it lives in its own virtual environment outside the
repository, built on first use from pyenv's 3.12 (``--python`` to choose another) with the
packages its config loader imports. For llama3-8b and mixtral-8x7b on an unnamed and a
named mesh, writes our export and loads it with ``benchmarks/maxtext_check.py`` in that
environment; two controls must be refused (an unknown key; DCN axes without ``num_slices``).
Prints what MaxText printed and a table; exits 1 when any case disagrees.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.output import print_table
from planner.api import plan
from planner.cli.exports import to_maxtext
from planner.request import PlanRequest

MAXTEXT_PACKAGES = ("maxtext==0.2.5", "jax==0.10.2", "omegaconf", "pydantic", "absl-py", "flax", "packaging",
                    "pathwaysutils", "jinja2")
CASES = (("llama3-8b", "8x4"), ("llama3-8b", "data=4,tensor=2"), ("mixtral-8x7b", "8x4"), ("mixtral-8x7b", "data=8,tensor=4"))
_CHECK = Path(__file__).with_name("maxtext_check.py")


def ensure_venv(venv: Path, python: str) -> Path:
    """The venv's python, creating the venv and installing MaxText when it is missing."""
    exe = venv / "bin" / "python"
    if not exe.exists():
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(exe), "-m", "pip", "install", "-q", *MAXTEXT_PACKAGES], check=True)
    return exe


def load(exe: Path, model: str, export: dict, n_devices: int, tmp: Path) -> tuple[bool, str]:
    """(accepted, MaxText's last lines) for one export."""
    path = tmp / "export.json"
    path.write_text(json.dumps(export))
    run = subprocess.run([str(exe), str(_CHECK), model, str(path), str(n_devices)], capture_output=True, text=True,
                         timeout=600, cwd=tmp)
    lines = (run.stdout + run.stderr).splitlines()
    said = [ln for ln in lines if ln.startswith(("ACCEPTED", "REMAT", "REFUSED"))]
    said += [ln[:200] for ln in lines if "Error:" in ln or "requested but only one slice" in ln][-1:]
    return run.returncode == 0, "\n".join(said)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "jax-parallel-planner" / "maxtext-venv")
    parser.add_argument("--python", default=str(Path.home() / ".pyenv" / "versions" / "3.12.1" / "bin" / "python"))
    args = parser.parse_args(argv)
    exe = ensure_venv(args.venv, args.python)
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for model, mesh in CASES:
            p = plan(PlanRequest(model=model, mesh=mesh, hardware="h100-sxm", global_batch=256, stack="maxtext"))
            export = to_maxtext(p)
            controls = {"unknown key refused": {**export, "axis0_parallelism": 2}}
            if "num_slices" in export:
                controls["DCN without num_slices refused"] = {k: v for k, v in export.items() if k != "num_slices"}
            accepted, said = load(exe, model, export, p.layout.n_devices, Path(tmp))
            print(f"--- {model} --mesh {mesh}: {json.dumps(export)}\n{said}")
            refused = {}
            for name, bad in controls.items():
                bad_ok, bad_said = load(exe, model, bad, p.layout.n_devices, Path(tmp))
                refused[name] = not bad_ok
                print(f"  control, {name}: {'yes' if not bad_ok else 'NO'}: {bad_said.splitlines()[-1]}")
            ok &= accepted and all(refused.values())
            lay = p.layout
            rows.append({"model": model, "mesh": mesh, "layout": f"dp{lay.dp} tp{lay.tp} pp{lay.pp} z{lay.zero_stage}",
                         "accepted": accepted, "controls refused": all(refused.values())})
    print_table("MaxText 0.2.5 config loader on our --format maxtext", rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
