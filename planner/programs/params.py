"""Parameters of the reference transformer: initialisation, abstract shapes, logical axes.

Layer parameters are stacked with a leading ``layers`` axis so the layers run under
``jax.lax.scan``. Every parameter also has logical axis names (one per dimension), which
the planner maps to mesh axes to produce ``PartitionSpec``s. The token table and the head
hold the padded vocabulary (`ModelConfig.padded_vocab_size`: 50 tokens take 128 rows).

>>> from costmodel.inputs.model_config import ModelConfig
>>> cfg = ModelConfig(name="t", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=64, vocab_size=50)
>>> params = abstract_params(cfg)
>>> params["layers"]["attn"]["wk"].shape, tuple(map(str, param_logical_axes(cfg)["layers"]["attn"]["wk"]))
((2, 32, 2, 8), ('layers', 'embed', 'kv_heads', 'head_dim'))
>>> params["embed"]["tokens"].shape, params["lm_head"]["w"].shape
((128, 32), (32, 128))
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from costmodel.inputs.model_config import ModelConfig, Norm, Positions

if TYPE_CHECKING:
    import jax

Params = dict[str, Any]
_INIT_STD = 0.02


class LogicalAxis(StrEnum):
    """Names of parameter dimensions, independent of any mesh."""

    LAYERS = "layers"
    VOCAB = "vocab"
    EMBED = "embed"
    HEADS = "heads"
    KV_HEADS = "kv_heads"
    HEAD_DIM = "head_dim"
    MLP = "mlp"
    EXPERTS = "experts"
    ROUTES = "routes"  # the router's score per expert: never split, every token scores every expert
    POSITIONS = "positions"
    NORM = "norm"


A = LogicalAxis


def _norm_axes(cfg: ModelConfig, *lead: str) -> dict[str, tuple[str, ...]]:
    axes = {"scale": (*lead, A.NORM)}
    if cfg.norm is Norm.LAYERNORM:
        axes["bias"] = (*lead, A.NORM)
    return axes


def _mlp_axes(cfg: ModelConfig, lead: tuple[str, ...], *, prefix: str = "") -> dict[str, tuple[str, ...]]:
    axes = {f"{prefix}w_in": (*lead, A.EMBED, A.MLP), f"{prefix}w_out": (*lead, A.MLP, A.EMBED)}
    if cfg.mlp.gated:
        axes[f"{prefix}w_gate"] = (*lead, A.EMBED, A.MLP)
    if cfg.mlp_bias and not prefix:
        axes["b_in"] = (*lead, A.MLP)
        axes["b_out"] = (*lead, A.EMBED)
        if cfg.mlp.gated:
            axes["b_gate"] = (*lead, A.MLP)
    return axes


def param_logical_axes(cfg: ModelConfig) -> Params:
    """The parameter tree with a tuple of logical axis names in place of each array."""
    lay = (A.LAYERS,)
    attn = {
        "wq": (*lay, A.EMBED, A.HEADS, A.HEAD_DIM),
        "wk": (*lay, A.EMBED, A.KV_HEADS, A.HEAD_DIM),
        "wv": (*lay, A.EMBED, A.KV_HEADS, A.HEAD_DIM),
        "wo": (*lay, A.HEADS, A.HEAD_DIM, A.EMBED),
    }
    if cfg.qkv_bias:
        attn |= {"bq": (*lay, A.HEADS, A.HEAD_DIM), "bk": (*lay, A.KV_HEADS, A.HEAD_DIM), "bv": (*lay, A.KV_HEADS, A.HEAD_DIM)}
    if cfg.out_bias:
        attn["bo"] = (*lay, A.EMBED)
    layers: Params = {"attn_norm": _norm_axes(cfg, *lay), "attn": attn, "mlp_norm": _norm_axes(cfg, *lay)}
    if cfg.is_moe:
        moe = {"router": (*lay, A.EMBED, A.ROUTES), **_mlp_axes(cfg, (*lay, A.EXPERTS))}
        if cfg.shared_expert_ffn_size:
            moe |= _mlp_axes(cfg, lay, prefix="shared_") | {"shared_gate": (*lay, A.EMBED, A.NORM)}
        layers["moe"] = moe
    else:
        layers["mlp"] = _mlp_axes(cfg, lay)
    tree: Params = {"embed": {"tokens": (A.VOCAB, A.EMBED)}, "layers": layers, "final_norm": _norm_axes(cfg)}
    if cfg.positions is Positions.LEARNED:
        tree["embed"]["positions"] = (A.POSITIONS, A.EMBED)
    if not cfg.tie_embeddings:
        tree["lm_head"] = {"w": (A.EMBED, A.VOCAB)}
    return tree


def _dim_sizes(cfg: ModelConfig) -> dict[str, int]:
    return {
        A.LAYERS: cfg.num_layers, A.VOCAB: cfg.padded_vocab_size, A.EMBED: cfg.hidden_size, A.HEADS: cfg.num_heads,
        A.KV_HEADS: cfg.num_kv_heads, A.HEAD_DIM: cfg.head_dim, A.EXPERTS: cfg.num_experts, A.ROUTES: cfg.num_experts,
        A.POSITIONS: cfg.max_position_embeddings, A.NORM: cfg.hidden_size,
    }


def _shape(cfg: ModelConfig, path: tuple[str, ...], axes: tuple[str, ...]) -> tuple[int, ...]:
    sizes = _dim_sizes(cfg)
    mlp = cfg.ffn_size
    if "moe" in path:
        mlp = cfg.shared_expert_ffn_size if path[-1].startswith("shared_") else cfg.moe_ffn_size
    if path[-1] == "shared_gate":
        return (cfg.num_layers, cfg.hidden_size, 1)
    return tuple(mlp if a == A.MLP else sizes[a] for a in axes)


def _leaves(tree: Params, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(path, logical axes) of each array in `param_logical_axes`' tree, in jax.tree_util's order (a dict's keys sorted)."""
    for key in sorted(tree):
        if isinstance(tree[key], dict):
            yield from _leaves(tree[key], (*path, key))
        else:
            yield (*path, key), tree[key]


