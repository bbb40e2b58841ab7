"""Per-device memory of a sharded program as the compiled program holds it: a peak over program order.

``memory_analysis()`` of a compiled step reports arguments + outputs + temporaries − aliased
bytes, where the temporaries are the largest set of intermediate buffers live at once. This
module predicts the same three parts from an OpGraph and a choice of strategies:

* arguments: every graph input at its chosen sharding (always live);
* outputs: every program output at its sharding (live from production to the end); an output
  with the shape, dtype and sharding of a donated argument reuses its buffer (aliased);
* temporaries: the peak over program points of the live intermediate values. A value is live
  from its producer to its last reader (graph nodes are in program order). XLA fuses an
  elementwise producer into its single elementwise reader, so such a value is never a buffer,
  nor is one no output depends on (dead code XLA removes).
  A remat region's recomputed forward ops outside a loop are placed as early as their
  operands allow (`scheduled_positions`): nothing but their saved inputs orders them, and
  XLA's scheduler runs them early. Measured here: a Flax decoder of 16 ``nn.remat`` blocks
  compiled for 8 CPU devices held all 16 blocks' recomputed attention probabilities at once
  (31 GiB of temporaries per device where the backward needs one block's, 2 GiB). In a
  loop (a scanned layer stack) the body orders them, and they stay where they are.

Every value's bytes are linear in its owner's strategy (the free node it follows), so the
live set at a program point is one linear row over the ILP's choice variables
(`MemoryModel.row`): the ILP adds the rows of the points that bind (planner/intraop/shard.py).

>>> import jax, jax.numpy as jnp
>>> from planner.intraop.extract import extract_graph
>>> x = jax.ShapeDtypeStruct((1024, 1024), jnp.float32)
>>> g = extract_graph(lambda x: jnp.sum(jnp.tanh(x @ x) @ x), x)
>>> model = MemoryModel.of_graph(g)
>>> [round(b / 2**20) for b in model.replicated().parts()]  # arguments, peak temporaries, outputs (MiB)
[4, 8, 0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import networkx as nx
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from costmodel.oplevel.opgraph import OP_ATTR, USES_ATTR, OpNode, TensorSpec
from costmodel.oplevel.strategies import Sharding, shard_factor
from costmodel.oplevel.strategy_space import StrategySpace

# Ops XLA fuses into one loop kernel with their elementwise producers.
_FUSIBLE = frozenset({
    "abs", "add", "and", "broadcast_in_dim", "ceil", "clamp", "convert_element_type", "cos", "div", "eq", "erf", "exp",
    "exp2", "expm1", "floor", "ge", "gt", "integer_pow", "is_finite", "le", "log", "log1p", "logistic", "lt", "max",
    "min", "mul", "ne", "neg", "not", "or", "pow", "reduce_max", "reduce_min", "reduce_sum", "reshape", "rsqrt",
    "select_n", "sign", "sin", "sqrt", "square", "squeeze", "stop_gradient", "sub", "tanh", "copy", "copy_p",
    "expand_dims", "xor", "erf_inv", "reduce_precision",
})
_PRODUCES_IN_FUSION = _FUSIBLE - {"reduce_max", "reduce_min", "reduce_sum"}


class MemoryBreakdown(BaseModel):
    """Predicted bytes per device of one sharded program, in ``memory_analysis()``'s terms."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    arguments_bytes: float = Field(description="Inputs at their shardings, per device.")
    peak_temporaries_bytes: float = Field(description="Intermediate values live at the worst program point, per device.")
    outputs_bytes: float = Field(description="Outputs at their shardings, per device.")
    aliased_bytes: float = Field(0.0, description="Output bytes that reuse a donated argument's buffer.")
    peak_node: int = Field(-1, description="Graph node at which the temporaries peak.")

    @property
    def total_bytes(self) -> float:
        """Arguments + outputs + temporaries − aliased: what ``memory_analysis()`` sums to."""
        return self.arguments_bytes + self.outputs_bytes + self.peak_temporaries_bytes - self.aliased_bytes

    def parts(self) -> tuple[float, float, float]:
        return self.arguments_bytes, self.peak_temporaries_bytes, self.outputs_bytes


@dataclass(frozen=True)
class _Value:
    node: int
    index: int
    tensor: TensorSpec
    scale: float  # stacked copies: a scan's stacked result holds one slice per trip
    start: int
    end: int


