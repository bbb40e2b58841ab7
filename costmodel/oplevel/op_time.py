"""Where an op-level choice's predicted time goes, in the simulator's terms.

`StrategySpace.total_time_s` is one sum; `op_time_breakdown` splits it as the simulator's
`TimeBreakdown` splits a step: matmul kernels, memory-bound kernels, and the collectives
they wait on, those an op issues itself (partial sums) apart from the resharding between
ops. Each part is what it adds to the step, hidden collectives' remainders included.

>>> from costmodel.step.collectives import Group, Tier
>>> from costmodel.hardware.machine import load_machine
>>> from costmodel.oplevel.opgraph import LoopNest, OpNode, TensorSpec, add_input, add_op, new_op_graph
>>> from costmodel.oplevel.strategy_space import build_space
>>> t = lambda *s: TensorSpec(shape=s, dtype="bfloat16")
>>> g = new_op_graph("mlp")
>>> x, w = add_input(g, t(4096, 1024), label="x"), add_input(g, t(1024, 1024), label="w")
>>> nest = LoopNest(sizes=(4096, 1024, 1024), reduced=(False, False, True), operands=((0, 2), (2, 1)), results=((0, 1),))
>>> y = add_op(g, OpNode(primitive="dot_general", inputs=(t(4096, 1024), t(1024, 1024)), outputs=(t(4096, 1024),),
...                      flops=2 * 4096 * 1024 * 1024, loops=nest), [(x, 0), (w, 0)])
>>> tier = Tier(bytes_per_s=1e11, latency_s=1e-6)
>>> space = build_space(g, {"data": Group(n=4, n_nodes=1, intra=tier, inter=tier)}, load_machine("a100-80gb"))
>>> parts = op_time_breakdown(g, space, {n: 0 for n in space.strategies})  # all replicated
>>> parts.matmul_s > 0, parts.collective_s, abs(parts.total_s - space.total_time_s({x: 0, w: 0, y: 0})) < 1e-12
(True, 0.0, True)
"""

from __future__ import annotations

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field

from costmodel.oplevel.opgraph import OP_ATTR
from costmodel.oplevel.strategy_space import StrategySpace


class OpTimeBreakdown(BaseModel):
    """Seconds an op-level choice adds to one call, by kind; they sum to its objective."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    matmul_s: float = Field(description="dot_general kernels.")
    memory_s: float = Field(description="Memory-bound kernels: the fusions of elementwise ops, reductions, gathers.")
    collective_s: float = Field(description="Collectives completing ops' partial sums (all-reduce, reduce-scatter).")
    reshard_s: float = Field(description="Collectives between ops: all-gathers and all-to-alls changing a tensor's sharding.")

    @property
    def total_s(self) -> float:
        return self.matmul_s + self.memory_s + self.collective_s + self.reshard_s


def op_time_breakdown(g: nx.DiGraph, space: StrategySpace, choice: dict[int, int]) -> OpTimeBreakdown:
    """Split ``space.total_time_s(choice)`` for ``space`` built on ``g``."""
    matmul_s = memory_s = collective_s = 0.0
    for n, data in g.nodes(data=True):
        if n not in space.strategies and n not in space.followers:
            continue
        strategy = space.chosen(n, choice)
        if data[OP_ATTR].primitive == "dot_general":
            matmul_s += strategy.compute_s
        else:
            memory_s += strategy.compute_s
        collective_s += strategy.communication_s
    reshard_s = space.total_time_s(choice) - matmul_s - memory_s - collective_s
    return OpTimeBreakdown(matmul_s=matmul_s, memory_s=memory_s, collective_s=collective_s, reshard_s=reshard_s)
