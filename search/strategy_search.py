"""Search planners over per-op sharding strategies: simulated annealing, beam search, random search.

They solve the same problem as the ILP — one strategy per free node of a costmodel
`StrategySpace`, least node-plus-resharding time, per-device memory within budget — on
the same costs, so comparing them compares algorithms. Each is seeded and deterministic
under an evaluation budget (a wall-time cap may cut it short), and records an anytime
trace: the best feasible time after each improvement, with wall seconds and evaluations.

>>> from costmodel.step.collectives import Group, Tier
>>> from costmodel.hardware.machine import load_machine
>>> from costmodel.oplevel.opgraph import LoopNest, OpNode, TensorSpec, add_input, add_op, new_op_graph
>>> from costmodel.oplevel.strategy_space import build_space
>>> t = lambda *s: TensorSpec(shape=s, dtype="bfloat16")
>>> g = new_op_graph("matmul")
>>> x, w = add_input(g, t(4096, 1024), label="x"), add_input(g, t(1024, 1024), label="w")
>>> nest = LoopNest(sizes=(4096, 1024, 1024), reduced=(False, False, True), operands=((0, 2), (2, 1)), results=((0, 1),))
>>> _ = add_op(g, OpNode(primitive="dot_general", inputs=(t(4096, 1024), t(1024, 1024)), outputs=(t(4096, 1024),),
...                      flops=2 * 4096 * 1024 * 1024, loops=nest), [(x, 0), (w, 0)])
>>> space = build_space(g, {"data": Group(n=4, n_nodes=1, intra=Tier(bytes_per_s=1e11, latency_s=0),
...                                                inter=Tier(bytes_per_s=1e11, latency_s=0))}, load_machine("a100-80gb"))
>>> run = anneal(space, memory_budget_bytes=1e9, max_evaluations=2000, seed=0)
>>> run.feasible, len(run.choice)
(True, 3)
"""

from __future__ import annotations

import math
import random
import time
from typing import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from costmodel.oplevel.strategy_space import StrategySpace


class TracePoint(BaseModel):
    """The best feasible objective known at one moment of a search."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    wall_s: float = Field(description="Seconds since the search started.")
    evaluations: int = Field(description="Candidate evaluations so far.")
    best_s: float = Field(description="Best feasible objective so far.")


class SearchRun(BaseModel):
    """What one search planner found, and how quickly."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    planner: str = Field(description="anneal, beam or random.")
    seed: int = Field(description="Random seed.")
    choice: dict[int, int] = Field(description="Free node → strategy index of the best feasible choice.")
    objective_s: float = Field(description="Its predicted seconds (the ILP's objective).")
    memory_bytes: float = Field(description="Its per-device memory.")
    feasible: bool = Field(description="Whether any choice within the memory budget was found.")
    evaluations: int = Field(description="Candidate evaluations (full choices or single-node moves) made.")
    wall_s: float = Field(description="Seconds the search ran.")
    trace: tuple[TracePoint, ...] = Field(description="Best feasible objective after each improvement.")


class _Problem:
    """Index-based view of a space for fast full and incremental evaluation."""

    def __init__(self, space: StrategySpace, memory_budget_bytes: float):
        self.nodes = space.free_nodes
        index = {n: i for i, n in enumerate(self.nodes)}
        self.cost = [space.node_time_s[n] for n in self.nodes]
        self.memory = [space.node_memory_bytes[n] for n in self.nodes]
        self.budget = memory_budget_bytes
        self.edges = [(index[e.src], index[e.dst], e.src_class, e.dst_class, e.matrix) for e in space.edges]
        self.incident: list[list[int]] = [[] for _ in self.nodes]
        for k, (a, b, *_rest) in enumerate(self.edges):
            self.incident[a].append(k)
            self.incident[b].append(k)
        self.neighbours = [sorted({e[1] if e[0] == i else e[0] for e in (self.edges[k] for k in ks)})
                           for i, ks in enumerate(self.incident)]
        least = space.least_memory_choice()
        self.least_memory = [least[n] for n in self.nodes]

    def total(self, choice: list[int]) -> float:
        nodes = sum(float(c[i]) for c, i in zip(self.cost, choice))
        return nodes + sum(float(m[sc[choice[a]], dc[choice[b]]]) for a, b, sc, dc, m in self.edges)

    def total_memory(self, choice: list[int]) -> float:
        return sum(float(m[i]) for m, i in zip(self.memory, choice))

    def option_costs(self, node: int, choice: list[int], assigned: Callable[[int], bool] = lambda _: True) -> np.ndarray:
        """Cost of every option of ``node`` given the other (assigned) nodes' choices."""
        out = self.cost[node].copy()
        for k in self.incident[node]:
            a, b, sc, dc, m = self.edges[k]
            if a == node and assigned(b):
                out += m[sc, dc[choice[b]]]
            elif b == node and assigned(a):
                out += m[sc[choice[a]], dc]
        return out


