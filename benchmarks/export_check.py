"""Check each launcher export against the launcher: its names and values against the data file
read from its source (`benchmarks.export_schemas`), and against the launcher's real parser.

    python -m benchmarks.export_check [--venv VENV] [--megatron-git GIT_DIR --megatron-venv VENV312]

For llama3-8b, llama3-70b and mixtral-8x7b on 32 H100 (8x4, a pipelined and a tensor-parallel
mesh), every key of the Megatron, DeepSpeed, torchtitan and MaxText exports is looked up in
``planner/cli/export_schemas/<stack>.json`` with its type and choices (`schema_problems`).
With ``--venv`` (a virtual environment holding deepspeed and torchtitan==0.2.2) the export is
also handed to the package's own config class. Megatron-LM is no pip package (``megatron-core``
ships no ``megatron/training``): with ``--megatron-git`` (a clone of NVIDIA/Megatron-LM) its
``megatron/`` at the data file's commit is extracted and ``benchmarks/megatron_check.py`` runs
its ``parse_args`` and ``validate_args`` on the export in ``--megatron-venv`` (Python >= 3.12
with torch; default ``--venv``), with two controls that must be refused. MaxText's real loader
is ``benchmarks.maxtext_export``. Prints a table, writes a CSV; exits 1 when any case disagrees.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.output import print_table, write_csv
from planner.api import plan
from planner.cli.commands.plan_cmd import FORMAT_STACKS
from planner.cli.exports import to_deepspeed, to_maxtext, to_megatron, to_torchtitan, to_torchtitan_toml
from planner.plan_schema import Plan

SCHEMAS = Path(__file__).resolve().parents[1] / "planner" / "cli" / "export_schemas"
CASES = (("llama3-8b", "8x4"), ("llama3-70b", "pipeline=4,tensor=8"), ("mixtral-8x7b", "data=4,tensor=8"))
_PY_TYPES = {"int": (int,), "float": (float, int), "str": (str,), "bool": (bool,), "list": (list,), "dict": (dict,)}


def schema(stack: str) -> dict[str, Any]:
    """The data file of ``stack``: provenance and ``keys``."""
    return json.loads((SCHEMAS / f"{stack}.json").read_text())


def _value_problem(key: str, value: Any, spec: dict[str, Any] | None) -> str | None:
    if spec is None:
        return f"{key}: not in the source"
    kind = spec.get("type")
    if kind == "flag":
        return None if value is True else f"{key}: a switch, given {value!r}"
    if kind in _PY_TYPES and not (isinstance(value, _PY_TYPES[kind]) and not (kind != "bool" and isinstance(value, bool))):
        return f"{key}: {kind} expected, given {value!r}"
    if "choices" in spec and value not in spec["choices"]:
        return f"{key}: {value!r} not one of {spec['choices']}"
    return None


def _flag_values(flags: list[str]) -> dict[str, Any]:
    """``--flag value`` pairs as argparse would type them; a flag with no value is True."""
    out: dict[str, Any] = {}
    for i, flag in enumerate(flags):
        if flag.startswith("--"):
            out[flag] = True if i + 1 == len(flags) or flags[i + 1].startswith("--") else flags[i + 1]
    return out


def _typed(text: Any, kind: str | None) -> Any:
    if not isinstance(text, str) or kind not in ("int", "float"):
        return text
    try:
        return int(text) if kind == "int" else float(text)
    except ValueError:
        return text


def schema_problems(stack: str, export: Any) -> list[str]:
    """Every key or value of ``export`` (of `to_megatron`, `to_deepspeed`, `to_torchtitan` or
    `to_maxtext`) the launcher's source does not accept; empty when all are accepted."""
    keys = schema(stack)["keys"]
    if stack == "megatron":
        items = {k: _typed(v, (keys.get(k) or {}).get("type")) for k, v in _flag_values(export).items()}
    elif stack == "deepspeed":
        items = {}
        for key, value in export["config"].items():
            items[key] = value
            if isinstance(value, dict):
                items |= {f"{key}.{sub}": v for sub, v in value.items()}
        items |= {f"launcher:{k}": _typed(v, (keys.get(f"launcher:{k}") or {}).get("type"))
                  for k, v in _flag_values(export["launcher"]).items()}
        megatron = schema("megatron")["keys"]
        return [p for k, v in items.items() if (p := _value_problem(k, v, keys.get(k)))] + \
               [p for k, v in _flag_values(export["script_args"]).items()
                if (p := _value_problem(k, _typed(v, (megatron.get(k) or {}).get("type")), megatron.get(k)))]
    elif stack == "torchtitan":
        items = {f"{section}.{k}": v for section, values in export.items() for k, v in values.items()}
    else:
        items = dict(export)
    return [p for k, v in items.items() if (p := _value_problem(k, v, keys.get(k)))]


