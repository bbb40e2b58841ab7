"""Pipeline parallelism as a real JAX program: GPipe over the plan's pipeline axis with ``shard_map``.

The stacked layers are split over the pipeline axis (the plan's ``param_specs`` put it on
their leading dim); inside a ``shard_map`` that is manual over that axis only (tensor and
data axes stay with XLA), each stage runs its layers on one micro-batch per tick and
``ppermute``s the result to the next stage: ``M + S − 1`` ticks for ``M`` micro-batches
and ``S`` stages. The embedding runs before the pipeline and the head and loss after it,
on the last stage's outputs, which a sum over the pipeline axis hands to every stage.
Gradients come from differentiating the whole schedule, so the backward pass mirrors the
forward one (GPipe): every stage keeps all its micro-batches' activations (or what its
recompute policy saves), more than 1F1B's at most ``S`` in flight. Gradients of the
micro-batches add up inside one backward pass, so data-parallel reduction happens once.

Even stages only; interleaving and MoE layers are not lowered. Compiling it on the CPU
backend needs ``--xla_disable_hlo_passes=all-reduce-promotion`` (`compile_in_subprocess`
sets it): promoting the bf16 gradient all-reduces inside the manual region hits an XLA
check failure in jax 0.10.2.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from costmodel.errors import UnsupportedError
from planner.models.train_step import cross_entropy
from planner.models.transformer import embed, head, run_layers
from planner.schema import Plan


def check_pipeline(plan: Plan) -> str:
    """The pipeline axis name; raises `UnsupportedError` for what is not lowered."""
    lay, model = plan.layout, plan.model
    axes = plan.axes_of("pp")
    problems = {
        "the pipeline spans several mesh axes": len(axes) != 1,
        "uneven stages": bool(lay.stage_layers) and len(set(lay.stage_layers)) > 1 or model.num_layers % lay.pp != 0,
        "interleaved stages": lay.interleave > 1,
        "MoE layers": model.is_moe,
    }
    for what, bad in problems.items():
        if bad:
            raise UnsupportedError(f"pipeline plans with {what} are not lowered to JAX yet", fix="validate a plan with even stages, "
                                   "one pipeline axis, no interleaving, dense layers (or pp=1)")
    return axes[0]


def pipeline_loss_and_grads(plan: Plan, mesh: Mesh, *, remat: str) -> Callable[..., Any]:
    """``(params, batch) -> (mean loss, gradients)`` of the plan's GPipe schedule."""
    axis = check_pipeline(plan)
    model, train, stages = plan.model, plan.train, plan.layout.pp
    micro = plan.layout.micro_batches(train)
    dt = jnp.dtype(train.compute_dtype.value)

    def schedule(layers: Any, x_MxBxSxD: jax.Array) -> jax.Array:
        stage = jax.lax.axis_index(axis)
        first, last = stage == 0, stage == stages - 1

        def tick(carry: tuple[jax.Array, jax.Array], t: jax.Array) -> tuple[tuple[jax.Array, jax.Array], None]:
            received_BxSxD, out_MxBxSxD = carry
            x_BxSxD = jnp.where(first, x_MxBxSxD[jnp.minimum(t, micro - 1)], received_BxSxD)
            y_BxSxD, _ = run_layers(x_BxSxD, layers, model, remat=remat)
            done = t - (stages - 1)
            keep = last & (done >= 0)
            out_MxBxSxD = jnp.where(keep, out_MxBxSxD.at[jnp.maximum(done, 0)].set(y_BxSxD), out_MxBxSxD)
            sent_BxSxD = jax.lax.ppermute(y_BxSxD, axis, [(i, i + 1) for i in range(stages - 1)])
            return (sent_BxSxD, out_MxBxSxD), None

        # The carry differs between stages: mark it varying over the pipeline axis for scan.
        init = jax.lax.pcast((jnp.zeros_like(x_MxBxSxD[0]), jnp.zeros_like(x_MxBxSxD)), (axis,), to="varying")
        (_, out_MxBxSxD), _ = jax.lax.scan(tick, init, jnp.arange(micro + stages - 1))
        return jax.lax.psum(jnp.where(last, out_MxBxSxD, 0), axis)

    piped = jax.shard_map(schedule, mesh=mesh, in_specs=(PartitionSpec(axis), PartitionSpec()), out_specs=PartitionSpec(),
                          axis_names={axis})

    def loss(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        def micro_batches(v: jax.Array) -> jax.Array:
            # Micro-batch index minor within each data shard, as in gradient accumulation.
            return jnp.moveaxis(v.reshape(v.shape[0] // micro, micro, *v.shape[1:]), 1, 0)

        tokens_MxBxS, targets_MxBxS = micro_batches(batch["tokens"]), micro_batches(batch["targets"])
        x_MxBxSxD = jax.vmap(lambda t: embed(params, t, model, compute_dtype=dt))(tokens_MxBxS)
        y_MxBxSxD = piped(params["layers"], x_MxBxSxD)
        logits = jax.vmap(lambda y: head(y, params, model))(y_MxBxSxD)
        return jax.vmap(cross_entropy)(logits, targets_MxBxS).mean()

    return jax.value_and_grad(loss)
