"""The reference training step: loss, gradients and an AdamW update, mixed precision.

fp32 master parameters and optimizer moments, bf16 compute (weights cast on use, or a bf16 copy
of them beside the master, `with_master`), fp32 logits and loss. `make_train_step` gives a
function of ``(params, opt_state, batch)`` for ``jax.jit``; `abstract_train_inputs` gives its
inputs as ``jax.ShapeDtypeStruct``s at any size without allocating.

LoRA fine-tuning (``--workload finetune-lora``, `costmodel.workloads.lora`): the step is a function of
``(frozen, adapters, opt_state, batch)`` returning ``(adapters, opt_state, metrics)``. Only
the adapters are differentiated and have AdamW state; the frozen base weights
(`planner.programs.lora.abstract_frozen`: compute dtype, or int8/int4 layer weights) are an
argument that is read, never updated.

>>> import jax
>>> from costmodel.inputs.model_config import ModelConfig
>>> cfg = ModelConfig(name="t", hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, vocab_size=50)
>>> train = TrainConfig(seq_len=8, global_batch=2)
>>> params, opt_state, batch = abstract_train_inputs(cfg, train)
>>> out = jax.eval_shape(make_train_step(cfg, train), params, opt_state, batch)
>>> out[2]["loss"].shape
()
>>> lora = TrainConfig(seq_len=8, global_batch=2, workload="finetune-lora")
>>> frozen, adapters, opt_state, batch = abstract_train_inputs(cfg, lora)
>>> out = jax.eval_shape(make_train_step(cfg, lora), frozen, adapters, opt_state, batch)
>>> out[0]["layers"]["attn"]["wq_lora_b"].shape, opt_state["m"]["layers"]["attn"]["wq_lora_a"].shape
((2, 16, 4, 8), (2, 32, 16))
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp

from costmodel.errors import UnsupportedError
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import AdamW, TrainConfig
from planner.programs.attention import varying_like
from planner.programs.fp8_linear import fp8_linear
from planner.programs.lora import abstract_adapters, abstract_frozen, merge_adapters
from planner.programs.params import Params, abstract_params
from planner.programs.transformer import Constrain, forward_hidden, head

# Weight of the MoE load-balancing loss (Switch Transformer, Fedus et al. 2021).
MOE_AUX_LOSS_WEIGHT = 0.01
Batch = dict[str, jax.Array]


def loss_fn(params: Params, batch: Batch, cfg: ModelConfig, *, compute_dtype: Any = jnp.bfloat16, remat: str = "none",
            attention: str = "materialized", hooks: dict[str, Any] | None = None, lora_scale: float = 1.0,
            loss_chunks: int = 1) -> jax.Array:
    """Mean next-token cross-entropy (plus the MoE balancing loss); ``hooks`` are `forward`'s
    ``constrain`` and ``lookup``; ``loss_chunks`` pieces of the sequence go through the head and
    loss one at a time (`chunked_head_loss`)."""
    hooks = hooks or {}
    x_BxSxD, outer, aux = forward_hidden(params, batch["tokens"], cfg, compute_dtype=compute_dtype, remat=remat, attention=attention,
                                         lora_scale=lora_scale, **hooks)
    loss = chunked_head_loss(x_BxSxD, outer, batch["targets"], cfg, chunks=loss_chunks, constrain=hooks.get("constrain"))
    return loss + MOE_AUX_LOSS_WEIGHT * aux


def chunked_head_loss(x_BxSxD: jax.Array, outer: Params, targets_BxS: jax.Array, cfg: ModelConfig, *, chunks: int = 1,
                      constrain: Constrain | None = None) -> jax.Array:
    """Mean cross-entropy of the head's logits for ``x_BxSxD`` against ``targets_BxS``. With
    ``chunks`` > 1 the sequence is cut into that many pieces that go through the head and the
    loss one after another, each under ``jax.checkpoint``: one piece's fp32 logits exist at a
    time, and the backward forms each piece's again (Liger-Kernel's fused linear cross-entropy
    and torchtune's chunked output loss keep the same buffer to a piece).

    >>> from planner.programs.params import init_params
    >>> cfg = ModelConfig(name="t", hidden_size=8, num_layers=1, num_heads=2, ffn_size=16, vocab_size=50)
    >>> p = init_params(cfg, jax.random.key(0))
    >>> x, t = jax.random.normal(jax.random.key(1), (2, 8, 8)), jnp.ones((2, 8), jnp.int32)
    >>> bool(jnp.allclose(chunked_head_loss(x, p, t, cfg, chunks=4), chunked_head_loss(x, p, t, cfg)))
    True
    """
    pins = {"constrain": constrain} if constrain else {}
    if chunks == 1:
        return cross_entropy(head(x_BxSxD, outer, cfg, **pins), targets_BxS)
    b, s, d = x_BxSxD.shape
    if s % chunks:
        raise UnsupportedError(f"{s} tokens a sequence do not split into {chunks} loss chunks",
                               fix="give --cross-entropy-chunks a divisor of the sequence length")
    piece = s // chunks

    @jax.checkpoint
    def piece_loss(x_BxCxD: jax.Array, targets_BxC: jax.Array) -> jax.Array:
        return cross_entropy(head(x_BxCxD, outer, cfg, **pins), targets_BxC) / chunks

    def add(total: jax.Array, xs: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
        return total + piece_loss(*xs), None

    x_NxBxCxD = jnp.moveaxis(x_BxSxD.reshape(b, chunks, piece, d), 1, 0)
    targets_NxBxC = jnp.moveaxis(targets_BxS.reshape(b, chunks, piece), 1, 0)
    (total,) = varying_like((x_BxSxD,), (jnp.zeros((), jnp.float32),))
    total, _ = jax.lax.scan(add, total, (x_NxBxCxD, targets_NxBxC))
    return total


@jax.custom_vjp
def cross_entropy(logits_BxSxV: jax.Array, targets_BxS: jax.Array) -> jax.Array:
    """Mean next-token negative log-likelihood.

    >>> logits = jnp.log(jnp.array([[[0.25, 0.75]]]))
    >>> round(float(cross_entropy(logits, jnp.array([[1]]))), 4), jax.grad(cross_entropy)(logits, jnp.array([[1]])).tolist()
    (0.2877, [[[0.25, -0.25]]])
    """
    return _cross_entropy_forward(logits_BxSxV, targets_BxS)[0]


def _cross_entropy_forward(logits_BxSxV: jax.Array, targets_BxS: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    with jax.named_scope("loss"):
        # The target's logit is a masked sum over the vocabulary, as Megatron's vocab-parallel
        # loss takes it: a gather there made XLA abort on a vocabulary-split head inside the
        # pipeline's region manual over its axis (`validate.gpipe`).
        lse_BxS = jax.nn.logsumexp(logits_BxSxV, axis=-1)
        target_BxS = jnp.where(_is_target(logits_BxSxV, targets_BxS), logits_BxSxV, 0.0).sum(-1)
        return (lse_BxS - target_BxS).mean(), (logits_BxSxV, lse_BxS, targets_BxS)


def _cross_entropy_backward(residuals: tuple[jax.Array, ...], g: jax.Array) -> tuple[jax.Array, None]:
    # One elementwise pass from the saved logits and log-sum-exp to their gradient, as fused
    # cross-entropy kernels do: the logits and their gradient are the loss's only
    # vocabulary-sized buffers (automatic differentiation also kept the softmax's exponentials).
    logits_BxSxV, lse_BxS, targets_BxS = residuals
    with jax.named_scope("loss"):
        softmax_BxSxV = jnp.exp(logits_BxSxV - lse_BxS[..., None])
        grad_BxSxV = (softmax_BxSxV - _is_target(logits_BxSxV, targets_BxS)) * (g / lse_BxS.size)
        return grad_BxSxV.astype(logits_BxSxV.dtype), None


def _is_target(logits_BxSxV: jax.Array, targets_BxS: jax.Array) -> jax.Array:
    return jnp.arange(logits_BxSxV.shape[-1]) == targets_BxS[..., None]


cross_entropy.defvjp(_cross_entropy_forward, _cross_entropy_backward)


def init_opt_state(params: Params, dtype: Any = jnp.float32) -> dict[str, Any]:
    """AdamW state: first and second moments in ``dtype`` (fp32; bf16 for pure-bf16 training) and the step count."""
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, dtype), params)
    return {"m": zeros, "v": jax.tree.map(jnp.copy, zeros), "step": jnp.zeros((), jnp.int32)}


def with_master(opt_state: dict[str, Any], master: Params) -> dict[str, Any]:
    """AdamW state that also holds the fp32 master weights, the step's parameters being their
    compute-dtype copy (`adamw_update`; Megatron's distributed optimizer, ZeRO 1–2)."""
    return {**opt_state, "master": master}


def adamw_update(params: Params, grads: Params, opt_state: dict[str, Any], opt: AdamW) -> tuple[Params, dict[str, Any]]:
    """Bias-corrected AdamW (`adamw_apply`) on every parameter, the step count advanced. Where the
    state holds the master weights (`with_master`) the update steps them and ``params`` become
    their copy in ``params``' dtype.

    >>> p = {"w": jnp.ones((2,), jnp.bfloat16)}
    >>> state = with_master(init_opt_state(p), {"w": jnp.ones((2,))})
    >>> new, state = adamw_update(p, {"w": jnp.ones((2,))}, state, AdamW(weight_decay=0.0, learning_rate=1e-3))
    >>> new["w"].dtype, round(float(state["master"]["w"][0]), 6)
    (dtype(bfloat16), 0.999)
    """
    step = opt_state["step"] + 1
    if "master" not in opt_state:
        params, m, v = adamw_apply(params, grads, opt_state["m"], opt_state["v"], step, opt)
        return params, {"m": m, "v": v, "step": step}
    master, m, v = adamw_apply(opt_state["master"], grads, opt_state["m"], opt_state["v"], step, opt)
    return jax.tree.map(lambda p, w: w.astype(p.dtype), params, master), {"m": m, "v": v, "step": step, "master": master}


def adamw_apply(params: Params, grads: Params, m: Params, v: Params, step: jax.Array, opt: AdamW) -> tuple[Params, Params, Params]:
    """The ``step``-th bias-corrected AdamW update of ``params`` and their moments ``m`` and ``v``
    (any subtree: one layer's, the head's); decoupled weight decay on matrices only (not norms or
    biases). The arithmetic runs in fp32 and each result is stored back in its own dtype (the
    moments' and the parameters': bf16 in pure-bf16 training).

    >>> p, g = {"w": jnp.ones((2, 2))}, {"w": jnp.ones((2, 2))}
    >>> new, m, v = adamw_apply(p, g, *(jax.tree.map(jnp.zeros_like, p),) * 2, jnp.ones((), jnp.int32), AdamW(weight_decay=0.0))
    >>> round(float(new["w"][0, 0]), 6), round(float(m["w"][0, 0]), 6)  # the first step moves each weight by the learning rate
    (0.9997, 0.1)
    """
    def f32(x: jax.Array) -> jax.Array:
        return x.astype(jnp.float32)

    m = jax.tree.map(lambda m, g: (opt.beta1 * f32(m) + (1 - opt.beta1) * f32(g)).astype(m.dtype), m, grads)
    v = jax.tree.map(lambda v, g: (opt.beta2 * f32(v) + (1 - opt.beta2) * f32(g) * f32(g)).astype(v.dtype), v, grads)
    m_scale = 1 / (1 - opt.beta1 ** step.astype(jnp.float32))
    v_scale = 1 / (1 - opt.beta2 ** step.astype(jnp.float32))

    def update(path: tuple[Any, ...], p: jax.Array, m: jax.Array, v: jax.Array) -> jax.Array:
        delta = f32(m) * m_scale / (jnp.sqrt(f32(v) * v_scale) + opt.eps)
        if _decays(path):
            delta = delta + opt.weight_decay * f32(p)
        return (f32(p) - opt.learning_rate * delta).astype(p.dtype)

    return jax.tree_util.tree_map_with_path(update, params, m, v), m, v


def _decays(path: tuple[Any, ...]) -> bool:
    """Weight matrices and embeddings decay; norm scales and biases (names 'scale', 'b…') do not."""
    name = str(path[-1].key)
    return name != "scale" and not name.startswith("b")


def micro_batched(batch: Batch, micro_batches: int) -> Batch:
    """``batch`` cut into ``micro_batches`` along a new leading axis, the micro-batch index minor
    within each sequence block, so a batch split over data devices stays split the same way:
    no data moves between them."""
    return {k: jnp.moveaxis(v.reshape(v.shape[0] // micro_batches, micro_batches, *v.shape[1:]), 1, 0) for k, v in batch.items()}


def make_value_and_grad(cfg: ModelConfig, train: TrainConfig, *, remat: str = "none", attention: str = "materialized",
                        hooks: dict[str, Any] | None = None, loss_chunks: int = 1) -> Callable[..., tuple[jax.Array, Params]]:
    """``(params, batch, frozen) -> (mean loss, gradients)`` of one (micro-)batch; under LoRA
    ``params`` are the adapters and ``frozen`` the weights they adapt (None otherwise)."""
    compute_dtype = jnp.dtype(train.compute_dtype.value)
    lora_scale = train.workload.adapter_scale
    if train.is_fp8:  # the dense layers' projections in fp8 (`planner.programs.fp8_linear`)
        hooks = {**(hooks or {}), "linear": fp8_linear}
    loss = partial(loss_fn, attention=attention, hooks=hooks, lora_scale=lora_scale, loss_chunks=loss_chunks)

    def trained_loss(params: Params, batch: Batch, frozen: Params | None) -> jax.Array:
        # Under LoRA ``params`` are the adapters, merged beside the frozen weights they adapt.
        merged = params if frozen is None else merge_adapters(frozen, params)
        return loss(merged, batch, cfg, compute_dtype=compute_dtype, remat=remat)

    return jax.value_and_grad(trained_loss)


def make_loss_and_grads(cfg: ModelConfig, train: TrainConfig, *, remat: str = "none", micro_batches: int = 1,
                        attention: str = "materialized", hooks: dict[str, Any] | None = None, loss_chunks: int = 1) -> Callable[..., Any]:
    """A function ``(params, batch) -> (mean loss, fp32 gradients)``; under LoRA
    ``(adapters, batch, frozen) -> (mean loss, the adapters' fp32 gradients)``.

    With ``micro_batches`` > 1 the batch is cut into that many micro-batches whose
    gradients accumulate in fp32 under a ``lax.scan`` (gradient accumulation), so only one
    micro-batch's activations are live at a time. ``attention`` is `forward`'s kernel;
    ``hooks`` go to `forward` (sharding constraints, the embedding lookup).
    """
    value_and_grad = make_value_and_grad(cfg, train, remat=remat, attention=attention, hooks=hooks, loss_chunks=loss_chunks)

    def loss_and_grads(params: Params, batch: Batch, frozen: Params | None = None) -> tuple[jax.Array, Params]:
        if micro_batches == 1:
            return value_and_grad(params, batch, frozen)

        def accumulate(carry: tuple[jax.Array, Params], mb: Batch) -> tuple[tuple[jax.Array, Params], None]:
            loss, grads = value_and_grad(params, mb, frozen)
            return (carry[0] + loss, jax.tree.map(jnp.add, carry[1], grads)), None

        zeros = (jnp.zeros((), jnp.float32), jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params))
        (loss, grads), _ = jax.lax.scan(accumulate, zeros, micro_batched(batch, micro_batches))
        return loss / micro_batches, jax.tree.map(lambda g: g / micro_batches, grads)

    return loss_and_grads


def make_train_step(cfg: ModelConfig, train: TrainConfig, *, remat: str = "none", micro_batches: int = 1,
                    attention: str = "materialized") -> Callable[..., Any]:
    """A function ``(params, opt_state, batch) -> (params, opt_state, {"loss": ...})``: loss and
    gradients by `make_loss_and_grads`, then the AdamW update."""
    loss_and_grads = make_loss_and_grads(cfg, train, remat=remat, micro_batches=micro_batches, attention=attention)
    if not train.workload.trains_base_weights:  # adapters train over frozen weights, which come first
        def lora_step(frozen: Params, adapters: Params, opt_state: dict[str, Any],
                      batch: Batch) -> tuple[Params, dict[str, Any], dict[str, jax.Array]]:
            loss, grads = loss_and_grads(adapters, batch, frozen)
            with jax.named_scope("optimizer"):
                adapters, opt_state = adamw_update(adapters, grads, opt_state, train.optimizer)
            return adapters, opt_state, {"loss": loss}

        return lora_step

    def train_step(params: Params, opt_state: dict[str, Any], batch: Batch) -> tuple[Params, dict[str, Any], dict[str, jax.Array]]:
        loss, grads = loss_and_grads(params, batch)
        with jax.named_scope("optimizer"):
            params, opt_state = adamw_update(params, grads, opt_state, train.optimizer)
        return params, opt_state, {"loss": loss}

    return train_step


def abstract_train_inputs(cfg: ModelConfig, train: TrainConfig, *, micro_batch: int | None = None,
                          compute_copy: bool = False) -> tuple[Any, ...]:
    """``(params, opt_state, batch)`` as ``jax.ShapeDtypeStruct`` trees, allocating nothing;
    under LoRA ``(frozen, adapters, opt_state, batch)``. With ``compute_copy`` the parameters are in
    the compute dtype and the optimizer state holds the master weights (`with_master`)."""
    tokens = jax.ShapeDtypeStruct((micro_batch or train.global_batch, train.seq_len), jnp.int32)
    batch = {"tokens": tokens, "targets": tokens}
    if not train.workload.trains_base_weights:
        adapters = abstract_adapters(cfg, train.workload.lora, dtype=jnp.dtype(train.param_dtype.value))
        return abstract_frozen(cfg, train), adapters, jax.eval_shape(init_opt_state, adapters), batch
    master = abstract_params(cfg, dtype=jnp.dtype(train.param_dtype.value))
    opt_state = jax.eval_shape(lambda p: init_opt_state(p, jnp.dtype(train.optimizer_dtype.value)), master)
    if not compute_copy:
        return master, opt_state, batch
    return abstract_params(cfg, dtype=jnp.dtype(train.compute_dtype.value)), with_master(opt_state, master), batch