EXPORTERS = {"megatron": to_megatron, "deepspeed": to_deepspeed, "torchtitan": to_torchtitan, "maxtext": to_maxtext}


def case_plan(model: str, mesh: str, stack: str) -> Plan:
    return plan(model, mesh=mesh, hardware="h100-sxm", global_batch=256, stack=FORMAT_STACKS[stack][0], time_limit_s=20)


_PARSERS = {
    # One process stands for the data-parallel group: its rank 0, the plan's dp as the group's size
    # (what Megatron-DeepSpeed's mpu answers), so DeepSpeed's batch arithmetic checks the plan's.
    "deepspeed": ("import json, sys, types; import deepspeed.comm as dist; from deepspeed.runtime.config import DeepSpeedConfig; "
                  "dist.get_rank = lambda: 0; mpu = types.SimpleNamespace(get_data_parallel_world_size=lambda: int(sys.argv[2])); "
                  "c = DeepSpeedConfig(json.loads(sys.argv[1]), mpu=mpu); print(c.zero_optimization_stage, c.train_batch_size)"),
    "torchtitan": ("import sys, tempfile; from torchtitan.config import ConfigManager; f = tempfile.NamedTemporaryFile('w', "
                   "suffix='.toml', delete=False); f.write(sys.argv[1]); f.close(); "
                   "c = ConfigManager().parse_args(['--job.config_file', f.name]); print(c.parallelism.tensor_parallel_degree)"),
}


def real_parser(venv: Path | None, stack: str, result: Plan) -> str:
    """What the package's own parser said of ``result``'s export: 'ok ...', 'error ...', or why it was not run."""
    if stack not in _PARSERS:
        return "see benchmarks.maxtext_export"
    if venv is None or not (venv / "bin" / "python").exists():
        return "not run (no --venv)"
    payload = [json.dumps(to_deepspeed(result)["config"]), str(result.layout.dp)] if stack == "deepspeed" else [to_torchtitan_toml(result)]
    run = subprocess.run([str(venv / "bin" / "python"), "-c", _PARSERS[stack], *payload], capture_output=True, text=True, timeout=300)
    return f"ok {run.stdout.strip().splitlines()[-1]}" if run.returncode == 0 else f"error {run.stderr.strip().splitlines()[-1][:80]}"


# What Megatron's own launch script adds to the layout: its mock-data branch's data and tokenizer
# flags (examples/llama/train_llama3_8b_h100_fp8.sh; the export already carries --vocab-size).
MEGATRON_LAUNCH_ARGS = ("--mock-data", "--tokenizer-type", "NullTokenizer")
_MEGATRON_CHECK = Path(__file__).with_name("megatron_check.py")


