"""A serving plan (``train.workload`` prefill or decode) as a JAX program: ``(params, kv_cache,
batch) -> (logits_BxV, kv_cache)``, every replica's batch together.

The weights come as served with the plan's ``param_specs``, one array a layer, and each layer's
cache ``[batch, kv_heads, tokens, head_dim]`` is split over the data axes by sequence and over
the tensor axes by KV head (whole where the tensor axes do not divide the KV heads, as the
plan's ``wk`` is), and donated (`validate.mesh_hooks.kv_cache_spec`); pipelined, the layers and
the cache come stacked and split over the pipeline axis by layer (`serves_stacked`,
`planner.programs.decode`). The activations carry the plan's specs and the embedding is
vocab-parallel, as in training.

- Decode (`planner.programs.decode`): one token per sequence at ``batch["position"]``.
- Prefill (`planner.programs.prefill`): the prompts ``[batch, prompt_len]`` through the
  layers with the plan's attention kernel (flash: no ``P×P`` scores), every prompt token's
  keys and values written, the head on each sequence's last token.

Pipelined (``pp > 1``), the layers run in a ``shard_map`` manual over the pipeline axis, as
`validate.gpipe` runs training: stage ``s`` holds its contiguous slice of the stacked
layers and of the cache. A replica's sequences are cut into ``M`` micro-batches (decode:
`costmodel.step.inference.micro_batches`, one per stage where the batch allows; prefill: one,
the whole replica batch stage after stage, as the cost model's time to first token has it),
sequence ``i`` of a data shard in micro-batch ``i mod M``, so nothing moves between devices.
On tick ``t`` of ``M + S − 1`` stage 0 takes micro-batch ``t``, every other stage what its
predecessor ``ppermute``d on tick ``t − 1``, runs its layers against that micro-batch's cache
slice and writes the slice back. Bubble ticks need no mask: one before a stage's first
micro-batch writes (garbage) only the slots that micro-batch's own tick writes again before
reading them, and one after its last repeats that micro-batch's work exactly (stage 0 takes
the same input again, and so, a tick later, does each next stage). Every device runs the same
program, so stages also compute in the bubble ticks: ``(M + S − 1) / M`` times the useful
layer work. The last stage keeps the micro-batches' outputs (prefill: each sequence's last
token) and a float32 ``psum`` over the pipeline axis hands them to every pipeline group
(XLA's CPU all-reduce aborts on a bf16 sum over a manual axis, jax 0.10.2). The embedding
and the head run whole on every pipeline group, each in a region manual over the pipeline
axis, as `validate.gpipe` runs them. Uneven stages are not lowered.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from costmodel.errors import UnsupportedError
from costmodel.step.inference import micro_batches
from planner.plan_schema import Plan
from planner.programs.decode import decode_embed, decode_layers, decode_step
from planner.programs.prefill import prefill_layers, prefill_step
from planner.programs.transformer import embed, head
from validate.mesh_hooks import activation_constraint, embedding_lookup, layer_kv_cache_spec, region_mesh

Step = Callable[[Any, Any, Any], tuple[jax.Array, Any]]


def serves_stacked(plan: Plan) -> bool:
    """Whether the step takes its layers and caches stacked (a pipeline splits them over its
    axis by layer), not one array a layer."""
    return plan.layout.pp > 1


def serving_micro_batches(plan: Plan) -> int:
    """Micro-batches per replica the program runs through the pipeline (module docstring)."""
    return plan.train.workload.of_step(decode=micro_batches, prefill=lambda train, layout: 1)(plan.train, plan.layout)


def serving_program(plan: Plan, mesh: Mesh) -> Step:
    """The plan's serving step ``(params, kv_cache, batch) -> (logits, kv_cache)`` (module docstring).

    >>> from costmodel.inputs.layout import Layout
    >>> from planner.api import layout_plan
    >>> from validate.lowering import abstract_inputs
    >>> from validate.mesh_hooks import device_mesh
    >>> p = layout_plan("gpt2", Layout(), global_batch=2, seq_len=64, workload="prefill", inference={"prompt_len": 32})
    >>> mesh = device_mesh(p)
    >>> logits, cache = jax.eval_shape(serving_program(p, mesh), *abstract_inputs(p, mesh))
    >>> logits.shape, len(cache["k"]), cache["k"][0].shape  # logits over GPT-2's vocabulary padded to 50304, the padding masked
    ((2, 50304), 12, (2, 12, 64, 64))
    """
    lay = plan.layout
    if lay.pp > 1 and (plan.model.num_layers % lay.pp or (lay.stage_layers and len(set(lay.stage_layers)) > 1)):
        raise UnsupportedError(f"a serving plan with uneven pipeline stages ({plan.model.num_layers} layers on {lay.pp} stages) "
                               "is not lowered yet", fix="plan it with a pipeline degree that divides the layers")
    model, prefill = plan.model, plan.train.workload.of_step(decode=False, prefill=True)
    dt = jnp.dtype(plan.train.compute_dtype.value)
    constrain_activation = activation_constraint(plan, mesh)
    cache_spec = layer_kv_cache_spec(plan)

    def constrain(name: str, x: jax.Array) -> jax.Array:
        if name == "kv_cache_BxKxTxH":
            return jax.lax.with_sharding_constraint(x, NamedSharding(region_mesh(mesh), cache_spec))
        return constrain_activation(name, x)

    lookup, attention = embedding_lookup(plan, mesh), plan.layout.stack.attention.value
    if plan.layout.pp == 1:
        def step(params: Any, kv_cache: Any, batch: Any) -> tuple[jax.Array, Any]:
            if prefill:
                return prefill_step(params, kv_cache, batch, model, compute_dtype=dt, constrain=constrain, lookup=lookup,
                                    attention=attention)
            return decode_step(params, kv_cache, batch, model, compute_dtype=dt, constrain=constrain, lookup=lookup)

        return step

    def embedding(outer: Any, batch: Any) -> jax.Array:
        if prefill:
            return embed(outer, batch["tokens"], model, compute_dtype=dt, constrain=constrain, lookup=lookup)
        return decode_embed(outer, batch, model, compute_dtype=dt, constrain=constrain, lookup=lookup)

    def layers(x: jax.Array, stage_layers: Any, cache: Any, extras: Any) -> tuple[jax.Array, Any]:
        if prefill:
            return prefill_layers(x, stage_layers, cache, model, compute_dtype=dt, constrain=constrain, attention=attention)
        return decode_layers(x, stage_layers, cache, extras["position"], model, compute_dtype=dt, constrain=constrain)

    return _pipelined(plan, mesh, embedding=embedding, layers=layers, last_token=(lambda y: y[:, -1]) if prefill else (lambda y: y),
                      head_of=lambda outer, y_BxD: head(y_BxD[:, None], outer, model, constrain=constrain)[:, 0])


def _pipelined(plan: Plan, mesh: Mesh, *, embedding: Callable[..., jax.Array], layers: Callable[..., tuple[jax.Array, Any]],
               last_token: Callable[[jax.Array], jax.Array], head_of: Callable[..., jax.Array]) -> Step:
    """The serving step with its layers in the pipeline schedule of the module docstring."""
    lay, axes = plan.layout, plan.axes_of("pp")
    stages, micro = lay.pp, serving_micro_batches(plan)
    dt = jnp.dtype(plan.train.compute_dtype.value)
    sends = [(i, i + 1) for i in range(stages - 1)]

    def schedule(stage_layers: Any, kv_cache: Any, x_MxBx_: jax.Array, extras: Any) -> tuple[jax.Array, Any]:
        stage = jax.lax.axis_index(axes)
        first, last = stage == 0, stage == stages - 1
        x_MxBx_ = jax.lax.pcast(x_MxBx_, axes, to="varying")  # the carry below differs between stages
        # [layers, micro_batch · M, ...]: sequence i of a data shard belongs to micro-batch i mod M.
        cache = jax.tree.map(lambda c: c.reshape(c.shape[0], c.shape[1] // micro, micro, *c.shape[2:]), kv_cache)

        def tick(carry: tuple[Any, ...], t: jax.Array) -> tuple[tuple[Any, ...], None]:
            received, out_MxBxD, cache = carry
            work = t - stage  # this stage's micro-batch; outside 0 … M − 1 a bubble tick
            useful, mb = (work >= 0) & (work < micro), jnp.clip(work, 0, micro - 1)
            mine = jax.tree.map(lambda c: jax.lax.dynamic_index_in_dim(c, mb, axis=2, keepdims=False), cache)
            y, written = layers(jnp.where(first, x_MxBx_[mb], received), stage_layers, mine, extras)
            cache = jax.tree.map(lambda c, w: jax.lax.dynamic_update_index_in_dim(c, w, mb, axis=2), cache, written)
            out_MxBxD = out_MxBxD.at[mb].set(jnp.where(last & useful, last_token(y), out_MxBxD[mb]))
            return (jax.lax.ppermute(y, axes, sends), out_MxBxD, cache), None

        init = (jnp.zeros_like(x_MxBx_[0]), jnp.zeros_like(jax.vmap(last_token)(x_MxBx_)), cache)
        (_, out_MxBxD, cache), _ = jax.lax.scan(tick, init, jnp.arange(micro + stages - 1))
        kv_cache = jax.tree.map(lambda c: c.reshape(c.shape[0], -1, *c.shape[3:]), cache)
        return jax.lax.psum(jnp.where(last, out_MxBxD, 0).astype(jnp.float32), axes).astype(dt), kv_cache

    piped = jax.shard_map(schedule, mesh=mesh, in_specs=(PartitionSpec(axes), PartitionSpec(axes), PartitionSpec(), PartitionSpec()),
                          out_specs=(PartitionSpec(), PartitionSpec(axes)), axis_names=set(axes))

    def whole(fn: Callable[..., Any]) -> Callable[..., Any]:
        # Manual over the pipeline axes with everything whole there: every pipeline group runs all of ``fn``.
        return jax.shard_map(fn, mesh=mesh, in_specs=PartitionSpec(), out_specs=PartitionSpec(), axis_names=set(axes))

    def step(params: Any, kv_cache: Any, batch: Any) -> tuple[jax.Array, Any]:
        outer = {k: v for k, v in params.items() if k != "layers"}
        x_Gx_ = whole(embedding)(outer, batch)
        g = x_Gx_.shape[0]
        x_MxBx_ = jnp.moveaxis(x_Gx_.reshape(g // micro, micro, *x_Gx_.shape[1:]), 1, 0)
        extras = {k: v for k, v in batch.items() if k != "tokens"}
        y_MxBxD, kv_cache = piped(params["layers"], kv_cache, x_MxBx_, extras)
        y_GxD = jnp.moveaxis(y_MxBxD, 0, 1).reshape(g, -1)
        return whole(head_of)(outer, y_GxD), kv_cache

    return step
