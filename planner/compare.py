"""The search-vs-ILP bench: every planner on one strategy space, side by side.

The layout search picks the outer knobs for the model on the mesh; one stage's training
step on its non-pipeline axes becomes the costed strategy space; the ILP and each search
planner (per seed) solve it under the same time budget. The ILP's objective is the
reference: its proven optimum, or its best plan with the gap when the time runs out.

>>> from costmodel.inputs.model_config import ModelConfig
>>> m = ModelConfig(name="m", hidden_size=256, num_layers=2, num_heads=4, ffn_size=1024, vocab_size=512)
>>> result = compare(m, mesh="2x2", hardware="a100-80gb", seq_len=128, global_batch=8, planners=("ilp", "beam"), budget_s=5)
>>> [row.planner for row in result.rows], result.rows[0].gap_pct
(['ilp', 'beam'], 0.0)
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from pathlib import Path

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field

from costmodel.errors import InvalidConfigError
from costmodel.hardware.machine import load_machine
from costmodel.inputs.layout import Layout, Recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import Attention
from costmodel.oplevel.opgraph import OP_ATTR
from costmodel.oplevel.strategy_space import StrategySpace
from planner.api import plan
from planner.intraop.ilp import solve_intra_op
from planner.intraop.stage import intra_op_axes, stage_model, stage_space
from planner.request import PlanRequest
from planner.shardings import logical_rules, param_specs
from search.strategy_search import SEARCH_PLANNERS, SearchRun, TracePoint, descend

COMPARED = ("ilp", "grid", *SEARCH_PLANNERS)
# Search planners stop on time here, not on evaluations, so all get the same wall budget.
_UNBOUNDED_EVALUATIONS = 10**9


class CompareRow(BaseModel):
    """One planner's result on the case (medians over seeds for a search planner)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    planner: str = Field(description="ilp, grid, anneal, beam or random.")
    status: str = Field(description="ILP: OPTIMAL or FEASIBLE; search: FEASIBLE, or NONE when no seed found a feasible choice.")
    step_time_s: float | None = Field(description="Best predicted objective: seconds of one stage micro-batch step.")
    gap_pct: float | None = Field(description="Percent above the ILP's objective.")
    wall_s: float = Field(description="Seconds the planner ran.")
    first_feasible_s: float | None = Field(description="Seconds to its first feasible choice.")
    within_1pct_s: float | None = Field(description="Seconds until within 1 % of the ILP's objective (None: never).")
    evaluations: int = Field(description="Candidates evaluated (ILP: Boolean variables of the model).")
    seeds: int = Field(description="Seeds run.")
    ilp_bound_gap_pct: float | None = Field(None, description="ILP only: percent between its objective and its proven bound.")