class _Tracker:
    def __init__(self, planner: str, seed: int, problem: _Problem, time_limit_s: float):
        self.planner, self.seed, self.problem = planner, seed, problem
        self.start, self.time_limit_s = time.perf_counter(), time_limit_s
        self.evaluations, self.best_s = 0, math.inf
        self.best: list[int] | None = None
        self.trace: list[TracePoint] = []

    def offer(self, choice: list[int], objective_s: float, memory_bytes: float) -> None:
        if memory_bytes <= self.problem.budget and objective_s < self.best_s - 1e-15:
            self.best_s, self.best = objective_s, list(choice)
            self.trace.append(TracePoint(wall_s=self.elapsed(), evaluations=self.evaluations, best_s=objective_s))

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def out_of_time(self) -> bool:
        return self.elapsed() > self.time_limit_s

    def result(self) -> SearchRun:
        p = self.problem
        choice = self.best or p.least_memory
        return SearchRun(planner=self.planner, seed=self.seed, choice=dict(zip(p.nodes, choice)), objective_s=p.total(choice),
                         memory_bytes=p.total_memory(choice), feasible=self.best is not None, evaluations=self.evaluations,
                         wall_s=self.elapsed(), trace=tuple(self.trace))


def anneal(space: StrategySpace, *, memory_budget_bytes: float, max_evaluations: float = 200_000, time_limit_s: float = math.inf,
           seed: int = 0) -> SearchRun:
    """Simulated annealing (FlexFlow-style MCMC) over per-op strategies.

    A move changes one node's strategy and lets its neighbours follow (`_compound_move`).
    Starts from the least-memory choice, accepts a move by the Metropolis rule, rejects moves
    over the memory budget, cools geometrically with progress through the evaluation budget
    (or through the time limit, when that is the tighter: then runs are not repeatable),
    and ends with a descent to a local optimum (its evaluations come on top of ``max_evaluations``).
    """
    space.check_fits(memory_budget_bytes)
    p = _Problem(space, memory_budget_bytes)
    rng = random.Random(seed)
    track = _Tracker("anneal", seed, p, time_limit_s)
    choice = list(p.least_memory)
    current, memory = p.total(choice), p.total_memory(choice)
    track.offer(choice, current, memory)
    movable = [i for i, c in enumerate(p.cost) if len(c) > 1]
    if not movable:
        return track.result()
    start_temperature = _start_temperature(p, choice, movable, rng)
    end_temperature = start_temperature * 1e-4
    while track.evaluations < max_evaluations and not track.out_of_time():
        progress = max(track.evaluations / max_evaluations, track.elapsed() / track.time_limit_s)
        temperature = start_temperature * (end_temperature / start_temperature) ** progress
        node = rng.choice(movable)
        option = rng.randrange(len(p.cost[node]) - 1)
        option += option >= choice[node]
        delta, memory_delta, undo = _compound_move(p, track, choice, memory, node, option)
        if undo is None:
            continue
        if delta <= 0 or rng.random() < math.exp(-delta / temperature):
            current, memory = current + delta, memory + memory_delta
            track.offer(choice, current, memory)
        else:
            for other, previous in reversed(undo):
                choice[other] = previous
    if track.best is not None:
        _descend(p, track, track.best)
    return track.result()


