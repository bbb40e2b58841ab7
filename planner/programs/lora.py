"""LoRA adapters for the reference transformer: shapes, initialisation, shardings, merging.

Each adapted matrix ``W`` of a layer (`costmodel.inputs.workload.adapted_matrices`) gets ``A``, of
shape ``[layers, *W's input dims, r]``, and ``B``, ``[layers, r, *W's output dims]``, stored
beside it in the layer's parameters as ``<name>_lora_a`` / ``<name>_lora_b`` (fp32 master
copies, cast on use like every trained weight). The forward (`planner.programs.transformer`)
adds ``(x·A)·B · alpha / r`` to ``x·W``. ``A`` starts small and random and ``B`` at zero, so
training starts from the base model (Hu et al. 2021).

An adapter's sharding follows its matrix's: ``A`` takes ``W``'s specs of the input dims,
``B`` those of the output dims, and the rank stays whole. Under tensor parallelism a
column-parallel ``W`` keeps ``A`` whole and splits ``B``; a row-parallel one splits ``A``.

>>> from costmodel.inputs.model_config import ModelConfig
>>> from costmodel.inputs.workload import LoraConfig
>>> cfg = ModelConfig(name="t", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=64, vocab_size=50)
>>> shapes = adapter_shapes(cfg, LoraConfig(rank=4))
>>> shapes["layers/attn/wk_lora_a"], shapes["layers/attn/wk_lora_b"], shapes["layers/attn/wo_lora_a"]
((2, 32, 4), (2, 4, 2, 8), (2, 4, 8, 4))
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.inputs.workload import LoraConfig, adapted_matrices
from planner.programs.params import Params, abstract_params, init_params

_A_INIT_STD = 0.02
# Number of input dims of each adaptable weight as stored (after the leading layers dim):
# wo is [heads, head_dim, embed]; the rest take one input dim.
_INPUT_DIMS = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "w_in": 1, "w_gate": 1, "w_out": 1}


def _weight_paths(cfg: ModelConfig, lora: LoraConfig) -> list[str]:
    return [f"layers/{a.group.value}/{a.name}" for a in adapted_matrices(cfg, lora)]


def adapter_shapes(cfg: ModelConfig, lora: LoraConfig) -> dict[str, tuple[int, ...]]:
    """Adapter path (``layers/attn/wq_lora_a``) → shape."""
    base = {"/".join(str(k.key) for k in path): leaf.shape for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_params(cfg))[0]}
    out = {}
    for path in _weight_paths(cfg, lora):
        shape, n_in = base[path], _INPUT_DIMS[path.rsplit("/", 1)[1]]
        out[f"{path}_lora_a"] = (shape[0], *shape[1:1 + n_in], lora.rank)
        out[f"{path}_lora_b"] = (shape[0], lora.rank, *shape[1 + n_in:])
    return out


def adapter_specs(cfg: ModelConfig, lora: LoraConfig, param_specs: dict[str, tuple[Any, ...]]) -> dict[str, tuple[Any, ...]]:
    """Adapter path → mesh axes per dimension, from the plan's spec of each adapted matrix."""
    out = {}
    for path in _weight_paths(cfg, lora):
        spec, n_in = tuple(param_specs[path]), _INPUT_DIMS[path.rsplit("/", 1)[1]]
        out[f"{path}_lora_a"] = (spec[0], *spec[1:1 + n_in], None)
        out[f"{path}_lora_b"] = (spec[0], None, *spec[1 + n_in:])
    return out


def _nest(flat: dict[str, Any]) -> Params:
    tree: Params = {}
    for path, value in flat.items():
        *parents, leaf = path.split("/")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree


def adapter_tree(cfg: ModelConfig, lora: LoraConfig, flat: dict[str, Any]) -> Params:
    """The adapters' pytree (``{"layers": {"attn": {"wq_lora_a": ...}}}``) from path → leaf."""
    return _nest({path: flat[path] for path in adapter_shapes(cfg, lora)})


def init_adapters(cfg: ModelConfig, lora: LoraConfig, key: jax.Array, *, dtype: Any = jnp.float32) -> Params:
    """``A`` normal (std 0.02), ``B`` zero."""
    shapes = adapter_shapes(cfg, lora)
    keys = dict(zip(shapes, jax.random.split(key, len(shapes))))
    return adapter_tree(cfg, lora, {p: (_A_INIT_STD * jax.random.normal(keys[p], s, jnp.float32)).astype(dtype) if p.endswith("_a")
                                    else jnp.zeros(s, dtype) for p, s in shapes.items()})


def abstract_adapters(cfg: ModelConfig, lora: LoraConfig, *, dtype: Any = jnp.float32) -> Params:
    """The adapters as ``jax.ShapeDtypeStruct``s."""
    return adapter_tree(cfg, lora, {p: jax.ShapeDtypeStruct(s, jnp.dtype(dtype)) for p, s in adapter_shapes(cfg, lora).items()})


def frozen_dtype_of(path: str, train: TrainConfig) -> Any:
    """The dtype a frozen base weight is stored in: layer weights (all but the norms) as
    LoRA's ``frozen_dtype`` says, embedding, head and norms in the compute dtype."""
    quantized = path.startswith("layers/") and "norm/" not in path
    return jnp.dtype(train.workload.frozen_dtype.jax_name if quantized else train.compute_dtype.value)


def init_frozen(cfg: ModelConfig, train: TrainConfig, key: jax.Array) -> Params:
    """Random base weights as LoRA stores them (`frozen_dtype_of`); an integer format holds the
    weights' values rounded to a 1/127 (int8) or 1/7 (int4) grid of ±4 std, unscaled."""
    def store(path: tuple[Any, ...], x: jax.Array) -> jax.Array:
        dtype = frozen_dtype_of("/".join(str(k.key) for k in path), train)
        if jnp.issubdtype(dtype, jnp.integer):
            top = jnp.iinfo(dtype).max
            return jnp.clip(jnp.round(x / (4 * 0.02) * top), -top, top).astype(dtype)
        return x.astype(dtype)

    return jax.tree_util.tree_map_with_path(store, init_params(cfg, key))


def abstract_frozen(cfg: ModelConfig, train: TrainConfig) -> Params:
    """The frozen base weights as ``jax.ShapeDtypeStruct``s in their stored dtypes."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jax.ShapeDtypeStruct(x.shape, frozen_dtype_of("/".join(str(k.key) for k in path), train)), abstract_params(cfg))


def merge_adapters(frozen: Params, adapters: Params) -> Params:
    """The base parameters with each layer group's adapters added beside its weights."""
    layers = {group: {**frozen["layers"][group], **adapters["layers"].get(group, {})} for group in frozen["layers"]}
    return {**frozen, "layers": layers}


def adapter_elements(cfg: ModelConfig, lora: LoraConfig) -> int:
    """All adapter parameters of the model (every layer).

    >>> from costmodel.inputs.workload import LoraConfig
    >>> from planner.config import load_model
    >>> adapter_elements(load_model("llama3-8b"), LoraConfig())
    13631488
    """
    return sum(math.prod(s) for s in adapter_shapes(cfg, lora).values())
