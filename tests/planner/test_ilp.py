"""The CP-SAT intra-op ILP against brute force, memory budgets and determinism."""

import itertools

import jax
import jax.numpy as jnp
import pytest

from costmodel.errors import InfeasibleError
from costmodel.machine import load_machine
from costmodel.strategy_space import build_space
from planner.extract import extract_graph
from planner.ilp import solve_intra_op

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
