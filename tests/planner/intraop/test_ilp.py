"""The CP-SAT intra-op ILP against brute force, memory budgets and determinism."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from costmodel.errors import InfeasibleError
from costmodel.hardware.machine import load_machine
from costmodel.oplevel.strategy_space import build_space
from planner.intraop.extract import extract_graph
from planner.intraop.ilp import _build_model, solve_intra_op

MACHINE = load_machine("a100-80gb")


def mlp_space(mesh, m=2048, d=1024, f=4096):
    args = (jax.ShapeDtypeStruct((m, d), jnp.bfloat16), jax.ShapeDtypeStruct((d, f), jnp.bfloat16),
            jax.ShapeDtypeStruct((f, d), jnp.bfloat16))
    g = extract_graph(lambda x, w1, w2: jnp.tanh(x @ w1) @ w2, *args)
    return build_space(g, MACHINE.mesh_groups(mesh), MACHINE)


def brute_force(space, budget):
    nodes = space.free_nodes
    choices = (dict(zip(nodes, c)) for c in itertools.product(*(range(len(space.strategies[v])) for v in nodes)))
    return min(space.total_time_s(c) for c in choices if space.memory_bytes(c) <= budget)


@pytest.mark.parametrize("budget", [1e10, 12e6])
def test_ilp_matches_brute_force(budget):
    space = mlp_space([("tensor", 4)])
    solution = solve_intra_op(space, memory_budget_bytes=budget)
    assert solution.status == "OPTIMAL"
    assert solution.memory_bytes <= budget
    assert solution.objective_s == pytest.approx(brute_force(space, budget), rel=1e-6)
    assert solution.gap == 0


def test_tight_memory_costs_time():
    space = mlp_space([("tensor", 4)])
    ample = solve_intra_op(space, memory_budget_bytes=1e10)
    tight = solve_intra_op(space, memory_budget_bytes=6e6)
    assert tight.memory_bytes <= 6e6 < ample.memory_bytes
    assert tight.objective_s >= ample.objective_s


def test_same_input_same_choice():
    space = mlp_space([("data", 2), ("tensor", 4)])
    assert solve_intra_op(space, memory_budget_bytes=1e10).choice == solve_intra_op(space, memory_budget_bytes=1e10).choice


def test_budget_below_the_least_memory_is_a_clear_error():
    with pytest.raises(InfeasibleError, match=r"least-memory sharding needs .* MiB per device"):
        solve_intra_op(mlp_space([("tensor", 4)]), memory_budget_bytes=1e5)


def test_time_limit_before_any_solution_returns_the_least_memory_choice_with_its_gap():
    space = mlp_space([("data", 2), ("tensor", 4)])
    solution = solve_intra_op(space, memory_budget_bytes=12e6, time_limit_s=1e-6)
    assert solution.status == "FEASIBLE" and 0 < solution.gap <= 1
    assert solution.fallback == "least_memory" and solution.choice == space.least_memory_choice()
    assert solution.memory_bytes <= 12e6
    assert solution.bound_s <= solution.objective_s


def test_time_limit_before_any_solution_returns_a_fitting_fallback_choice():
    space = mlp_space([("data", 2), ("tensor", 4)])
    optimum = solve_intra_op(space, memory_budget_bytes=1e10)
    solution = solve_intra_op(space, memory_budget_bytes=1e10, time_limit_s=1e-6, fallback_choice=optimum.choice)
    assert (solution.fallback, solution.choice) == ("given", optimum.choice)
    # A choice over the budget is no answer: the least-memory choice is.
    tight = solve_intra_op(space, memory_budget_bytes=optimum.memory_bytes - 1, time_limit_s=1e-6,
                           fallback_choice=optimum.choice)
    assert tight.fallback == "least_memory"


def test_a_fallback_choice_changes_nothing_when_the_solver_answers():
    space = mlp_space([("data", 2), ("tensor", 4)])
    plain = solve_intra_op(space, memory_budget_bytes=1e10)
    given = solve_intra_op(space, memory_budget_bytes=1e10, fallback_choice=space.least_memory_choice())
    assert given.status == plain.status == "OPTIMAL" and not given.fallback
    assert given.choice == plain.choice


def test_no_time_means_no_search_and_the_fitting_fallback_choice():
    space = mlp_space([("data", 2), ("tensor", 4)])
    optimum = solve_intra_op(space, memory_budget_bytes=1e10)
    unsolved = solve_intra_op(space, memory_budget_bytes=1e10, time_limit_s=0, fallback_choice=optimum.choice)
    assert (unsolved.fallback, unsolved.choice, unsolved.solve_time_s) == ("given", optimum.choice, 0.0)
    assert unsolved.variables == optimum.variables and unsolved.status == "FEASIBLE"


def _expression_api_model(space, budget, rows):
    """The model as OR-Tools' expression API writes it (how planner.intraop.ilp used to build it)."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    x = {n: [model.new_bool_var(f"x{n}_{i}") for i in range(len(s))] for n, s in space.strategies.items()}
    objective = []
    for n, xs in x.items():
        model.add_exactly_one(xs)
        objective += [(v, round(float(t) / 1e-8)) for v, t in zip(xs, space.node_time_s[n])]
    for e_index, edge in enumerate(space.edges):
        n_src, n_dst = edge.matrix.shape
        y = [[model.new_bool_var(f"y{e_index}_{p}_{c}") for c in range(n_dst)] for p in range(n_src)]
        for p in range(n_src):
            model.add(sum(y[p]) == sum(x[edge.src][i] for i in np.flatnonzero(edge.src_class == p)))
        for c in range(n_dst):
            model.add(sum(y[p][c] for p in range(n_src)) == sum(x[edge.dst][j] for j in np.flatnonzero(edge.dst_class == c)))
        objective += [(y[p][c], round(float(edge.matrix[p, c]) / 1e-8)) for p in range(n_src) for c in range(n_dst)
                      if edge.matrix[p, c] > 0]
    for row in [{n: space.node_memory_bytes[n] for n in x}, *rows]:
        model.add(sum(math.ceil(b / 1024) * v for n, bs in row.items() for v, b in zip(x[n], bs) if b > 0) <= int(budget // 1024))
    model.minimize(sum(c * v for v, c in objective if c))
    return model


def test_the_proto_builder_writes_the_model_the_expression_api_writes():
    space = mlp_space([("data", 2), ("tensor", 4)])
    rows = [{n: space.node_memory_bytes[n] + 4096 for n in reversed(list(space.strategies))}]
    built, _ = _build_model(space, memory_budget_bytes=1e9, memory_rows=rows)
    assert str(built.proto) == str(_expression_api_model(space, 1e9, rows).proto)
