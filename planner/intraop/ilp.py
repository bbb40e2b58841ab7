"""The intra-op ILP: one strategy per free node of a `StrategySpace`, solved with OR-Tools CP-SAT.

Variables: ``x[n, s]`` (node n takes strategy s, exactly one per node) and, per edge,
``y[e, p, c]`` (the source hands the tensors over in sharding class p, the destination
wants class c). ``y`` is tied to ``x`` by its row and column sums, the tight
(marginal-polytope) linearization of the quadratic edge cost. Per-device memory — the
parameters, gradients and optimizer state the inputs hold, plus the activations kept for
the backward pass — stays within budget; predicted time is minimized.

CP-SAT runs single-threaded with LP-heavy search (``linearization_level=2``), measured
to prove optimality in seconds where the default portfolio stalls (FACTS.md); with the
whole LP loaded up front and no probing it proves the llama3-70b train step on 8x4
optimal in 4.5 s instead of 10.5 s (benchmarks/ilp_solve.py). Big models (unrolled
layers) skip presolve and run the root LP to its optimum. The model is written straight into its proto,
which the expression API would build alike but seconds slower. A fixed seed and a
deterministic time limit make the same input give the same plan (a loaded machine can hit
the wall-clock limit first).

>>> from costmodel.step.collectives import Group, Tier
>>> from costmodel.hardware.machine import load_machine
>>> from costmodel.oplevel.opgraph import LoopNest, OpNode, TensorSpec, add_input, add_op, new_op_graph
>>> from costmodel.oplevel.strategy_space import build_space
>>> t = lambda *s: TensorSpec(shape=s, dtype="bfloat16")
>>> g = new_op_graph("matmul")
>>> x, w = add_input(g, t(4096, 1024), label="x"), add_input(g, t(1024, 1024), label="w")
>>> nest = LoopNest(sizes=(4096, 1024, 1024), reduced=(False, False, True), operands=((0, 2), (2, 1)), results=((0, 1),))
>>> y = add_op(g, OpNode(primitive="dot_general", inputs=(t(4096, 1024), t(1024, 1024)), outputs=(t(4096, 1024),),
...                      flops=2 * 4096 * 1024 * 1024, loops=nest), [(x, 0), (w, 0)])
>>> tier = Tier(bytes_per_s=1e11, latency_s=1e-6)
>>> space = build_space(g, {"data": Group(n=4, n_nodes=1, intra=tier, inter=tier)}, load_machine("a100-80gb"))
>>> solution = solve_intra_op(space, memory_budget_bytes=1e9)
>>> from costmodel.oplevel.strategies import shard_factor
>>> solution.status, shard_factor(space.chosen(y, solution.choice).results[0], {"data": 4})  # the matmul is split 4 ways
('OPTIMAL', 4)
"""

from __future__ import annotations

import math
import time
from typing import Any, Mapping, Sequence

import numpy as np
from ortools.sat.python import cp_model
from pydantic import BaseModel, ConfigDict, Field

from costmodel.errors import InfeasibleError
from costmodel.oplevel.strategy_space import StrategySpace, format_bytes

# Integer units of the objective and the memory row: CP-SAT needs integer coefficients.
_TIME_UNIT_S = 1e-8
_MEMORY_UNIT_BYTES = 1024
# Models this big (unrolled layers; a scanned program's has ~40k) skip presolve (see solve_intra_op).
_BIG_MODEL_VARIABLES = 100_000