def _compound_move(p: _Problem, track: _Tracker, choice: list[int], memory: float, node: int,
                   option: int) -> tuple[float, float, list[tuple[int, int]] | None]:
    """Set ``node`` to ``option``, then give each neighbour its best option given the rest.

    Changing one op's sharding alone usually just moves a resharding onto its edges; letting
    the neighbours follow makes the coordinated change one move. Applied to ``choice`` in
    place; returns (time delta, memory delta, undo list), or no undo list when over budget.
    """
    memory_delta = float(p.memory[node][option] - p.memory[node][choice[node]])
    if memory + memory_delta > p.budget:
        track.evaluations += 1
        return 0.0, 0.0, None
    costs = p.option_costs(node, choice)
    track.evaluations += 1
    delta = float(costs[option] - costs[choice[node]])
    undo = [(node, choice[node])]
    choice[node] = option
    for other in p.neighbours[node]:
        costs = p.option_costs(other, choice)
        track.evaluations += 1
        spare = p.budget - (memory + memory_delta) + p.memory[other][choice[other]]
        best = int(np.argmin(np.where(p.memory[other] <= spare, costs, np.inf)))
        if costs[best] < costs[choice[other]]:
            delta += float(costs[best] - costs[choice[other]])
            memory_delta += float(p.memory[other][best] - p.memory[other][choice[other]])
            undo.append((other, choice[other]))
            choice[other] = best
    return delta, memory_delta, undo


def _start_temperature(p: _Problem, choice: list[int], movable: list[int], rng: random.Random, samples: int = 200) -> float:
    """A temperature at which half of the mild uphill moves from ``choice`` (the cheapest tenth) are accepted.

    Calibrating on the median move instead makes the walk random: most single-node changes
    reshard big tensors and cost orders of magnitude more than the useful ones.
    """
    uphill = []
    for _ in range(samples):
        node = rng.choice(movable)
        costs = p.option_costs(node, choice)
        delta = float(costs[rng.randrange(len(costs))] - costs[choice[node]])
        if delta > 0:
            uphill.append(delta)
    return (float(np.percentile(uphill, 10)) if uphill else 1e-9) / math.log(2)


def _descend(p: _Problem, track: _Tracker, choice: list[int], fixed: frozenset[int] = frozenset()) -> None:
    """Polish: give each node (but the ``fixed``) its best option given the others, until none improves."""
    choice = list(choice)
    memory = p.total_memory(choice)
    if memory > p.budget:
        return
    track.offer(choice, p.total(choice), memory)
    improved = True
    while improved and not track.out_of_time():
        improved = False
        for node in range(len(p.nodes)):
            if node in fixed:
                continue
            costs = p.option_costs(node, choice)
            track.evaluations += len(costs)
            fits = memory - p.memory[node][choice[node]] + p.memory[node] <= p.budget
            best = int(np.argmin(np.where(fits, costs, np.inf)))
            if costs[best] < costs[choice[node]] - 1e-15:
                memory += p.memory[node][best] - p.memory[node][choice[node]]
                choice[node] = best
                improved = True
        track.offer(choice, p.total(choice), memory)


def descend(space: StrategySpace, *, start: dict[int, int], memory_budget_bytes: float, fixed: frozenset[int] = frozenset(),
            time_limit_s: float = math.inf) -> SearchRun:
    """Local search from ``start`` (free node → strategy index): each node not in ``fixed``
    takes its best option given the others until none improves. Not feasible when ``start``
    is over the memory budget."""
    p = _Problem(space, memory_budget_bytes)
    track = _Tracker("descent", 0, p, time_limit_s)
    index = {n: i for i, n in enumerate(p.nodes)}
    choice = [start.get(n, least) for n, least in zip(p.nodes, p.least_memory)]
    _descend(p, track, choice, frozenset(index[n] for n in fixed))
    return track.result()


