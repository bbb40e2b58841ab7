"""Logical-axis rules for a layout and the parameter shardings they give.

Megatron's layout in logical terms: tensor parallelism splits attention heads, MLP width
(the experts' too) and vocabulary; expert parallelism splits the routed experts; FSDP (ZeRO 3)
splits the model width over the data axes (an expert's over those its expert axes leave);
pipeline parallelism splits the stacked layers over the pipeline axes. A dimension whose
size its mesh axes do not divide stays replicated.

>>> from planner.config import load_model
>>> axes = {"dp": ("data",), "tp": ("tensor",), "pp": (), "cp": ()}
>>> rules = logical_rules(Layout(dp=8, tp=4, zero_stage=3), axes, load_model("llama3-8b"))
>>> rules[LogicalAxis.HEADS], rules[LogicalAxis.EMBED]
(('tensor',), ('data',))
"""

from __future__ import annotations

import math
from typing import Any

from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from planner.programs.params import LogicalAxis, abstract_params, flat_logical_axes, param_shapes

Rules = dict[LogicalAxis, tuple[str, ...]]


def logical_rules(layout: Layout, axes: dict[str, tuple[str, ...]], model: ModelConfig) -> Rules:
    """Logical axis → mesh axes for ``layout``, given which mesh axes carry each parallelism."""
    tensor, data, pipeline = axes["tp"], axes["dp"], axes["pp"]
    rules: Rules = {axis: () for axis in LogicalAxis} | {LogicalAxis.EXPERTS: axes.get("ep", ())}
    for axis in (LogicalAxis.HEADS, LogicalAxis.MLP, LogicalAxis.VOCAB):
        rules[axis] = tensor
    rules[LogicalAxis.KV_HEADS] = tensor  # over the longest run of them that divides the KV heads (`param_specs`)
    if embed := axes.get("tpe", ()):  # 2D weight-stationary: the model dimension over its own axes, the vocabulary over all
        rules[LogicalAxis.EMBED], rules[LogicalAxis.VOCAB] = embed, (*tensor, *embed)
    if layout.zero_stage == 3:
        rules[LogicalAxis.EMBED] = data
    rules[LogicalAxis.LAYERS] = pipeline
    return rules


def entry_axes(entry: Any) -> tuple[str, ...]:
    """The mesh axes one ``PartitionSpec`` entry names: none (None), one (a name) or several (a tuple).

    >>> entry_axes(None), entry_axes("data"), entry_axes(("expert", "data"))
    ((), ('data',), ('expert', 'data'))
    """
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _dim_spec(size: int, mesh_axes: tuple[str, ...], mesh_shape: dict[str, int], *,
              prefix: bool = False) -> str | tuple[str, ...] | None:
    """The mesh axes a dimension of ``size`` splits over: all of ``mesh_axes`` when they divide it,
    else none; with ``prefix``, the longest leading run of them that divides it."""
    runs = [mesh_axes[:k] for k in range(len(mesh_axes), 0, -1)] if prefix else [mesh_axes] if mesh_axes else []
    axes = next((run for run in runs if size % math.prod(mesh_shape[a] for a in run) == 0), ())
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


def param_specs(model: ModelConfig, rules: Rules, mesh_shape: dict[str, int]) -> dict[str, tuple[Any, ...]]:
    """Parameter path (``layers/attn/wq``) → per-dimension mesh axes under ``rules``."""
    shapes = param_shapes(model)
    specs = {}
    for path, names in flat_logical_axes(model).items():
        used: set[str] = set()
        dims: list[Any] = [None] * len(names)
        # The vocabulary claims its axes first: under a 2D split they include the model dimension's.
        for i in sorted(range(len(names)), key=lambda i: names[i] != LogicalAxis.VOCAB):
            dims[i] = _dim_spec(shapes[path][i], tuple(a for a in rules[names[i]] if a not in used), mesh_shape,
                                prefix=names[i] == LogicalAxis.KV_HEADS)
            used.update(entry_axes(dims[i]))
        specs[path] = tuple(dims)
    return specs


def partition_spec_tree(model: ModelConfig, specs: dict[str, tuple[Any, ...]]) -> Any:
    """The parameter pytree with a ``jax.sharding.PartitionSpec`` at every leaf."""
    import jax  # only here: the plan's specs are plain tuples, so the planner's search runs without JAX
    from jax.sharding import PartitionSpec

    shapes = abstract_params(model)
    flat, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    leaves = [PartitionSpec(*specs["/".join(str(p.key) for p in path)]) for path, _ in flat]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def zero_sharded_specs(model: ModelConfig, specs: dict[str, tuple[Any, ...]], data_axes: tuple[str, ...],
                       mesh_shape: dict[str, int], *, whole_layers: bool = False) -> dict[str, tuple[Any, ...]]:
    """``specs`` with each array also split over ``data_axes`` (ZeRO's optimizer-state sharding).

    The first dimension that is not yet sharded and that the data axes the array does not use
    yet divide takes those (an expert's weights, split over the expert axes, take the rest);
    an array with none stays as it was. ``whole_layers``: never the stacked layers' leading
    dimension, so each layer's state is split within it (the optimizer step in backward updates
    one layer at a time, where a split over layers would gather the whole stack for each).

    >>> from planner.config import load_model
    >>> model, specs = load_model("llama3-8b"), {"layers/mlp/w_in": (None, None, None)}
    >>> [zero_sharded_specs(model, specs, ("data",), {"data": 8}, whole_layers=w)["layers/mlp/w_in"] for w in (False, True)]
    [('data', None, None), (None, 'data', None)]
    """
    shapes = param_shapes(model)
    if not whole_layers:
        return split_over_data(specs, shapes, data_axes, mesh_shape)
    layers = {path: dims for path, dims in specs.items() if path.startswith("layers/")}
    within = split_over_data({path: dims[1:] for path, dims in layers.items()}, {path: shapes[path][1:] for path in layers},
                             data_axes, mesh_shape)
    outer = split_over_data({path: dims for path, dims in specs.items() if path not in layers}, shapes, data_axes, mesh_shape)
    return {path: (specs[path][0], *within[path]) if path in layers else outer[path] for path in specs}


def split_over_data(specs: dict[str, tuple[Any, ...]], shapes: dict[str, tuple[int, ...]], data_axes: tuple[str, ...],
                    mesh_shape: dict[str, int]) -> dict[str, tuple[Any, ...]]:
    """`zero_sharded_specs` for arrays of the given ``shapes`` (path → shape), e.g. LoRA's adapters.

    >>> split_over_data({"a": (None, "tensor")}, {"a": (8, 4)}, ("data",), {"data": 2, "tensor": 4})
    {'a': ('data', 'tensor')}
    """
    out = {}
    for path, dims in specs.items():
        used = {a for d in dims for a in entry_axes(d)}
        free = tuple(a for a in data_axes if a not in used)
        new = list(dims)
        if free:
            n_free = math.prod(mesh_shape[a] for a in free)
            for i, (size, dim) in enumerate(zip(shapes[path], dims)):
                if dim is None and size % n_free == 0:
                    new[i] = free[0] if len(free) == 1 else free
                    break
        out[path] = tuple(new)
    return out

