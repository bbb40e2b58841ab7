"""Search planners on small strategy spaces whose optimum brute force knows."""

import itertools
import math

import pytest

from costmodel.errors import InfeasibleError
from costmodel.hardware.machine import load_machine
from costmodel.oplevel.opgraph import LoopNest, OpNode, TensorSpec, add_input, add_op, new_op_graph
from costmodel.oplevel.strategy_space import build_space
from costmodel.step.collectives import Group, Tier
from search.strategy_search import SEARCH_PLANNERS, anneal, beam_search, random_search

MACHINE = load_machine("a100-80gb")
TIER = Tier(bytes_per_s=1e11, latency_s=1e-6)


def t(*shape):
    return TensorSpec(shape=shape, dtype="bfloat16")


def mlp_space(m=2048, d=1024, f=4096):
    """x @ w1 → tanh → @ w2 on a 4-way axis."""
    g = new_op_graph("mlp")
    x, w1, w2 = (add_input(g, t(*s), label=n) for n, s in (("x", (m, d)), ("w1", (d, f)), ("w2", (f, d))))

    def dot(a, b, rows, inner, cols):
        nest = LoopNest(sizes=(rows, cols, inner), reduced=(False, False, True), operands=((0, 2), (2, 1)), results=((0, 1),))
        return add_op(g, OpNode(primitive="dot_general", inputs=(t(rows, inner), t(inner, cols)), outputs=(t(rows, cols),),
                                flops=2 * rows * inner * cols, loops=nest), [(a, 0), (b, 0)])

    h = dot(x, w1, m, d, f)
    a = add_op(g, OpNode(primitive="tanh", inputs=(t(m, f),), outputs=(t(m, f),), flops=m * f,
                         loops=LoopNest(sizes=(m, f), reduced=(False, False), operands=((0, 1),), results=((0, 1),))), [(h, 0)])
    dot(a, w2, m, f, d)
    return build_space(g, {"tensor": Group(n=4, n_nodes=1, intra=TIER, inter=TIER)}, MACHINE)


def brute_force(space, budget):
    nodes = space.free_nodes
    choices = (dict(zip(nodes, c)) for c in itertools.product(*(range(len(space.strategies[v])) for v in nodes)))
    return min(space.total_time_s(c) for c in choices if space.memory_bytes(c) <= budget)


RUNS = {
    "anneal": lambda space, budget, seed: anneal(space, memory_budget_bytes=budget, max_evaluations=20_000, seed=seed),
    "beam": lambda space, budget, seed: beam_search(space, memory_budget_bytes=budget, width=8, seed=seed),
    "random": lambda space, budget, seed: random_search(space, memory_budget_bytes=budget, max_evaluations=20_000, seed=seed),
}


@pytest.mark.parametrize("planner", sorted(SEARCH_PLANNERS))
@pytest.mark.parametrize("budget", [1e10, 12e6])
def test_each_planner_finds_the_brute_force_optimum(planner, budget):
    space = mlp_space()
    run = RUNS[planner](space, budget, 0)
    assert run.feasible and run.memory_bytes <= budget
    assert run.objective_s == pytest.approx(brute_force(space, budget), rel=1e-9)
    assert run.objective_s == pytest.approx(space.total_time_s(run.choice))


@pytest.mark.parametrize("planner", sorted(SEARCH_PLANNERS))
def test_same_seed_same_result(planner):
    space = mlp_space()
    first, second = RUNS[planner](space, 12e6, 3), RUNS[planner](space, 12e6, 3)
    assert first.choice == second.choice and first.evaluations == second.evaluations


def test_trace_improves_monotonically():
    run = anneal(mlp_space(), memory_budget_bytes=1e10, max_evaluations=5000, seed=1)
    best = [p.best_s for p in run.trace]
    assert best == sorted(best, reverse=True) and best[-1] == pytest.approx(run.objective_s)
    assert all(a.evaluations <= b.evaluations for a, b in zip(run.trace, run.trace[1:]))


def test_time_limit_stops_a_search():
    run = random_search(mlp_space(), memory_budget_bytes=1e10, max_evaluations=10**9, time_limit_s=0.2)
    assert run.wall_s < 2 and run.evaluations < 10**9 and math.isfinite(run.objective_s)


def test_nothing_fits_is_a_clear_error():
    with pytest.raises(InfeasibleError, match="least-memory sharding"):
        anneal(mlp_space(), memory_budget_bytes=1e3)


def test_descent_keeps_fixed_nodes_and_reaches_a_local_optimum():
    from search.strategy_search import descend

    space = mlp_space()
    first = space.free_nodes[0]
    last_option = len(space.strategies[first]) - 1
    run = descend(space, start={first: last_option}, fixed=frozenset({first}), memory_budget_bytes=1e10)
    assert run.feasible and run.choice[first] == last_option
    for node in space.free_nodes[1:]:  # no single free node can improve
        for option in range(len(space.strategies[node])):
            assert space.total_time_s({**run.choice, node: option}) >= run.objective_s - 1e-15


def test_beam_widens_within_its_budget_and_stops_once_nothing_is_dropped():
    space = mlp_space()
    one_pass = beam_search(space, memory_budget_bytes=12e6, width=1, max_evaluations=1)  # no room for a wider pass
    widened = beam_search(space, memory_budget_bytes=12e6, width=1)
    assert widened.evaluations > one_pass.evaluations and widened.objective_s <= one_pass.objective_s
    assert widened.objective_s == pytest.approx(brute_force(space, 12e6), rel=1e-9)
    assert widened.evaluations < 4_000_000  # it stops when a pass keeps every partial choice, not when the budget runs out


def test_beam_widening_follows_evaluations_not_the_clock(monkeypatch):
    import search.strategy_search as strategy_search

    space = mlp_space()
    idle = beam_search(space, memory_budget_bytes=12e6, width=1, time_limit_s=60.0)
    readings = []  # a busy machine: every reading of the clock a second after the last
    monkeypatch.setattr(strategy_search.time, "perf_counter", lambda: float(len(readings.append(0) or readings)))
    beam_search(space, memory_budget_bytes=12e6, width=1)
    limit_s = len(readings) + 10.0  # the whole search fits, but not a pass four times the last one's seconds
    busy = beam_search(space, memory_budget_bytes=12e6, width=1, time_limit_s=limit_s)
    assert busy.choice == idle.choice and busy.evaluations == idle.evaluations
    raced = beam_search(space, memory_budget_bytes=12e6, width=1, time_limit_s=limit_s, max_evaluations=math.inf)
    assert raced.evaluations < idle.evaluations  # on the clock (planner comparisons) it widens less