def megatron_cases(result: Plan) -> dict[str, list[str]]:
    """The Megatron argument lists `megatron_check.py` parses for ``result``: its export with the
    launch script's arguments (must be accepted), and two controls that must be refused, a
    misspelled flag (by ``parse_args``) and a global batch that is no multiple of micro-batch × dp
    (by ``validate_args``).

    >>> from planner.api import plan
    >>> cases = megatron_cases(plan("gpt2", mesh="data=2,tensor=2", hardware="h100-sxm", global_batch=16, stack="megatron-core"))
    >>> sorted(cases), "--tensor-model-paralel-size" in cases["misspelled flag"]
    (['as exported', 'batch not a multiple of micro-batch x dp', 'misspelled flag'], True)
    """
    exported = [*to_megatron(result), *MEGATRON_LAUNCH_ARGS]
    misspelled = [flag.replace("--tensor-model-parallel-size", "--tensor-model-paralel-size") for flag in exported]
    bad_batch = list(exported)
    bad_batch[bad_batch.index("--global-batch-size") + 1] = str(result.layout.micro_batch * result.layout.dp + 1)
    return {"as exported": exported, "misspelled flag": misspelled, "batch not a multiple of micro-batch x dp": bad_batch}


def megatron_source(git_dir: Path, commit: str, into: Path) -> Path:
    """Extract Megatron-LM's ``megatron/`` package at ``commit`` from the clone ``git_dir`` into ``into``."""
    archive = subprocess.run(["git", f"--git-dir={git_dir}", "archive", commit, "megatron"], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def megatron_parser(python: Path | None, megatron_dir: Path | None, result: Plan) -> str:
    """What Megatron-LM's ``parse_args`` and ``validate_args`` said of ``result``'s export and its
    controls: 'ok ...', 'error ...', or why they were not run."""
    if megatron_dir is None or python is None or not python.exists():
        return "not run (no --megatron-git or --megatron-venv)"
    with tempfile.NamedTemporaryFile("w", suffix=".json") as cases:
        cases.write(json.dumps(megatron_cases(result)))
        cases.flush()
        command = [str(python), "-W", "ignore", str(_MEGATRON_CHECK), str(megatron_dir), str(result.layout.n_devices), cases.name]
        run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    said = {line["case"]: line for line in map(json.loads, (ln for ln in run.stdout.splitlines() if ln.startswith("{")))}
    if run.returncode != 0 or len(said) != 3:
        return f"error {(run.stderr.strip().splitlines() or ['no output'])[-1][:80]}"
    exported = said.pop("as exported")
    if not exported["accepted"]:
        return f"error {exported['said'][:80]}"
    missed = [case for case, line in said.items() if line["accepted"]]
    return f"error control accepted: {', '.join(missed)}" if missed else f"ok {exported['said']}; {len(said)} controls refused"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, help="virtual environment with deepspeed / torchtitan==0.2.2 installed")
    parser.add_argument("--megatron-git", type=Path, help="git directory of a NVIDIA/Megatron-LM clone holding the data file's commit")
    parser.add_argument("--megatron-venv", type=Path, help="virtual environment for Megatron-LM: Python >= 3.12, torch (default --venv)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/export_check.csv"))
    args = parser.parse_args()
    megatron_venv = args.megatron_venv or args.venv
    megatron_python = megatron_venv / "bin" / "python" if megatron_venv else None
    rows, failed = [], False
    with tempfile.TemporaryDirectory() as scratch:
        megatron_dir = megatron_source(args.megatron_git, schema("megatron")["commit"], Path(scratch)) if args.megatron_git else None
        for stack, exporter in EXPORTERS.items():
            source = schema(stack)
            for model, mesh in CASES:
                result = case_plan(model, mesh, stack)
                problems = schema_problems(stack, exporter(result))
                if stack == "megatron":
                    parsed = megatron_parser(megatron_python, megatron_dir, result)
                else:
                    parsed = real_parser(args.venv, stack, result)
                failed |= bool(problems) or parsed.startswith("error")
                rows.append({"export": stack, "model": model, "mesh": mesh,
                             "source": f"{source['repository'].split('/')[-1]}@{source['commit'][:10]}",
                             "names and values": "ok" if not problems else "; ".join(problems)[:60], "real parser": parsed})
    print_table("launcher exports against their sources", rows)
    write_csv(args.out, rows)
    return 1 if failed else 0

if __name__ == "__main__":
    sys.exit(main())
