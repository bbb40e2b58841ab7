"""The search-vs-ILP bench: every planner on one strategy space, side by side.

The layout search picks the outer knobs for the model on the mesh; one stage's training
step on its non-pipeline axes becomes the costed strategy space; the ILP and each search
planner (per seed) solve it under the same time budget. Every row's step time is its choice
costed by that space's op-level model (per-op roofline, collectives, resharding on edges),
the objective the ILP minimises; ``grid`` is the best Megatron-rule layout (each axis data or
tensor parallel, ZeRO 0 or 3) with every op sharded as the rules shard it
(`planner.intraop.rule_based`), at its least time on that model. The ILP's objective is the
reference: its proven optimum, or its best plan with the gap when the time runs out. A row
more than 10 % above it gets a note saying where its time goes and why; the layout
simulator's prediction for the same stage stands beside them (``simulated_s``).

>>> from costmodel.inputs.model_config import ModelConfig
>>> m = ModelConfig(name="m", hidden_size=256, num_layers=2, num_heads=4, ffn_size=1024, vocab_size=512)
>>> result = compare(m, mesh="2x2", hardware="a100-80gb", seq_len=128, global_batch=8, planners=("ilp", "beam"), budget_s=5)
>>> [row.planner for row in result.rows], result.rows[0].gap_pct, result.simulated_s > 0
(['ilp', 'beam'], 0.0, True)
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import networkx as nx
from jax.sharding import PartitionSpec
from pydantic import BaseModel, ConfigDict, Field

from costmodel.errors import InfeasibleError, InvalidConfigError
from costmodel.hardware.machine import Machine, load_machine
from costmodel.inputs.layout import Layout, Recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import Attention
from costmodel.oplevel.op_time import OpTimeBreakdown, op_time_breakdown
from costmodel.oplevel.opgraph import OP_ATTR
from costmodel.oplevel.strategy_space import StrategySpace, build_space, prune_dominated
from planner.api import plan
from planner.intraop.ilp import solve_intra_op
from planner.intraop.rule_based import rule_based_space
from planner.intraop.stage import intra_op_axes, stage_estimate, stage_graph, stage_model, train_step_memory_factor
from planner.plan_schema import Plan
from planner.request import PlanRequest
from planner.shardings import logical_rules, param_specs
from search.strategy_search import SEARCH_PLANNERS, SearchRun, TracePoint, descend

COMPARED = ("ilp", "grid", *SEARCH_PLANNERS)
# Search planners stop on time here, not on evaluations, so all get the same wall budget.
_UNBOUNDED_EVALUATIONS = math.inf
NOTE_ABOVE_PCT = 10.0  # a row further above the ILP's objective says why


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
    note: str | None = Field(None, description="Why its step time is more than 10 % above the ILP's: where the time goes and "
                                               "what limited the planner (None within 10 %).")


class CompareResult(BaseModel):
    """The case, one row per planner, and every anytime trace."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    case: str = Field(description="Model, mesh, hardware, batch and the stage layout compared on.")
    free_nodes: int = Field(description="Decisions in the strategy space.")
    memory_fraction: float = Field(description="The ILP choice's per-device memory over HBM (how tight memory is).")
    reference_s: float = Field(description="The ILP's objective, the reference for gaps.")
    simulated_s: float = Field(description="The layout simulator's step time for the same stage and layout "
                                           "(`planner.intraop.stage.stage_estimate`), beside the op-level rows.")
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
    graph, full, space = _stage_spaces(outer, layout, axes, machine)
    if space.memory_bytes(space.least_memory_choice()) > machine.memory_budget_bytes and layout.recompute != Recompute.FULL:
        # The reference program keeps more attention intermediates than the simulator's
        # memory model assumes; full recompute makes the stage fit so there is a problem to compare on.
        layout = layout.model_copy(update={"recompute": Recompute.FULL})
        graph, full, space = _stage_spaces(outer, layout, axes, machine)
    ilp = solve_intra_op(space, memory_budget_bytes=machine.memory_budget_bytes, time_limit_s=budget_s)
    reference = ilp.objective_s
    ilp_parts = op_time_breakdown(graph, space, ilp.choice)
    ilp_trace = tuple(TracePoint(wall_s=w, evaluations=0, best_s=o) for w, o in ilp.trace)
    rows = [CompareRow(planner="ilp", status=ilp.status, step_time_s=reference, gap_pct=0.0, wall_s=ilp.solve_time_s,
                       first_feasible_s=ilp_trace[0].wall_s if ilp_trace else ilp.solve_time_s,
                       within_1pct_s=_first_within(ilp_trace, reference) or ilp.solve_time_s,
                       evaluations=ilp.variables, seeds=1, ilp_bound_gap_pct=100 * ilp.gap,
                       note=(f"not proven optimal: {100 * ilp.gap:.1f} % above its bound when the budget ran out"
                             if 100 * ilp.gap > NOTE_ABOVE_PCT else None))]
    traces = {"ilp": (ilp_trace,)}
    search_s = budget_s if search_time_factor is None else min(budget_s, search_time_factor * ilp.solve_time_s)
    for name in planners:
        if name == "ilp":
            continue
        if name == "grid":  # deterministic: one run stands for every seed
            grid = grid_over_rules(graph, full, stage_model(outer.model, layout), axes,
                                   memory_budget_bytes=machine.memory_budget_bytes, time_limit_s=search_s)
            runs, parts = [grid.run], grid.parts
            why = f"the best rule layout, {grid.layout}, shards every op as Megatron's rules do; the ILP shards each op freely"
        else:
            runs = [SEARCH_PLANNERS[name](space, memory_budget_bytes=machine.memory_budget_bytes, time_limit_s=search_s, seed=seed,
                                             max_evaluations=_UNBOUNDED_EVALUATIONS)
                    for seed in range(seeds)]
            best_run = min(runs, key=lambda r: r.objective_s)
            parts = op_time_breakdown(graph, space, best_run.choice) if best_run.feasible else None
            wall_s = statistics.median(r.wall_s for r in runs)
            why = (f"the search stopped at its {search_s:g} s budget: more time or seeds may close the gap" if wall_s >= 0.9 * search_s
                   else f"the search ended at a local optimum after {wall_s:.2f} s of its {search_s:g} s: other seeds may close the gap")
        feasible = [r for r in runs if r.feasible]
        best = statistics.median(r.objective_s for r in feasible) if feasible else None
        firsts = [r.trace[0].wall_s for r in feasible]
        withins = [_first_within(r.trace, reference) for r in runs]
        gap_pct = 100 * (best / reference - 1) if best is not None else None
        rows.append(CompareRow(
            planner=name, status="FEASIBLE" if feasible else "NONE", step_time_s=best, gap_pct=gap_pct,
            wall_s=statistics.median(r.wall_s for r in runs), first_feasible_s=statistics.median(firsts) if firsts else None,
            within_1pct_s=statistics.median(withins) if all(w is not None for w in withins) else None,
            evaluations=int(statistics.median(r.evaluations for r in runs)), seeds=len(runs),
            note=gap_note(parts, ilp_parts, why) if gap_pct is not None and gap_pct > NOTE_ABOVE_PCT and parts else None))
        traces[name] = tuple(r.trace for r in runs)
    case = (f"{outer.model.name} on {mesh} {hardware}, {outer.train.seq_len}×{global_batch} tokens; stage of dp{layout.dp} "
            f"tp{layout.tp} pp{layout.pp} mb{layout.micro_batch} {layout.recompute} over {', '.join(n for n, _ in axes)}")
    return CompareResult(case=case, free_nodes=len(space.strategies), memory_fraction=ilp.memory_bytes / machine.hbm_bytes,
                         reference_s=reference, simulated_s=stage_estimate(outer.model, outer.train, layout, machine).step_time_s,
                         rows=tuple(rows), traces=traces)