class CompareResult(BaseModel):
    """The case, one row per planner, and every anytime trace."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    case: str = Field(description="Model, mesh, hardware, batch and the stage layout compared on.")
    free_nodes: int = Field(description="Decisions in the strategy space.")
    memory_fraction: float = Field(description="The ILP choice's per-device memory over HBM (how tight memory is).")
    reference_s: float = Field(description="The ILP's objective, the reference for gaps.")
    rows: tuple[CompareRow, ...] = Field(description="One row per planner.")
    traces: dict[str, tuple[tuple[TracePoint, ...], ...]] = Field(description="Planner → one anytime trace per seed.")

    def trace_rows(self) -> list[dict[str, float | int | str]]:
        """Every trace point as a CSV row: planner, seed, wall_s, evaluations, best_s."""
        return [{"planner": name, "seed": seed, "wall_s": p.wall_s, "evaluations": p.evaluations, "best_s": p.best_s}
                for name, traces in self.traces.items() for seed, trace in enumerate(traces) for p in trace]


def compare(model: str | ModelConfig, *, mesh: str, hardware: str = "h100-sxm", seq_len: int | None = None,
            global_batch: int = 256, planners: tuple[str, ...] = COMPARED, budget_s: float = 30.0, seeds: int = 3,
            search_time_factor: float | None = None) -> CompareResult:
    """Run ``planners`` on the strategy space of ``model`` on ``mesh``, the same wall budget each.

    With ``search_time_factor`` a search planner gets that multiple of the ILP's wall time
    instead (at most ``budget_s``).
    """
    unknown = [p for p in planners if p not in COMPARED]
    if unknown or "ilp" not in planners:
        raise InvalidConfigError(f"cannot compare planners {', '.join(unknown) or '(no ilp)'}",
                                 fix=f"choose among {', '.join(COMPARED)}, ilp included")
    outer = plan(PlanRequest(model=model, mesh=mesh, hardware=hardware, seq_len=seq_len, global_batch=global_batch,
                             attention=Attention.MATERIALIZED))
    machine = load_machine(hardware)
    axes = intra_op_axes(outer.mesh)
    if not axes:
        raise InvalidConfigError("the chosen layout is pure pipeline parallelism: there is no intra-op sharding to compare",
                                 fix="use a mesh with a data or tensor axis")
    layout = outer.layout
    graph, space, _ = stage_space(outer.model, outer.train, layout, axes, machine)
    if space.memory_bytes(space.least_memory_choice()) > machine.hbm_bytes and layout.recompute != Recompute.FULL:
        # The reference program keeps more attention intermediates than the simulator's
        # memory model assumes; full recompute makes the stage fit so there is a problem to compare on.
        layout = layout.model_copy(update={"recompute": Recompute.FULL})
        graph, space, _ = stage_space(outer.model, outer.train, layout, axes, machine)
    ilp = solve_intra_op(space, memory_budget_bytes=machine.hbm_bytes, time_limit_s=budget_s)
    reference = ilp.objective_s
    ilp_trace = tuple(TracePoint(wall_s=w, evaluations=0, best_s=o) for w, o in ilp.trace)
    rows = [CompareRow(planner="ilp", status=ilp.status, step_time_s=reference, gap_pct=0.0, wall_s=ilp.solve_time_s,
                       first_feasible_s=ilp_trace[0].wall_s if ilp_trace else ilp.solve_time_s,
                       within_1pct_s=_first_within(ilp_trace, reference) or ilp.solve_time_s,
                       evaluations=ilp.variables, seeds=1, ilp_bound_gap_pct=100 * ilp.gap)]
    traces = {"ilp": (ilp_trace,)}
    search_s = budget_s if search_time_factor is None else min(budget_s, search_time_factor * ilp.solve_time_s)
    for name in planners:
        if name == "ilp":
            continue
        if name == "grid":  # deterministic: one run stands for every seed
            runs = [grid_over_rules(space, graph, stage_model(outer.model, layout), axes,
                                    memory_budget_bytes=machine.hbm_bytes, time_limit_s=search_s)]
        else:
            extra = {} if name == "beam" else {"max_evaluations": _UNBOUNDED_EVALUATIONS}
            runs = [SEARCH_PLANNERS[name](space, memory_budget_bytes=machine.hbm_bytes, time_limit_s=search_s, seed=seed, **extra)
                    for seed in range(seeds)]
        feasible = [r for r in runs if r.feasible]
        best = statistics.median(r.objective_s for r in feasible) if feasible else None
        firsts = [r.trace[0].wall_s for r in feasible]
        withins = [_first_within(r.trace, reference) for r in runs]
        rows.append(CompareRow(
            planner=name, status="FEASIBLE" if feasible else "NONE", step_time_s=best,
            gap_pct=100 * (best / reference - 1) if best is not None else None,
            wall_s=statistics.median(r.wall_s for r in runs), first_feasible_s=statistics.median(firsts) if firsts else None,
            within_1pct_s=statistics.median(withins) if all(w is not None for w in withins) else None,
            evaluations=int(statistics.median(r.evaluations for r in runs)), seeds=len(runs)))
        traces[name] = tuple(r.trace for r in runs)
    case = (f"{outer.model.name} on {mesh} {hardware}, {outer.train.seq_len}×{global_batch} tokens; stage of dp{layout.dp} "
            f"tp{layout.tp} pp{layout.pp} mb{layout.micro_batch} {layout.recompute} over {', '.join(n for n, _ in axes)}")
    return CompareResult(case=case, free_nodes=len(space.strategies), memory_fraction=ilp.memory_bytes / machine.hbm_bytes,
                         reference_s=reference, rows=tuple(rows), traces=traces)


def grid_over_rules(space: StrategySpace, graph: nx.DiGraph, stage: ModelConfig, axes: list[tuple[str, int]], *,
                    memory_budget_bytes: float, time_limit_s: float = math.inf) -> SearchRun:
    """The hand-tuning grid on the strategy space: every way to give each mesh axis a role.

    Each axis carries data or tensor (Megatron) parallelism, with or without ZeRO-3; the
    rule-based shardings fix the parameters, optimizer moments and batch, and the other ops
    descend to their best strategies given those. Parameters whose rule sharding was pruned
    as dominated are left free. The best grid point wins; its trace is one point per grid point.
    """
    inputs = {d[OP_ATTR].label: n for n, d in graph.nodes(data=True) if d[OP_ATTR].is_input}
    sizes = dict(axes)
    best: SearchRun | None = None
    trace: list[TracePoint] = []
    evaluations, start = 0, time.perf_counter()
    for roles, zero in itertools.product(itertools.product(("dp", "tp"), repeat=len(axes)), (0, 3)):
        by_kind = {k: tuple(name for (name, _), r in zip(axes, roles) if r == k) for k in ("dp", "tp", "pp", "cp")}
        layout = Layout(dp=math.prod(sizes[a] for a in by_kind["dp"]), tp=math.prod(sizes[a] for a in by_kind["tp"]),
                        zero_stage=zero if by_kind["dp"] else 0)
        wanted = {}
        for path, spec in param_specs(stage, logical_rules(layout, by_kind, stage), sizes).items():
            keys = "".join(f"['{k}']" for k in path.split("/"))
            for prefix in ("[0]", "[1]['m']", "[1]['v']"):
                wanted[inputs.get(prefix + keys)] = tuple(() if a is None else (a,) if isinstance(a, str) else tuple(a) for a in spec)
        for label in ("[2]['tokens']", "[2]['targets']"):
            rank = len(graph.nodes[inputs[label]][OP_ATTR].outputs[0].shape)
            wanted[inputs[label]] = (by_kind["dp"],) + ((),) * (rank - 1)
        fixed = {}
        for node, sharding in wanted.items():
            match = next((i for i, s in enumerate(space.strategies.get(node, ())) if s.results[0] == sharding), None)
            if match is not None:
                fixed[node] = match
        run = descend(space, start=fixed, fixed=frozenset(fixed), memory_budget_bytes=memory_budget_bytes,
                      time_limit_s=max(0.0, time_limit_s - (time.perf_counter() - start)))
        evaluations += run.evaluations
        if run.feasible and (best is None or run.objective_s < best.objective_s):
            best = run
            trace.append(TracePoint(wall_s=time.perf_counter() - start, evaluations=evaluations, best_s=run.objective_s))
        if time.perf_counter() - start > time_limit_s:
            break
    if best is None:
        return SearchRun(planner="grid", seed=0, choice={}, objective_s=math.inf, memory_bytes=math.inf, feasible=False,
                         evaluations=evaluations, wall_s=time.perf_counter() - start, trace=())
    return best.model_copy(update={"planner": "grid", "evaluations": evaluations, "wall_s": time.perf_counter() - start,
                                   "trace": tuple(trace)})


def _first_within(trace: tuple[TracePoint, ...], reference_s: float, tolerance: float = 0.01) -> float | None:
    return next((p.wall_s for p in trace if p.best_s <= reference_s * (1 + tolerance)), None)


def plot_traces(result: CompareResult, path: Path) -> None:
    """Gap to the ILP's objective against wall time, one line per planner, seeds as a band."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    draw_traces(result, ax)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_traces(result: CompareResult, ax) -> None:
    """Draw ``result``'s anytime traces on a matplotlib axes."""
    for name, all_traces in result.traces.items():
        traces = [t for t in all_traces if t]
        points = sorted({p.wall_s for t in traces for p in t})
        if not points:
            continue
        if name == "ilp":
            ax.axvline(points[-1], linestyle="--", color="black", label=f"ilp {result.rows[0].status.lower()}")
            continue
        gaps = [[_gap_at(t, w, result.reference_s) for t in traces] for w in points]
        line, = ax.step(points, [statistics.median(g) for g in gaps], where="post", label=name)
        if len(traces) > 1:
            ax.fill_between(points, [min(g) for g in gaps], [max(g) for g in gaps], step="post", alpha=0.2,
                            color=line.get_color())
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("gap to ILP objective (%)")
    ax.set_title(result.case, fontsize=7)
    ax.legend(fontsize=7)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _gap_at(trace: tuple[TracePoint, ...], wall_s: float, reference_s: float) -> float:
    """Gap (%) of the best found by ``wall_s``; before the first feasible point, the first one's."""
    known = [p.best_s for p in trace if p.wall_s <= wall_s] or [trace[0].best_s]
    return 100 * (known[-1] / reference_s - 1)
