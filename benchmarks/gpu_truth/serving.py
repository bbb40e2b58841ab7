"""Decode steps and a prefill of the reference serving programs, against the serving model.

A decode step (`planner.programs.decode.decode_step`) adds one token to each of ``batch``
sequences at the last position of a ``context``-token cache and attends over the whole
allocated cache; its predicted time is the serving model's time per output token
(`costmodel.step.inference.simulate_inference`, what ``plan simulate --workload decode`` prints).
A prefill (`planner.programs.prefill.prefill_step`, blockwise attention) runs the prompts and
writes their keys and values; predicted: the time to first token. One device (no tensor
parallelism), weights and cache in the compute dtype, the cache donated and passed on from step
to step as a server does (`benchmarks.gpu_truth.timing.median_chained_s`).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from benchmarks.gpu_truth.sizes import Sizes
from benchmarks.gpu_truth.target import Target
from benchmarks.gpu_truth.timing import Case, median_chained_s
from costmodel.hardware.machine import train_machine
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.estimate import StepEstimate
from costmodel.step.inference import simulate_inference


def _concrete(abstract: Any) -> Any:
    """Arrays of the abstract inputs' shapes and dtypes: small constant weights, token 0."""
    import jax  # why: JAX is imported only once a case runs
    import jax.numpy as jnp

    def value(x: Any) -> Any:
        return jnp.zeros(x.shape, x.dtype) if jnp.issubdtype(x.dtype, jnp.integer) else jnp.full(x.shape, 0.01, x.dtype)

    return jax.tree.map(value, abstract)


def prepared_serving_step(model: ModelConfig, train: TrainConfig) -> tuple[Callable[[Any], Any], Any]:
    """``(advance, cache)``: the jitted decode or prefill step chained on the cache it writes, and the first cache."""
    import jax
    import jax.numpy as jnp

    from planner.programs.decode import abstract_decode_inputs, decode_step
    from planner.programs.prefill import abstract_prefill_inputs, prefill_step

    dtype = jnp.dtype(train.compute_dtype.value)
    abstract = train.workload.of_step(decode=abstract_decode_inputs, prefill=abstract_prefill_inputs)(model, train)
    program = train.workload.of_step(decode=decode_step, prefill=prefill_step)
    step = jax.jit(partial(program, cfg=model, compute_dtype=dtype), donate_argnums=(1,))
    params, cache, batch = _concrete(abstract)
    if "position" in batch:  # the new token goes last: the step attends over the whole context
        batch["position"] = jnp.asarray(train.seq_len - 1, jnp.int32)

    def advance(cache: Any) -> Any:
        return step(params, cache, batch)[1]

    return advance, cache


def _measure(model: ModelConfig, train: TrainConfig) -> float:
    return median_chained_s(*prepared_serving_step(model, train))


def predicted_serving(target: Target, model: ModelConfig, train: TrainConfig) -> StepEstimate:
    """The serving model's estimate of one step on the target's device."""
    return simulate_inference(model, train, Layout(), train_machine(target.cluster, train))


def decode_train(target: Target, batch: int, context: int) -> TrainConfig:
    """A decode case's sizes and the target's precision."""
    return TrainConfig(workload="decode", global_batch=batch, seq_len=context).with_precision(target.precision)


def _case(target: Target, model: ModelConfig, train: TrainConfig, *, name: str, shape: str) -> Case:
    def predict() -> float:
        est = predicted_serving(target, model, train)
        return train.workload.of_step(decode=est.time_per_output_token_s, prefill=est.time_to_first_token_s)

    return Case(kind=str(train.workload.kind), name=name, shape=shape, dtype=train.compute_dtype.value, predict=predict,
                measure=lambda: _measure(model, train))


def decode_cases(target: Target, sizes: Sizes) -> list[Case]:
    """One decode step per (batch, context)."""
    model = sizes.decode_model
    return [_case(target, model, decode_train(target, b, ctx), name=f"{model.name} decode b{b} ctx{ctx}", shape=f"b{b} ctx{ctx}")
            for b, ctx in sizes.decode_cases]


def prefill_cases(target: Target, sizes: Sizes) -> list[Case]:
    """One prefill per (batch, prompt), the context the prompt itself."""
    model = sizes.decode_model
    return [_case(target, model, TrainConfig(workload="prefill", global_batch=b, seq_len=p, inference={"prompt_len": p})
                  .with_precision(target.precision), name=f"{model.name} prefill b{b} p{p}", shape=f"b{b} prompt{p}")
            for b, p in sizes.prefill_cases]