def _stage_spaces(outer: Plan, layout: Layout, axes: list[tuple[str, int]],
                  machine: Machine) -> tuple[nx.DiGraph, StrategySpace, StrategySpace]:
    """The stage's graph, its whole strategy space (the rules restrict it) and that space pruned (the planners search it)."""
    graph, _ = stage_graph(outer.model, outer.train, layout)
    full = build_space(graph, machine.mesh_groups(axes), machine, memory_factor=train_step_memory_factor)
    return graph, full, prune_dominated(full)


def gap_note(parts: OpTimeBreakdown, reference: OpTimeBreakdown, why: str) -> str:
    """Where a row's time above the ILP's goes (the op-level kinds it loses most on), and why.

    >>> ilp = OpTimeBreakdown(matmul_s=1.0, memory_s=0.5, collective_s=0.1, reshard_s=0.0)
    >>> gap_note(ilp.model_copy(update={"matmul_s": 1.8, "reshard_s": 0.2}), ilp, "replicated ops")
    '+1.000 s: matmuls +0.800 s, resharding +0.200 s; replicated ops'
    """
    kinds = (("matmuls", "matmul_s"), ("memory-bound ops", "memory_s"), ("collectives", "collective_s"), ("resharding", "reshard_s"))
    deltas = sorted(((getattr(parts, f) - getattr(reference, f), name) for name, f in kinds), reverse=True)
    total = sum(d for d, _ in deltas)
    return f"{total:+.3f} s: " + ", ".join(f"{name} {d:+.3f} s" for d, name in deltas if d > 0.05 * total) + f"; {why}"


