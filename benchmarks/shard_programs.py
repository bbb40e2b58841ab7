"""``planner.intraop.shard`` on training steps from JAX model libraries, compiled: predicted against compiled memory.

    python -m benchmarks.shard_programs [--only NAME ...] [--small] [--time-limit-s 20]

Each program of `benchmarks.programs` (penzai, Hugging Face transformers' Flax models, Flax
linen layers under ``nn.remat``) is sharded on 8 emulated CPU devices (mesh ``data=4,model=2``)
for an A100 40 GB as a user calls it: ``shard(train_step, params, opt_state, tokens, mesh=...,
hardware="a100-40gb", donate_argnums=(0, 1))``. Then the choice is compiled as a user runs it,
``result.jit(train_step, ...)`` (every equation pinned to the chosen shardings), and with its
specs alone (``specs_only_gib``), and every baseline's specs (plain DP, FSDP, FSDP × TP, scored
by the same model inside the call) as a user would write them; their per-device memory from
``memory_analysis()`` (arguments + outputs + temporaries − aliased) is set against the
prediction. The prediction is for the CPU backend the check compiles on (``backend`` follows
the mesh's devices). Writes
``benchmarks/out/shard_programs.csv``; the last line is "N/M programs: predicted memory
within 15 % of compiled".
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from benchmarks.output import print_table, write_csv  # noqa: E402
from benchmarks.programs import PROGRAMS, Program  # noqa: E402
from planner.intraop.shard import shard  # noqa: E402
from validate.shard_check import compiled_memory  # noqa: E402

TOLERANCE = 0.15
HARDWARE = "a100-40gb"
_GIB = 2**30


def run_program(program: Program, mesh: Mesh, *, time_limit_s: float) -> dict[str, Any]:
    """Shard ``program``, compile the choice and every baseline, and compare with the predictions."""
    start = time.perf_counter()
    result = shard(program.train_step, *program.abstract_args, mesh=mesh, hardware=HARDWARE, donate_argnums=(0, 1),
                   time_limit_s=time_limit_s)
    shard_s = time.perf_counter() - start
    row: dict[str, Any] = {"program": program.name, "library": program.library, "params_b": program.parameters / 1e9,
                           "mesh": ",".join(f"{n}={s}" for n, s in result.mesh_axes), "chosen": result.chosen}
    start = time.perf_counter()
    compiled_gib = {}
    for score in result.baselines:
        in_specs, out_specs = result.candidate_specs[score.name]
        m = compiled_memory(program.train_step, program.abstract_args, in_specs, out_specs, mesh=mesh,
                            donate_argnums=(0, 1)).memory_analysis()
        compiled_gib[score.name] = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                                    - m.alias_size_in_bytes) / _GIB
    chosen = next(s for s in result.baselines if s.name == result.chosen)
    # The choice as a user runs it: every equation pinned (ShardResult.jit); its specs alone beside it.
    m = result.jit(program.train_step, *program.abstract_args, mesh=mesh, donate_argnums=(0, 1)).lower(
        *program.abstract_args).compile().memory_analysis()
    row["specs_only_gib"] = compiled_gib[result.chosen]
    compiled_gib[result.chosen] = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                                   - m.alias_size_in_bytes) / _GIB
    row["pred_gib"], row["compiled_gib"] = chosen.memory.total_bytes / _GIB, compiled_gib[result.chosen]
    row["ratio"] = row["compiled_gib"] / row["pred_gib"]
    for score in result.baselines:  # predicted / compiled GiB, predicted step seconds
        row[score.name] = f"{score.memory.total_bytes / _GIB:.2f}/{compiled_gib[score.name]:.2f} {score.step_time_s:.3f}s"
    budget_gib = result.memory_budget_bytes / _GIB
    row["fits"], row["fsdp_fits"] = row["compiled_gib"] <= budget_gib, compiled_gib.get("fsdp", float("inf")) <= budget_gib
    row["shard_s"], row["compile_s"] = shard_s, time.perf_counter() - start
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="program names to run (default: all)")
    parser.add_argument("--small", action="store_true", help="test-size models (seconds each)")
    parser.add_argument("--time-limit-s", type=float, default=20.0, help="planner.intraop.shard's CP-SAT time limit")
    args = parser.parse_args(argv)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    rows = []
    for name, build in PROGRAMS.items():
        if args.only and name not in args.only:
            continue
        rows.append(run_program(build(small=args.small), mesh, time_limit_s=args.time_limit_s))
        print(f"{name}: compiled/predicted {rows[-1]['ratio']:.3f}, shard {rows[-1]['shard_s']:.1f} s", file=sys.stderr, flush=True)
    columns = ("program", "library", "params_b", "mesh", "chosen", "pred_gib", "compiled_gib", "ratio", "specs_only_gib", "planned", "dp",
               "fsdp", "fsdp_tp", "fits", "fsdp_fits", "shard_s", "compile_s")
    table = [{k: r.get(k, "-") for k in columns} for r in rows]
    print_table(f"planner.intraop.shard on library programs, 8 emulated devices, {HARDWARE} "
                "(GiB per device, predicted/compiled; ratio = compiled/predicted)", table)
    write_csv(Path("benchmarks/out/shard_programs.csv"), table)
    within = sum(abs(r["ratio"] - 1) <= TOLERANCE for r in rows)
    print(f"{within}/{len(rows)} programs: predicted memory within {TOLERANCE:.0%} of compiled")
    return 0 if within == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
