"""What a serving plan's program (`validate.serving`) takes as arguments, computes and
communicates per device: the prefill and decode branch of `validate.predict`.

Notation: ``B`` sequences per replica, ``n`` new tokens per sequence (decode: 1; prefill:
the prompt ``P``), ``S`` pipeline stages, ``M`` micro-batches per replica
(`validate.serving.serving_micro_batches`), ``b = B / M``, ``ticks = M + S − 1`` (1 without
a pipeline, where ``M = 1``).

- Arguments: each weight as served (`planner.programs.decode.served_dtype_of`) split by the
  plan's spec (fp8 weights one byte each; the embedding and head whole on every pipeline
  stage), the K and V caches (``2 · layers/S · B · allocated tokens · kv_heads/tp · head_dim``
  elements in the cache's dtype, `costmodel.inputs.workload.KvCacheDtype`; whole KV heads where the
  tensor axes do not divide them), the tokens (int32:
  ``B · n``) and, decoding, the position.
- Matmul FLOPs: every tick, ``2 · b · n`` per layer weight element a device holds (its
  stage's layers: bubble ticks compute too) plus the attention's two products — decode:
  over the whole allocated cache, ``4 · b · tokens · heads/tp · head_dim`` per layer;
  prefill: the flash kernel's causal blocks (``4 · b · heads/tp · head_dim · block²`` per
  block pair of the prompt padded to whole blocks) or the materialized ``4 · b · heads/tp ·
  head_dim · P²``. Then the head, ``2 · B`` per head weight element a device holds, once on
  each pipeline group (the embedding is a lookup).
- Collectives, over the tensor axes: two all-reduces per layer and tick of ``b · n ×
  hidden`` in the compute dtype (the row-parallel attention output and MLP down
  projections), and one of the vocab-parallel embedding's ``B · n`` rows. Over the pipeline
  axes: one ``collective-permute`` per tick of a micro-batch's ``b · n × hidden``
  activation, and the all-reduce handing the last stage's ``B × hidden`` outputs (each
  sequence's last token) to every pipeline group, counted at the compute dtype (the float32
  sum of a bf16 value, as `validate.hlo` counts it). None over the data axes (replicas
  are independent). A 2D weight-stationary decode plan (an ``embed`` axis, kind ``tpe``) has
  its own per-layer list over the heads and model-dimension axes (`_two_d_collectives`), and
  its cache's sequences split over the model-dimension axes too.

The compiled peak is not compared, for prefill as for decode: on the CPU backend XLA
converts 16-bit weights to fp32 inside the layer loop, which says nothing about a GPU's
memory, and the serving memory model (`costmodel.step.inference.inference_memory`) is checked
through the arguments it mostly consists of (weights and cache). Prefill's activations
(the residual stream and one layer's widest intermediate over ``B · P`` tokens) are the
rest of that model; the flash kernel keeps them free of ``P×P`` terms.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from costmodel.inputs.stack import Attention
from costmodel.step.inference import padded_context, two_d_collectives
from costmodel.step.serving_kernels import kv_element_bytes
from planner.plan_schema import Plan
from planner.programs.attention import block_pairs, block_size
from planner.programs.decode import served_dtype_of
from planner.shardings import entry_axes
from validate.program_runs import PredictedCollective, param_shards
from validate.serving import serving_micro_batches


def _is_decode(plan: Plan) -> bool:
    return plan.train.workload.of_step(decode=True, prefill=False)


def _new_tokens(plan: Plan) -> int:
    """Tokens each sequence adds in one step: 1 decoding, the prompt prefilling."""
    return 1 if _is_decode(plan) else plan.train.prompt_len


def _ticks_and_micro_batch(plan: Plan) -> tuple[int, int]:
    """(ticks every device runs its layers, sequences per micro-batch) of one replica."""
    micro = serving_micro_batches(plan) if plan.layout.pp > 1 else 1
    return micro + plan.layout.pp - 1, plan.train.global_batch // micro


def _cache_elements_per_device(plan: Plan) -> float:
    """Elements of the K and V caches one device holds (a 2D plan's sequences split over its model-dimension axes)."""
    model = plan.model
    sizes = {a.name: a.size for a in plan.mesh}
    kv_heads = model.num_kv_heads / math.prod(sizes[a] for a in entry_axes(plan.param_specs["layers/attn/wk"][2]))
    sequences = plan.train.global_batch / math.prod(sizes[a] for a in plan.axes_of("tpe"))
    return 2 * model.num_layers / plan.layout.pp * sequences * padded_context(plan.train) * kv_heads * model.head_dim


def serving_argument_bytes(plan: Plan) -> float:
    """Bytes of the serving step's arguments on one device (module docstring).

    >>> from costmodel.inputs.layout import Layout
    >>> from planner.api import layout_plan
    >>> p = layout_plan("llama3-8b", Layout(tp=8), global_batch=64, seq_len=4096, workload="decode")
    >>> round(serving_argument_bytes(p) / 2**30, 2)  # 1.87 GiB of bf16 weights, 4 GiB of cache
    5.87
    >>> q = layout_plan("llama3-8b", Layout(tp=4, pp=2), global_batch=64, seq_len=4096, workload="decode")
    >>> round(serving_argument_bytes(q) / 2**30, 2)  # half the layers and cache; embedding and head on every stage
    6.11
    """
    weights = 0.0
    for path, (elements, _, _) in param_shards(plan).items():
        dtype = served_dtype_of(path, plan.train)
        weights += elements * (0.5 if dtype == jnp.int4 else jnp.dtype(dtype).itemsize)  # XLA packs two int4 per byte
    cache = _cache_elements_per_device(plan) * kv_element_bytes(plan.train)
    return weights + cache + plan.train.global_batch * _new_tokens(plan) * 4 + (4 if _is_decode(plan) else 0)


def _attention_flops_per_head_dim(plan: Plan, sequences: int) -> float:
    """One layer's attention FLOPs for ``sequences`` sequences, per query head and head dim."""
    if _is_decode(plan):
        return 4 * sequences * padded_context(plan.train)
    prompt = plan.train.prompt_len
    if plan.layout.stack.attention is Attention.FLASH:
        block = block_size(prompt)
        return 4 * sequences * len(block_pairs(prompt, block)[0]) * block**2
    return 4 * sequences * prompt**2


def serving_matmul_flops(plan: Plan) -> float:
    """Matmul FLOPs per device of one serving step (module docstring)."""
    model = plan.model
    per_device = param_shards(plan)
    ticks, micro_batch = _ticks_and_micro_batch(plan)
    matrices = sum(el for path, (el, _, shape) in per_device.items() if path.startswith("layers/") and len(shape) > 2)
    head = per_device["embed/tokens" if model.tie_embeddings else "lm_head/w"][0]
    heads_per_device = per_device["layers/attn/wq"][0] / (model.num_layers / plan.layout.pp * model.hidden_size * model.head_dim)
    layers = model.num_layers / plan.layout.pp
    attention = _attention_flops_per_head_dim(plan, micro_batch) * heads_per_device * model.head_dim * layers
    return ticks * (2 * micro_batch * _new_tokens(plan) * matrices + attention) + 2 * plan.train.global_batch * head


def serving_collectives(plan: Plan) -> list[PredictedCollective]:
    """The collectives of one serving step (module docstring)."""
    model, e = plan.model, plan.train.compute_dtype.bytes
    ticks, micro_batch = _ticks_and_micro_batch(plan)
    tensor, pipeline, n = plan.axes_of("tp"), plan.axes_of("pp"), _new_tokens(plan)
    micro_bytes = micro_batch * n * model.hidden_size * e
    out = []
    if plan.axes_of("tpe"):
        out = _two_d_collectives(plan)
    elif tensor:
        out.append(PredictedCollective(kind="all-reduce", axes=tensor, bytes_per_call=micro_bytes,
                                       calls=2 * model.num_layers // plan.layout.pp * ticks,
                                       why="row-parallel attention output and MLP down projection, summed over the tensor axes"))
    vocab = (*tensor, *plan.axes_of("tpe"))
    if vocab and plan.param_specs["embed/tokens"][0] is not None:
        out.append(PredictedCollective(kind="all-reduce", axes=vocab, bytes_per_call=plan.train.global_batch * n * model.hidden_size * e,
                                       calls=1, why="vocab-parallel embedding rows summed over the vocabulary split"))
    if pipeline:
        out += [PredictedCollective(kind="collective-permute", axes=pipeline, bytes_per_call=micro_bytes, calls=ticks,
                                    why="a micro-batch's activation handed to the next stage, every tick"),
                PredictedCollective(kind="all-reduce", axes=pipeline, bytes_per_call=plan.train.global_batch * model.hidden_size * e,
                                    calls=1, why="the last stage's outputs (last tokens) handed to every pipeline group")]
    return out


def _two_d_collectives(plan: Plan) -> list[PredictedCollective]:
    """A 2D weight-stationary decode step's collectives over its heads (``tp``) and model-dimension
    (``tpe``) axes, as the cost model lists them (`costmodel.step.inference.two_d_collectives`)."""
    axes = {"heads": plan.axes_of("tp"), "embed": plan.axes_of("tpe")}
    listed = two_d_collectives(plan.model, plan.train, plan.layout, tokens=plan.train.global_batch, layers=plan.model.num_layers,
                               last_stage=True)
    return [PredictedCollective(kind=c.kind.value, axes=axes[c.over], bytes_per_call=c.size_bytes, calls=c.calls, why=c.why)
            for c in listed]
