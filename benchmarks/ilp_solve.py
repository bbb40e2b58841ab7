"""Intra-op ILP size and solve time on whole training steps (llama3-70b on 8x4 among them).

    python -m benchmarks.ilp_solve [--time-limit-s 60] [--out benchmarks/out/ilp_solve.csv]

For each case: trace the reference training step (AdamW, one micro-batch per data-parallel
replica), build and prune the costed strategy space on the mesh, solve the CP-SAT ILP
within the device's HBM. Prints a table and writes a CSV. The 8- and 80-layer rows show
that the problem does not grow with depth (layers are one scanned body).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.output import print_table, write_csv
from costmodel.errors import InfeasibleError
from costmodel.hardware.machine import load_machine
from costmodel.inputs.train_config import TrainConfig
from costmodel.oplevel.strategy_space import build_space, prune_dominated
from planner.config import load_model
from planner.intraop.extract import extract_graph
from planner.intraop.ilp import solve_intra_op
from planner.intraop.stage import train_step_memory_factor
from planner.programs.train_step import abstract_train_inputs, make_train_step

_GIB = 2**30
# (model, layers or None for all, mesh axes, hardware, seq_len, sequences per step, remat)
CASES = (
    ("llama3-70b", None, (("data", 8), ("tensor", 4)), "h100-sxm", 4096, 8, "full"),
    ("llama3-70b", 8, (("data", 8), ("tensor", 4)), "h100-sxm", 4096, 8, "full"),
    ("llama3-70b", None, (("data", 8), ("tensor", 4)), "h100-sxm", 4096, 8, "selective"),
    ("llama3-70b", None, (("data", 8), ("tensor", 4)), "h100-sxm", 4096, 8, "none"),
    ("llama3-8b", None, (("data", 8), ("tensor", 4)), "h100-sxm", 4096, 32, "full"),
    ("gpt2", None, (("data", 4), ("tensor", 2)), "a100-80gb", 1024, 64, "none"),
)


def run_case(model: str, layers: int | None, axes: tuple[tuple[str, int], ...], hardware: str, seq_len: int,
             batch: int, remat: str, time_limit_s: float) -> dict:
    cfg = load_model(model)
    if layers:
        cfg = cfg.model_copy(update={"num_layers": layers})
    train = TrainConfig(seq_len=seq_len, global_batch=batch)
    start = time.perf_counter()
    graph = extract_graph(make_train_step(cfg, train, remat=remat), *abstract_train_inputs(cfg, train))
    extract_s = time.perf_counter() - start
    machine = load_machine(hardware)
    start = time.perf_counter()
    space = prune_dominated(build_space(graph, machine.mesh_groups(list(axes)), machine, memory_factor=train_step_memory_factor))
    space_s = time.perf_counter() - start
    row = {"model": model, "layers": cfg.num_layers, "mesh": "x".join(str(s) for _, s in axes), "hardware": hardware,
           "tokens": seq_len * batch, "remat": remat, "ops": graph.number_of_nodes(), "free_nodes": len(space.strategies),
           "strategies": sum(len(s) for s in space.strategies.values()),
           "edge_pairs": sum(e.matrix.size for e in space.edges), "extract_s": round(extract_s, 2), "space_s": round(space_s, 2)}
    try:
        solution = solve_intra_op(space, memory_budget_bytes=machine.hbm_bytes, time_limit_s=time_limit_s)
    except InfeasibleError as error:
        return {**row, "status": "INFEASIBLE", "gap": "", "objective_s": "", "memory_gib": "", "variables": "",
                "solve_s": "", "note": str(error).split(";")[0]}
    return {**row, "status": solution.status, "gap": round(solution.gap, 4), "objective_s": round(solution.objective_s, 4),
            "memory_gib": round(solution.memory_bytes / _GIB, 1), "variables": solution.variables,
            "solve_s": round(solution.solve_time_s, 2), "note": ""}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit-s", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/ilp_solve.csv"))
    args = parser.parse_args(argv)
    rows = [run_case(*case, time_limit_s=args.time_limit_s) for case in CASES]
    print_table("Intra-op ILP (CP-SAT) on whole training steps", rows)
    write_csv(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