def flat_logical_axes(cfg: ModelConfig) -> dict[str, tuple[str, ...]]:
    """Parameter path (``layers/attn/wq``) → its logical axes, in the order of `abstract_params`' leaves."""
    return {"/".join(path): axes for path, axes in _leaves(param_logical_axes(cfg))}


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Parameter path → shape: `abstract_params`' shapes in its order, without JAX (all the planner's search needs)."""
    return {"/".join(path): _shape(cfg, path, axes) for path, axes in _leaves(param_logical_axes(cfg))}


def _init_leaf(cfg: ModelConfig, path: tuple[str, ...], shape: tuple[int, ...], key: jax.Array, dtype: Any) -> jax.Array:
    import jax  # here, not at the top: the planner reads the axes and shapes without JAX
    import jax.numpy as jnp

    name = path[-1]
    if name == "scale":
        return jnp.ones(shape, dtype)
    if name.startswith("b"):  # biases: bq, bk, bv, bo, b_in, b_gate, b_out, and the norms' bias
        return jnp.zeros(shape, dtype)
    std = _INIT_STD
    if name in ("wo", "w_out", "shared_w_out"):
        std /= math.sqrt(2 * cfg.num_layers)  # GPT-2's scaled init of residual projections
    return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def init_params(cfg: ModelConfig, key: jax.Array, *, dtype: Any = "float32") -> Params:
    """Randomly initialised parameters (normal, std 0.02; norms 1; biases 0)."""
    import jax  # as in `_init_leaf`

    axes = param_logical_axes(cfg)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(axes, is_leaf=lambda x: isinstance(x, tuple))
    keys = jax.random.split(key, len(leaves))
    out = []
    for (path, leaf_axes), k in zip(leaves, keys):
        names = tuple(p.key for p in path)
        out.append(_init_leaf(cfg, names, _shape(cfg, names, leaf_axes), k, dtype))
    return jax.tree_util.tree_unflatten(treedef, out)


def abstract_params(cfg: ModelConfig, *, dtype: Any = "float32") -> Params:
    """The parameter tree as ``jax.ShapeDtypeStruct``s: any model size, nothing allocated."""
    import jax  # as in `_init_leaf`

    return jax.eval_shape(lambda: init_params(cfg, jax.random.key(0), dtype=dtype))