class IntraOpSolution(BaseModel):
    """The strategy chosen for every free node, and how sure the solver is it is best."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    choice: dict[int, int] = Field(description="Free node id → index of its chosen strategy.")
    status: str = Field(description="OPTIMAL (proven) or FEASIBLE (best found within the time limit).")
    objective_s: float = Field(description="Predicted seconds of the chosen strategies: compute, collectives, resharding.")
    bound_s: float = Field(description="Proven lower bound on the objective.")
    gap: float = Field(description="(objective − bound) / objective; 0 when OPTIMAL.")
    memory_bytes: float = Field(description="Per-device memory of the choice.")
    solve_time_s: float = Field(description="Wall seconds in CP-SAT.")
    variables: int = Field(description="Boolean variables of the model.")
    trace: tuple[tuple[float, float], ...] = Field((), description="(wall seconds, objective seconds) of each improving solution.")
    fallback: str = Field("", description="'' when CP-SAT found the choice; when the time limit passed before it found "
                                          "any: 'given' (the fallback_choice given, which fits every memory row) or 'least_memory'.")


def solve_intra_op(space: StrategySpace, *, memory_budget_bytes: float, time_limit_s: float = 20.0,
                   seed: int = 0, memory_rows: Sequence[dict[int, np.ndarray]] = (),
                   fallback_choice: Mapping[int, int] | None = None) -> IntraOpSolution:
    """Choose one strategy per free node of ``space``: least predicted time within the memory budget.

    ``memory_rows``: further per-device memory limits, each free node → bytes of each of its
    strategies (e.g. what is live at one program point, costmodel/oplevel/program_memory.py); each row's sum
    stays within the budget too. ``fallback_choice``: a known choice (free node → index), e.g.
    another candidate's answer, returned if CP-SAT finds none in time. It is no CP-SAT solution
    hint: hints slowed the LP-led search 1.8x on library programs (benchmarks/shard_programs.py).

    Raises InfeasibleError when even the least-memory choice exceeds the budget. When the
    time limit passes before CP-SAT finds a solution (``time_limit_s=0``: no search at all),
    ``fallback_choice`` if it fits every memory row, else the least-memory choice, is returned as
    FEASIBLE with its gap to the proven bound.
    """
    space.check_fits(memory_budget_bytes)
    if time_limit_s <= 0:
        return _solution(space, *_fallback(space, fallback_choice, memory_budget_bytes, memory_rows), optimal=False, bound_s=0.0,
                         solve_time_s=0.0, variables=model_variables(space))
    model, first = _build_model(space, memory_budget_bytes=memory_budget_bytes, memory_rows=memory_rows)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.linearization_level = 2
    solver.parameters.add_lp_constraints_lazily = False
    solver.parameters.cp_model_probing_level = 0
    if len(model.proto.variables) >= _BIG_MODEL_VARIABLES:
        # On the 300-600k variables of unrolled library programs (benchmarks/shard_programs.py)
        # presolve spent 5-7 s for nothing the LP does not find anyway, and letting the root LP
        # run to its optimum rather than 2,000 iterations at a time saved 20-45 % of the search.
        solver.parameters.cp_model_presolve = False
        solver.parameters.root_lp_iterations = 100_000
    solver.parameters.random_seed = seed
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.max_deterministic_time = time_limit_s
    recorder = _Recorder()
    status = solver.solve(model, recorder)
    elapsed = time.perf_counter() - recorder.start
    if status == cp_model.INFEASIBLE:
        raise InfeasibleError(f"no sharding fits in {format_bytes(memory_budget_bytes)} per device",
                              fix="use more devices, a smaller batch, or activation recompute")
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        values = np.asarray(solver.response_proto.solution)
        choice = {n: int(np.argmax(values[first[n]:first[n] + len(s)])) for n, s in space.strategies.items()}
        fallback = ""
    else:
        # Out of time before a first solution (a big model can spend its limit loading the LP).
        choice, fallback = _fallback(space, fallback_choice, memory_budget_bytes, memory_rows)
    bound_s = 0.0 if status == cp_model.MODEL_INVALID else solver.best_objective_bound * _TIME_UNIT_S
    return _solution(space, choice, fallback, optimal=status == cp_model.OPTIMAL, bound_s=bound_s, solve_time_s=elapsed,
                     variables=len(model.proto.variables), trace=tuple(recorder.points))


def model_variables(space: StrategySpace) -> int:
    """Boolean variables of ``space``'s model: one per strategy (``x``) and per edge class pair (``y``).

    >>> from costmodel.oplevel.strategy_space import StrategySpace
    >>> model_variables(StrategySpace(groups={}, strategies={0: ("a", "b")}, followers={}, node_time_s={}, node_memory_bytes={}, edges=()))
    2
    """
    return sum(map(len, space.strategies.values())) + sum(e.matrix.size for e in space.edges)


def _fallback(space: StrategySpace, given: Mapping[int, int] | None, memory_budget_bytes: float,
              memory_rows: Sequence[dict[int, np.ndarray]]) -> tuple[dict[int, int], str]:
    """The answer without a solver's: the ``given`` choice if it fits, else the least-memory one, which
    fits whenever anything does."""
    if given is not None and _fits(space, given, memory_budget_bytes=memory_budget_bytes, memory_rows=memory_rows):
        return dict(given), "given"
    return space.least_memory_choice(), "least_memory"


def _solution(space: StrategySpace, choice: dict[int, int], fallback: str, *, optimal: bool, bound_s: float,
              solve_time_s: float, variables: int, trace: tuple[tuple[float, float], ...] = ()) -> IntraOpSolution:
    objective_s = space.total_time_s(choice)
    return IntraOpSolution(
        choice=choice, status="OPTIMAL" if optimal else "FEASIBLE", objective_s=objective_s,
        bound_s=objective_s if optimal else min(bound_s, objective_s),
        gap=0.0 if optimal or objective_s <= 0 else max(0.0, 1 - bound_s / objective_s),
        memory_bytes=space.memory_bytes(choice), solve_time_s=solve_time_s, variables=variables, trace=trace,
        fallback=fallback,
    )


def _build_model(space: StrategySpace, *, memory_budget_bytes: float,
                 memory_rows: Sequence[dict[int, np.ndarray]]) -> tuple[cp_model.CpModel, dict[int, int]]:
    """The CP-SAT model, written straight into its proto (the expression API costs seconds at
    300k variables), and each free node's first ``x`` variable index.

    Every ``x`` precedes every ``y``, and each block is numbered in order, so the terms of each
    row come out sorted by variable as the expression API writes them.
    """
    model = cp_model.CpModel()
    proto = model.proto
    first: dict[int, int] = {}
    names: list[str] = []
    for n, strategies in space.strategies.items():
        first[n] = len(names)
        names += [f"x{n}_{i}" for i in range(len(strategies))]
    y_first = []
    for e_index, edge in enumerate(space.edges):
        y_first.append(len(names))
        names += [f"y{e_index}_{p}_{c}" for p in range(edge.matrix.shape[0]) for c in range(edge.matrix.shape[1])]
    proto.merge_text_format("".join(f'variables {{ name: "{name}" domain: 0 domain: 1 }} ' for name in names))
    objective_vars: list[np.ndarray] = []
    objective_units: list[np.ndarray] = []
    for n, strategies in space.strategies.items():
        proto.constraints.add().exactly_one.literals.extend(range(first[n], first[n] + len(strategies)))
        units = _units_array(space.node_time_s[n])
        objective_vars.append(first[n] + np.flatnonzero(units))
        objective_units.append(units[units != 0])
    for edge, y0 in zip(space.edges, y_first):
        n_src, n_dst = edge.matrix.shape
        for p in range(n_src):
            _add_equal(proto, list(range(y0 + p * n_dst, y0 + (p + 1) * n_dst)), first[edge.src] + np.flatnonzero(edge.src_class == p))
        for c in range(n_dst):
            _add_equal(proto, list(range(y0 + c, y0 + n_src * n_dst, n_dst)), first[edge.dst] + np.flatnonzero(edge.dst_class == c))
        flat = edge.matrix.ravel()
        units = np.where(flat > 0, _units_array(flat), 0)
        objective_vars.append(y0 + np.flatnonzero(units))
        objective_units.append(units[units != 0])
    if math.isfinite(memory_budget_bytes):
        cap = int(memory_budget_bytes // _MEMORY_UNIT_BYTES)
        arguments = {n: space.node_memory_bytes[n] for n in space.strategies}
        for row in [arguments, *memory_rows]:
            _add_at_most(proto, [(first[n] + i, math.ceil(b / _MEMORY_UNIT_BYTES)) for n, bs in row.items()
                                 for i, b in enumerate(bs) if b > 0], cap)
    proto.objective.vars.extend(np.concatenate(objective_vars).tolist())
    proto.objective.coeffs.extend(np.concatenate(objective_units).tolist())
    proto.objective.scaling_factor = 1
    return model, first


def _fits(space: StrategySpace, choice: Mapping[int, int], *, memory_budget_bytes: float,
          memory_rows: Sequence[dict[int, np.ndarray]]) -> bool:
    """Whether ``choice`` satisfies the model's memory rows, in its integer units."""
    if not math.isfinite(memory_budget_bytes):
        return True
    cap = int(memory_budget_bytes // _MEMORY_UNIT_BYTES)
    return all(sum(math.ceil(row[n][i] / _MEMORY_UNIT_BYTES) for n, i in choice.items() if n in row) <= cap
               for row in [space.node_memory_bytes, *memory_rows])


def _add_equal(proto: Any, left: list[int], right: np.ndarray) -> None:
    """sum(left) == sum(right): ``y`` indices on the left, the (lower) ``x`` indices on the right."""
    linear = proto.constraints.add().linear
    linear.vars.extend(right.tolist() + left)
    linear.coeffs.extend([-1] * len(right) + [1] * len(left))
    linear.domain.extend((0, 0))


def _add_at_most(proto: Any, terms: list[tuple[int, int]], cap: int) -> None:
    if not terms:
        return
    terms = sorted(terms)
    linear = proto.constraints.add().linear
    linear.vars.extend(v for v, _ in terms)
    linear.coeffs.extend(c for _, c in terms)
    linear.domain.extend((cp_model.INT_MIN, cap))


class _Recorder(cp_model.CpSolverSolutionCallback):
    """The anytime trace: wall time and objective of every improving solution."""

    def __init__(self) -> None:
        super().__init__()
        self.start = time.perf_counter()
        self.points: list[tuple[float, float]] = []

    def on_solution_callback(self) -> None:
        self.points.append((time.perf_counter() - self.start, self.objective_value * _TIME_UNIT_S))


def _units_array(seconds: np.ndarray) -> np.ndarray:
    """Seconds in objective units, rounded half to even as Python's ``round``."""
    return np.rint(np.asarray(seconds, dtype=np.float64) / _TIME_UNIT_S).astype(np.int64)