@dataclass(frozen=True)
class MemoryModel:
    """The buffers of a graph and when each is live; costed under any sharding of its values."""

    inputs: tuple[tuple[int, TensorSpec], ...]
    outputs: tuple[tuple[int, int, TensorSpec], ...]
    temporaries: tuple[_Value, ...]
    n_points: int

    @classmethod
    def of_graph(cls, g: nx.DiGraph) -> MemoryModel:
        ops: dict[int, OpNode] = {n: d[OP_ATTR] for n, d in g.nodes(data=True)}
        outputs = [o for o in g.graph.get("outputs", []) if o is not None]
        output_set = {(n, k) for n, k in outputs}
        readers: dict[tuple[int, int], list[int]] = {}
        for src, dst, data in g.edges(data=True):
            for out_index, _ in data[USES_ATTR]:
                readers.setdefault((src, out_index), []).append(dst)
        alive = _reaching(g, {n for n, _ in outputs})
        temporaries = []
        placed = scheduled_positions(g)
        stacked = g.graph.get("stacked")
        for n, op in ops.items():
            for k, tensor in enumerate(op.outputs):
                # A scan's stack of a value is a buffer of its own, also of a loop-carried input's (its trips' copies).
                in_stack = stacked is not None and (n, k) in stacked
                if (n, k) in output_set or (op.is_input and not in_stack):
                    continue
                users = readers.get((n, k), [])
                # Dead code (no output depends on it) XLA removes; a value fused into its reader is never a buffer.
                if not in_stack and (not users or n not in alive or _fused(op, [ops[u] for u in users])):
                    continue
                if stacked is not None:
                    scale = float(stacked.get((n, k), 1))
                else:  # a graph built by hand: a loop body's value read by fewer trips is stacked
                    scale = max([op.repeat / ops[u].repeat for u in users if ops[u].repeat < op.repeat], default=1.0)
                temporaries.append(_Value(node=n, index=k, tensor=tensor, scale=scale, start=placed[n],
                                          end=max((placed[u] for u in users), default=placed[n])))
        return cls(inputs=tuple((n, op.outputs[0]) for n, op in ops.items() if op.is_input),
                   outputs=tuple((n, k, ops[n].outputs[k]) for n, k in outputs),
                   temporaries=tuple(temporaries), n_points=g.number_of_nodes())

    def breakdown(self, sharding_of: Callable[[int, int], Sharding], sizes: dict[str, int],
                  donated: frozenset[int] = frozenset(), backend: str = "gpu") -> MemoryBreakdown:
        """The three parts when value (node, output index) is sharded as ``sharding_of(node, index)``.

        ``donated``: input nodes whose buffers outputs may reuse (``donate_argnums``).
        ``backend``: "cpu" holds bf16 temporaries as f32 (XLA's CPU backend computes bf16 in f32).
        """
        def nbytes(n: int, k: int, t: TensorSpec, temporary: bool = False) -> float:
            return temporary_bytes(t, backend) / _pieces(sharding_of(n, k), sizes, t) if temporary else \
                t.nbytes / _pieces(sharding_of(n, k), sizes, t)

        arguments = sum(nbytes(n, 0, t) for n, t in self.inputs)
        outputs = [(nbytes(n, k, t), (t.shape, t.dtype, sharding_of(n, k))) for n, k, t in self.outputs]
        delta = np.zeros(self.n_points + 1)
        for v in self.temporaries:
            b = v.scale * nbytes(v.node, v.index, v.tensor, temporary=True)
            delta[v.start] += b
            delta[v.end + 1] -= b
        live = np.cumsum(delta)[:-1] if self.n_points else np.zeros(1)
        free = {}
        for n, t in self.inputs:
            if n in donated:
                key = (t.shape, t.dtype, sharding_of(n, 0))
                free.setdefault(key, []).append(nbytes(n, 0, t))
        aliased = 0.0
        for b, key in outputs:
            if free.get(key):
                aliased += free[key].pop()
        return MemoryBreakdown(arguments_bytes=arguments, peak_temporaries_bytes=float(live.max(initial=0.0)),
                               outputs_bytes=sum(b for b, _ in outputs), aliased_bytes=aliased,
                               peak_node=int(live.argmax()) if len(live) else -1)

    @property
    def input_nodes(self) -> frozenset[int]:
        return frozenset(n for n, _ in self.inputs)

    def of_choice(self, space: StrategySpace, choice: dict[int, int], *, donated: frozenset[int] = frozenset(),
                  backend: str = "gpu") -> MemoryBreakdown:
        """The breakdown when every value takes the sharding ``choice`` gives its node in ``space``."""
        return self.breakdown(lambda n, k: space.chosen(n, choice).results[k], _sizes(space), donated=donated, backend=backend)

    def row(self, space: StrategySpace, point: int | None, *, backend: str = "gpu", temporaries: bool = True,
            fixed: bool = True) -> dict[int, np.ndarray]:
        """Free node → bytes per device of each of its strategies, summed over the values that count:
        the arguments and outputs (``fixed``) and the temporaries live at graph node ``point``
        (every temporary when ``point`` is None; none when not ``temporaries``)."""
        sizes = _sizes(space)
        row = {n: np.zeros(len(ss)) for n, ss in space.strategies.items()}

        def add(n: int, k: int, nbytes: float, t: TensorSpec) -> None:
            root, strategies = (n, space.strategies[n]) if n in space.strategies else space.followers[n]
            row[root] += np.array([nbytes / _pieces(s.results[k], sizes, t) for s in strategies])

        if fixed:
            for n, t in self.inputs:
                add(n, 0, t.nbytes, t)
            for n, k, t in self.outputs:
                add(n, k, t.nbytes, t)
        if temporaries:
            for v in self.temporaries if point is None else self.live_at(point):
                add(v.node, v.index, v.scale * temporary_bytes(v.tensor, backend), v.tensor)
        return row

    def replicated(self, backend: str = "gpu") -> MemoryBreakdown:
        """Every value whole on every device."""
        return self.breakdown(lambda n, k: (), {}, backend=backend)

    def live_at(self, point: int) -> list[_Value]:
        """Temporaries live at graph node ``point``."""
        return [v for v in self.temporaries if v.start <= point <= v.end]


