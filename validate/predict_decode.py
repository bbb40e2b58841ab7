"""What a decode plan's program (`validate.lowering.decode_program`) takes as arguments,
computes and communicates per device: the decode branch of `validate.predict`.

- Arguments: each weight as served (`planner.models.decode.served_dtype_of`) split by the
  plan's spec (fp8 weights one byte each), the K and V caches (``2 · layers · batch · allocated tokens ·
  kv_heads/tp · head_dim`` elements in the cache's dtype, `costmodel.workload.KvCacheDtype`; whole KV heads where the tensor
  axes do not divide them), the tokens (int32) and the position.
- Matmul FLOPs (batch: sequences per replica): ``2 · batch`` per weight element a device holds in the layers and the
  head (the embedding is a lookup), and the attention's two products over the whole
  allocated cache: ``4 · batch · tokens · heads/tp · head_dim`` per layer.
- Collectives, over the tensor axes: two all-reduces per layer of ``batch × hidden`` in
  the compute dtype (the row-parallel attention output and MLP down projections), and one of
  the vocab-parallel embedding's rows; none over the data axes (replicas are independent).

Not predicted (reported as such): pipeline stages (not lowered). The compiled peak is not
compared: on the CPU backend XLA converts 16-bit weights to fp32 inside the layer loop,
which says nothing about a GPU's memory, and the serving memory model
(`costmodel.inference.inference_memory`) is checked through the arguments it consists of.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from costmodel.serving_kernels import kv_element_bytes
from planner.models.decode import abstract_decode_inputs, served_dtype_of
from planner.schema import Plan
from validate.predict import PredictedCollective, _per_device


def decode_unpredicted_features(plan: Plan) -> list[str]:
    """Features of a decode plan whose collectives `decode_collectives` does not model."""
    return ["pipeline stages"] if plan.layout.pp > 1 else []


def _replica_batch(plan: Plan) -> int:
    return plan.train.global_batch  # sequences per replica


def _cache_elements_per_device(plan: Plan) -> float:
    """Elements of the K and V caches one device holds."""
    _, cache, _ = abstract_decode_inputs(plan.model, plan.train)
    layers, _, tokens, kv_heads, head_dim = cache["k"].shape
    tensor = math.prod(a.size for a in plan.mesh if a.name in plan.axes_of("tp"))
    kv_split = plan.param_specs["layers/attn/wk"][2] is not None
    return 2 * layers * _replica_batch(plan) * tokens * (kv_heads / tensor if kv_split else kv_heads) * head_dim


def decode_argument_bytes(plan: Plan) -> float:
    """Bytes of the decode step's arguments on one device (module docstring).

    >>> from costmodel.layout import Layout
    >>> from planner.api import layout_plan
    >>> p = layout_plan("llama3-8b", Layout(tp=8), global_batch=64, seq_len=4096, workload="decode")
    >>> round(decode_argument_bytes(p) / 2**30, 2)  # 1.87 GiB of bf16 weights, 4 GiB of cache
    5.87
    """
    weights = 0.0
    for path, (elements, _, _) in _per_device(plan).items():
        dtype = served_dtype_of(path, plan.train)
        weights += elements * (0.5 if dtype == jnp.int4 else jnp.dtype(dtype).itemsize)  # XLA packs two int4 per byte
    cache = _cache_elements_per_device(plan) * kv_element_bytes(plan.train)
    return weights + cache + _replica_batch(plan) * 4 + 4


def decode_matmul_flops(plan: Plan) -> float:
    """Matmul FLOPs per device of one decode step (module docstring)."""
    model, b = plan.model, _replica_batch(plan)
    per_device = _per_device(plan)
    matrices = sum(el for path, (el, _, shape) in per_device.items() if path.startswith("layers/") and len(shape) > 2)
    head = per_device["embed/tokens" if model.tie_embeddings else "lm_head/w"][0]
    _, cache, _ = abstract_decode_inputs(model, plan.train)
    tokens = cache["k"].shape[2]
    heads_per_device = per_device["layers/attn/wq"][0] / (model.num_layers * model.hidden_size * model.head_dim)
    attention = 4 * b * tokens * heads_per_device * model.head_dim * model.num_layers
    return 2 * b * (matrices + head) + attention


def decode_collectives(plan: Plan) -> list[PredictedCollective]:
    """The collectives of one decode step (module docstring)."""
    tensor = plan.axes_of("tp")
    if not tensor:
        return []
    row_bytes = _replica_batch(plan) * plan.model.hidden_size * plan.train.compute_dtype.bytes
    out = [PredictedCollective(kind="all-reduce", axes=tensor, bytes_per_call=row_bytes, calls=2 * plan.model.num_layers,
                               why="row-parallel attention output and MLP down projection, summed over the tensor axes")]
    if plan.param_specs["embed/tokens"][0] is not None:
        out.append(PredictedCollective(kind="all-reduce", axes=tensor, bytes_per_call=row_bytes, calls=1,
                                       why="vocab-parallel embedding rows summed over the vocabulary split"))
    return out