class RuleGrid(NamedTuple):
    """The hand-tuning grid's answer: its best rule layout's run, name and op-level time by kind."""

    run: SearchRun
    layout: str
    parts: OpTimeBreakdown | None  # None when no rule layout fits


def grid_over_rules(graph: nx.DiGraph, full: StrategySpace, stage: ModelConfig, axes: list[tuple[str, int]], *,
                    memory_budget_bytes: float, time_limit_s: float = math.inf) -> RuleGrid:
    """The hand-tuning grid on the strategy space ``full`` of ``graph``: every way to give each mesh axis a role.

    Each axis carries data or tensor (Megatron) parallelism, with or without ZeRO-3; the
    rule-based shardings fix the parameters, optimizer moments and batch, and every op is
    restricted to the sharding the rules give it (`planner.intraop.rule_based`): the batch
    split over the data axes, the parameters' tensor axes kept. Each grid point is costed at
    its least op-level time: a descent, then the ILP on what the rules leave within the
    point's share of the time. The best grid point wins; its trace is one point per grid point.
    """
    inputs = {d[OP_ATTR].label for _, d in graph.nodes(data=True) if d[OP_ATTR].is_input}
    batch = sorted(label for label in inputs if label.startswith("[2]"))
    sizes = dict(axes)
    points = [(roles, zero) for roles in itertools.product(("dp", "tp"), repeat=len(axes)) for zero in (0, 3)
              if zero == 0 or "dp" in roles]  # ZeRO-3 without a data axis is the same point as ZeRO 0
    best: tuple[SearchRun, str, StrategySpace] | None = None
    trace: list[TracePoint] = []
    start = time.perf_counter()
    for index, (roles, zero) in enumerate(points):
        by_kind = {k: tuple(name for (name, _), r in zip(axes, roles) if r == k) for k in ("dp", "tp", "pp", "cp")}
        layout = Layout(dp=math.prod(sizes[a] for a in by_kind["dp"]), tp=math.prod(sizes[a] for a in by_kind["tp"]),
                        zero_stage=zero)
        specs = {label: PartitionSpec(by_kind["dp"] or None) for label in batch}
        for path, spec in param_specs(stage, logical_rules(layout, by_kind, stage), sizes).items():
            keys = "".join(f"['{k}']" for k in path.split("/"))
            specs |= {prefix + keys: PartitionSpec(*spec) for prefix in ("[0]", "[1]['m']", "[1]['v']") if prefix + keys in inputs}
        try:
            rules = rule_based_space(graph, full, specs, batch=batch, data_axes=by_kind["dp"], tensor_axes=by_kind["tp"])
        except ValueError:
            continue  # the space has no strategy for that input split (e.g. a batch the data axes do not divide)
        share_s = max(0.0, (time_limit_s - (time.perf_counter() - start)) / (len(points) - index))
        descent = descend(rules, start={}, memory_budget_bytes=memory_budget_bytes, time_limit_s=share_s)
        try:
            solution = solve_intra_op(rules, memory_budget_bytes=memory_budget_bytes, time_limit_s=share_s,
                                      fallback_choice=descent.choice if descent.feasible else None)
        except InfeasibleError:
            continue  # the rules' least-memory sharding does not fit
        if best is None or solution.objective_s < best[0].objective_s:
            run = SearchRun(planner="grid", seed=0, choice=solution.choice, objective_s=solution.objective_s,
                            memory_bytes=solution.memory_bytes, feasible=True, evaluations=index + 1,
                            wall_s=time.perf_counter() - start, trace=())
            name = ", ".join(f"{kind} over {'×'.join(names)}" for kind, names in by_kind.items() if names) + f", ZeRO {zero}"
            best = (run, name, rules)
            trace.append(TracePoint(wall_s=time.perf_counter() - start, evaluations=index + 1, best_s=solution.objective_s))
    wall_s = time.perf_counter() - start
    if best is None:
        return RuleGrid(run=SearchRun(planner="grid", seed=0, choice={}, objective_s=math.inf, memory_bytes=math.inf, feasible=False,
                                      evaluations=len(points), wall_s=wall_s, trace=()), layout="none fits", parts=None)
    run, name, rules = best
    return RuleGrid(run=run.model_copy(update={"evaluations": len(points), "wall_s": wall_s, "trace": tuple(trace)}), layout=name,
                    parts=op_time_breakdown(graph, rules, run.choice))


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