def beam_search(space: StrategySpace, *, memory_budget_bytes: float, width: int = 16, max_evaluations: float = 4_000_000,
                time_limit_s: float = math.inf, seed: int = 0) -> SearchRun:
    """Assign nodes in program order, keeping the ``width`` cheapest partial choices.

    A partial choice pays its nodes and the edges among them; it is dropped when its memory
    plus the least memory of the nodes still to assign exceeds the budget. ``seed`` only
    breaks ties. The search widens while its evaluation budget allows: it runs again with a
    beam four times wider whenever the last pass dropped partial choices and the wider pass
    (about four times the last one's evaluations) fits in what remains, so a run is repeatable
    however busy the machine (about 10 s on a 2-core VM at the default budget). With an
    unbounded budget (``math.inf``: a race against other planners' wall clock) the wider pass
    must fit in the time left instead. ``time_limit_s`` stops any pass that overruns it, the
    best complete choice so far kept. The best complete choice is polished by descent to a
    local optimum.
    """
    space.check_fits(memory_budget_bytes)
    p = _Problem(space, memory_budget_bytes)
    track = _Tracker("beam", seed, p, time_limit_s)
    rng = np.random.default_rng(seed)
    while True:
        pass_start_s, pass_start_evaluations = track.elapsed(), track.evaluations
        pruned = _beam_pass(p, track, rng, width)
        if pruned is None:
            return track.result()
        width *= 4
        if math.isfinite(max_evaluations):
            fits = track.evaluations + 4 * (track.evaluations - pass_start_evaluations) <= max_evaluations
        else:
            fits = math.isfinite(time_limit_s) and track.elapsed() + 4 * (track.elapsed() - pass_start_s) <= time_limit_s
        if not pruned or not fits:
            break
    if track.best is not None:
        _descend(p, track, track.best)
    return track.result()


def _beam_pass(p: _Problem, track: _Tracker, rng: np.random.Generator, width: int) -> bool | None:
    """One beam of ``width`` through every node, its complete choices offered: whether it dropped any partial
    choice (a wider beam could do better), or None if time ran out first."""
    least_rest = np.cumsum([float(m.min()) for m in p.memory][::-1])[::-1].tolist() + [0.0]
    beam: list[tuple[float, float, list[int]]] = [(0.0, 0.0, [0] * len(p.nodes))]
    pruned = False
    for node in range(len(p.nodes)):
        candidates = []
        for cost, memory, choice in beam:
            costs = p.option_costs(node, choice, assigned=lambda other: other < node)
            track.evaluations += len(costs)
            for option in np.flatnonzero(memory + p.memory[node] + least_rest[node + 1] <= p.budget):
                candidates.append((cost + float(costs[option]), memory + float(p.memory[node][option]), choice, int(option)))
        if not candidates or track.out_of_time():
            return None
        pruned = pruned or len(candidates) > width
        jitter = rng.random(len(candidates))
        order = sorted(range(len(candidates)), key=lambda i: (candidates[i][0], jitter[i]))[:width]
        beam = []
        for i in order:
            cost, memory, choice, option = candidates[i]
            beam.append((cost, memory, choice[:node] + [option] + choice[node + 1:]))
    for cost, memory, choice in beam:
        track.offer(choice, cost, memory)
    return pruned


def random_search(space: StrategySpace, *, memory_budget_bytes: float, max_evaluations: float = 20_000,
                  time_limit_s: float = math.inf, seed: int = 0) -> SearchRun:
    """The baseline: uniformly random full choices, the best feasible one kept."""
    space.check_fits(memory_budget_bytes)
    p = _Problem(space, memory_budget_bytes)
    rng = random.Random(seed)
    track = _Tracker("random", seed, p, time_limit_s)
    while track.evaluations < max_evaluations and not track.out_of_time():
        choice = [rng.randrange(len(c)) for c in p.cost]
        track.evaluations += 1
        track.offer(choice, p.total(choice), p.total_memory(choice))
    return track.result()


SEARCH_PLANNERS = {"anneal": anneal, "beam": beam_search, "random": random_search}
