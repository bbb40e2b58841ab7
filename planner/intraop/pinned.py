"""Rebuild a traced program equation by equation with each node's chosen shardings pinned.

An intra-op planner chooses a sharding for every node of a graph `planner.intraop.extract` made
from a jaxpr: its operands, its results. Given to ``jax.jit`` as input shardings alone, that
choice is a hint XLA's propagation may overrule (gathering what the plan keeps split, or
replicating what it splits). `PinnedInterpreter` evaluates the same jaxpr and wraps every
leaf equation's operands and results in ``with_sharding_constraint`` with the chosen
shardings, so the partitioner implements the choice. Nested jit calls and custom-derivative
calls are inlined (after differentiation their rules no longer matter), remat regions and
scans are rebuilt around their pinned bodies (``jax.checkpoint``, ``lax.scan``), and any other
call-like equation is bound as it is, unpinned inside.

The pins are sharding constraints, which JAX takes on Auto mesh axes only; a mesh with
Explicit axes (``jax.make_mesh``'s default) is pinned on its Auto twin (`auto_mesh`): the same
devices and axes, the program traced under it even inside ``jax.set_mesh`` of the Explicit one.

>>> import jax, jax.numpy as jnp
>>> from planner.intraop.extract import extract_graph
>>> f = lambda x: jnp.tanh(x @ x)
>>> x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
>>> closed = jax.make_jaxpr(f)(x)
>>> run = PinnedInterpreter(extract_graph(f, x).graph["eqn_nodes"], lambda node: None, mesh=None)
>>> run.call(closed.jaxpr, [], [jnp.ones((8, 8))])[0].shape
(8, 8)
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable

import jax
import networkx as nx
from jax.extend import core as jex_core
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from costmodel.oplevel.strategies import Sharding, Strategy
from planner.intraop.loops import scan_consts_and_carry

# Call-like primitives evaluated inline: after differentiation their custom rules no longer matter.
_INLINE = ("jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call")
_REMAT = ("remat2", "checkpoint")

Path = tuple[int, ...]


def to_partition_spec(sharding: Sharding) -> PartitionSpec:
    """A per-dimension tuple of mesh axes as a ``PartitionSpec``.

    >>> to_partition_spec(((), ("data", "tensor"), ("pipe",)))
    P(None, ('data', 'tensor'), 'pipe')
    """
    return PartitionSpec(*[None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in sharding])


def auto_mesh(mesh: Mesh) -> Mesh:
    """``mesh`` with every axis Auto (the sharding constraints' kind), the same devices and names.

    >>> import jax
    >>> auto_mesh(jax.make_mesh((1,), ("data",), axis_types=(AxisType.Explicit,))).axis_types
    (Auto,)
    """
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


class PinnedInterpreter:
    """Evaluates jaxprs whose leaf equations (by their `planner.intraop.extract` path) have a strategy,
    pinning each one's operands and results to it."""

    def __init__(self, eqn_nodes: dict[Path, int], strategy_of: Callable[[int], Strategy | None], mesh: Mesh | None):
        self.eqn_nodes, self.strategy_of, self.mesh = eqn_nodes, strategy_of, None if mesh is None else auto_mesh(mesh)

    def run(self, jaxpr: Any, consts: list[Any], args: list[Any], prefix: Path = (), eqns: range | None = None,
            env: dict[Any, Any] | None = None) -> dict[Any, Any]:
        """Evaluate ``eqns`` (default all) of ``jaxpr``; the environment of every variable bound."""
        env = {} if env is None else env
        env.update(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))
        for index in eqns if eqns is not None else range(len(jaxpr.eqns)):
            eqn = jaxpr.eqns[index]
            invals = [v.val if isinstance(v, jex_core.Literal) else env[v] for v in eqn.invars]
            env.update(zip(eqn.outvars, self._bind(eqn, invals, (*prefix, index))))
        return env

    def call(self, jaxpr: Any, consts: list[Any], args: list[Any], prefix: Path = ()) -> list[Any]:
        """The outputs of ``jaxpr`` on ``args``."""
        env = self.run(jaxpr, consts, args, prefix)
        return [v.val if isinstance(v, jex_core.Literal) else env[v] for v in jaxpr.outvars]

    def _pin(self, x: Any, sharding: Sharding) -> Any:
        if self.mesh is None or not hasattr(x, "shape") or len(sharding) < x.ndim:
            return x
        # Trailing-aligned: a stacked input [L, ...] is read one [...] slice at a time in the layer loop.
        spec = to_partition_spec(tuple(sharding)[len(sharding) - x.ndim:])
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

    def _bind(self, eqn: Any, invals: list[Any], path: Path) -> list[Any]:
        name, params = eqn.primitive.name, eqn.params
        if name in _INLINE:
            sub = params.get("jaxpr", params.get("call_jaxpr"))
            if len(sub.jaxpr.outvars) == len(eqn.outvars):
                return self.call(sub.jaxpr, list(sub.consts), invals, path)
        if name in _REMAT:
            sub = params["jaxpr"]
            region = jax.checkpoint(lambda *a: self.call(sub, [], list(a), path), prevent_cse=params["prevent_cse"],
                                    policy=params["policy"])
            return region(*invals)
        if name == "scan":
            return self._scan(eqn, invals, path)
        node = self.eqn_nodes.get(path)
        strategy = self.strategy_of(node) if node is not None else None
        if strategy is not None:
            pinned = iter([self._pin(x, s) for x, s in zip([v for v in invals if hasattr(v, "shape")], strategy.operands)])
            invals = [next(pinned, v) if hasattr(v, "shape") else v for v in invals]
        out = eqn.primitive.bind(*invals, **params)
        outs = list(out) if eqn.primitive.multiple_results else [out]
        if strategy is not None:
            outs = [self._pin(x, s) for x, s in zip(outs, strategy.results)] + outs[len(strategy.results):]
        return outs

    def _scan(self, eqn: Any, invals: list[Any], path: Path) -> list[Any]:
        params = eqn.params
        body, (n_consts, n_carry) = params["jaxpr"], scan_consts_and_carry(params)
        consts, init, xs = invals[:n_consts], invals[n_consts:n_consts + n_carry], invals[n_consts + n_carry:]

        def step(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
            outs = self.call(body.jaxpr, list(body.consts), [*consts, *carry, *x], path)
            return outs[:n_carry], outs[n_carry:]

        carry, ys = jax.lax.scan(step, init, xs, length=params["length"], reverse=params["reverse"], unroll=params["unroll"])
        return [*carry, *ys]


def pinned_function(graph: nx.DiGraph, strategy_of: Callable[[int], Strategy | None], mesh: Mesh | None) -> Callable[..., Any]:
    """The function ``graph`` was traced from (`planner.intraop.extract`), every equation pinned to ``strategy_of(node)``."""
    closed, out_tree = graph.graph["jaxpr"], graph.graph["out_tree"]
    run = PinnedInterpreter(graph.graph["eqn_nodes"], strategy_of, mesh)

    def pinned(*args: Any) -> Any:
        # Under a jax.set_mesh of Explicit axes each constraint would be an assert on the arguments' types.
        with nullcontext() if run.mesh is None else jax.sharding.use_abstract_mesh(run.mesh.abstract_mesh):
            outs = run.call(closed.jaxpr, list(closed.consts), jax.tree_util.tree_leaves(args))
        return jax.tree_util.tree_unflatten(out_tree, outs)

    return pinned