def scheduled_positions(g: nx.DiGraph) -> dict[int, int]:
    """Graph node → the program point where it runs: its own, or for a recomputed op of a remat
    region outside any loop (scope ``…rematted_computation…``, one execution), the latest
    point among its operands', as early as a scheduler may run it.

    >>> import jax, jax.numpy as jnp
    >>> from planner.intraop.extract import extract_graph
    >>> f = lambda x: jnp.sum(jax.checkpoint(lambda x: jnp.sin(jnp.sin(x)))(x) * x)
    >>> g = extract_graph(jax.grad(f), jax.ShapeDtypeStruct((8,), jnp.float32))
    >>> placed = scheduled_positions(g)
    >>> sum(placed[n] < n for n in g)  # the recomputed sine and both cosines move up to the input
    3
    """
    placed: dict[int, int] = {}
    for n in sorted(g):
        op: OpNode = g.nodes[n][OP_ATTR]
        if "rematted_computation" in op.scope and op.repeat == 1:
            placed[n] = max((placed[p] for p in g.predecessors(n)), default=0)
        else:
            placed[n] = n
    return placed


def _reaching(g: nx.DiGraph, sinks: set[int]) -> set[int]:
    """The nodes some output depends on: the rest is dead code XLA removes."""
    alive, stack = set(sinks), list(sinks)
    while stack:
        for p in g.predecessors(stack.pop()):
            if p not in alive:
                alive.add(p)
                stack.append(p)
    return alive


def _sizes(space: StrategySpace) -> dict[str, int]:
    return {name: g.n for name, g in space.groups.items()}


def _pieces(sharding: Sharding, sizes: dict[str, int], tensor: TensorSpec) -> int:
    # A sharding of a different rank (a stacked tensor's slice) splits the trailing dimensions.
    return shard_factor(sharding, sizes) if sharding and len(sharding) <= max(len(tensor.shape), 1) else 1


def _fused(op: OpNode, users: list[OpNode]) -> bool:
    """Whether XLA keeps this value inside a fused kernel (never a buffer of its own)."""
    return (op.primitive in _PRODUCES_IN_FUSION and len(users) == 1 and users[0].primitive in _FUSIBLE
            and users[0].repeat == op.repeat)


def temporary_bytes(tensor: TensorSpec, backend: str) -> float:
    """Bytes of an intermediate buffer on ``backend``: XLA's CPU backend widens bf16 and f16 to f32."""
    if backend == "cpu" and tensor.dtype in ("bfloat16", "float16"):
        return 2.0 * tensor.nbytes
    return float(tensor.nbytes)
