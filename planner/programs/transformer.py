"""The reference decoder-only transformer in plain ``jax.numpy``.

One code path covers the GPT-2 family (learned positions, LayerNorm, GELU, biases, tied
embeddings), the Llama family (RoPE, RMSNorm, SwiGLU, grouped-query attention) and
mixture-of-experts layers (softmax router, top-k, capacity-based dispatch per sequence,
optional shared expert). Layers run under ``jax.lax.scan`` over stacked parameters, so
tracing cost does not depend on depth. Weights are stored in fp32 and cast to the compute
dtype on use; softmaxes and logits are fp32.

>>> import jax, jax.numpy as jnp
>>> from costmodel.inputs.model_config import ModelConfig
>>> from planner.programs.params import init_params
>>> cfg = ModelConfig(name="t", hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, vocab_size=50)
>>> logits_BxSxV, aux = forward(init_params(cfg, jax.random.key(0)), jnp.zeros((2, 8), jnp.int32), cfg)
>>> logits_BxSxV.shape, logits_BxSxV.dtype  # the 50-token vocabulary padded to 128 columns
((2, 8, 128), dtype('float32'))
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from costmodel.errors import UnsupportedError
from costmodel.inputs.model_config import MlpKind, ModelConfig, Norm, Positions
from costmodel.inputs.stack import STACKS
from planner.programs.attention import flash_attention
from planner.programs.params import Params

Constrain = Callable[[str, jax.Array], jax.Array]
Lookup = Callable[[jax.Array, jax.Array], jax.Array]
# Wraps the experts' computation (dispatch gather, expert MLPs, weighting, combine), whose
# arguments are ``(h_BxSxD, token_BxExC, weight_BxExC, w_in_ExDxF, w_gate_ExDxF | None, w_out_ExFxD)``.
Experts = Callable[[Callable[..., jax.Array]], Callable[..., jax.Array]]
# Wraps the checkpointed layer, choosing how its backward keeps residuals (`planner.programs.residuals`).
KeepResiduals = Callable[[Callable[..., Any]], Callable[..., Any]]
Linear = Callable[[str, jax.Array, jax.Array, Any], jax.Array]  # (einsum equation, x, w, result dtype) -> x·w
# Makes the weights a computation reads from those it holds: ``("layers", one layer's)`` inside
# the checkpointed layer, ``("outer", the rest)`` once per forward (the validator gathers ZeRO-3's shards).
Weights = Callable[[str, Params], Params]
ATTENTION_KERNELS = ("materialized", "flash")
# The logit of a padded vocabulary entry (`mask_padded_logits`): finite, so that no ``-inf``
# meets a zero (``0 · -inf`` is NaN), and far enough below any real logit that ``exp`` gives 0.
PADDED_LOGIT = -1e30
# Tokens an expert accepts beyond its even share (GShard / Switch Transformer practice): the
# jax stack's fact, which the cost model reads too.
MOE_CAPACITY_FACTOR = STACKS["jax"].moe_capacity_factor
# What a layer keeps for its backward, by name (`jax.ad_checkpoint.checkpoint_name` below):
# the tensors Megatron-LM's fused kernels keep (`costmodel.step.activations`), each once, in the
# compute dtype. Norm internals, activation functions, rotary embeddings and weight casts
# are recomputed in the backward, as fused kernels do, rather than kept in fp32.
SAVED = ("attn_norm_input", "qkv_input", "q", "k", "v", "softmax_output", "softmax_logsumexp", "attn_out_proj_input",
         "mlp_norm_input", "mlp_input", "mlp_up_output", "mlp_gate_output", "mlp_down_input", "expert_inputs", "router_probs",
         "shared_expert", "lora_down_output")
# Checkpoint policies by `--recompute` mode (`run_layers`).
REMAT_POLICIES = {
    "none": jax.checkpoint_policies.save_only_these_names(*SAVED),
    "full": jax.checkpoint_policies.nothing_saveable,
    # Megatron's selective recompute: keep everything but the attention core (the score matrix;
    # the flash kernel runs again, as its log-sum-exp is not kept).
    "selective": jax.checkpoint_policies.save_only_these_names(*(n for n in SAVED if n not in ("softmax_output", "softmax_logsumexp"))),
}


def _norm(x_BxSxD: jax.Array, p: Params, cfg: ModelConfig) -> jax.Array:
    x = x_BxSxD.astype(jnp.float32)
    if cfg.norm is Norm.LAYERNORM:
        x = x - x.mean(-1, keepdims=True)
    y = x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * p["scale"]
    if "bias" in p:
        y = y + p["bias"]
    return y.astype(x_BxSxD.dtype)


def _rope(x_BxSxNxH: jax.Array, theta: float) -> jax.Array:
    s, h = x_BxSxNxH.shape[1], x_BxSxNxH.shape[-1]
    freq_H2 = theta ** (-jnp.arange(0, h, 2, dtype=jnp.float32) / h)
    angle_SxH2 = jnp.arange(s, dtype=jnp.float32)[:, None] * freq_H2[None, :]
    cos, sin = jnp.cos(angle_SxH2)[None, :, None, :], jnp.sin(angle_SxH2)[None, :, None, :]
    x1, x2 = jnp.split(x_BxSxNxH.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x_BxSxNxH.dtype)


def _keep(name: str, x: jax.Array) -> jax.Array:
    return x


def _held(kind: str, params: Params) -> Params:
    return params


def _run(fn: Callable[..., Any]) -> Callable[..., Any]:
    return fn


def _take(table_VxD: jax.Array, tokens_BxS: jax.Array) -> jax.Array:
    return jnp.take(table_VxD, tokens_BxS, axis=0)


def _einsum_linear(equation: str, x: jax.Array, w: jax.Array, dt: Any) -> jax.Array:
    return jnp.einsum(equation, x, w)


def _project(equation: str, x: jax.Array, p: Params, name: str, dt: Any, lora_scale: float,
             linear: Linear = _einsum_linear) -> jax.Array:
    """``x·W`` for the weight ``p[name]`` (``equation`` as for ``jnp.einsum``, computed by
    ``linear``), plus its LoRA adapter's ``(x·A)·B · lora_scale`` where the layer has one
    (`planner.programs.lora`)."""
    y = linear(equation, x, p[name].astype(dt), dt)
    if f"{name}_lora_a" not in p:
        return y
    operands, out = equation.split("->")
    x_letters, w_letters = operands.split(",")
    rows = "".join(c for c in x_letters if c not in w_letters)  # x's dims the weight does not contract
    w_out = "".join(c for c in w_letters if c not in x_letters)
    # The rank's letter: one the equation does not use.
    r = next(c for c in "rqpoz" if c not in equation)
    down = jnp.einsum(f"{x_letters},{w_letters.replace(w_out, '')}{r}->{rows}{r}", x, p[f"{name}_lora_a"].astype(dt))
    down = checkpoint_name(down * jnp.asarray(lora_scale, dt), "lora_down_output")
    return y + jnp.einsum(f"{rows}{r},{r}{w_out}->{out}", down, p[f"{name}_lora_b"].astype(dt))


def _gathered_gradient(constrain: Constrain, y_BxSxD: jax.Array) -> jax.Array:
    """``y_BxSxD`` (a row-parallel matmul's output), its gradient pinned to ``row_output_grad_BxSxD``:
    under sequence parallelism that gathers it over the sequence once, for both the matmul's input
    gradient and its weight gradient (left free, XLA's partitioner gathered it once for each where
    the step runs per data replica, `validate.data_parallel_region`; under ZeRO 3 full recompute and
    the backward then also share the attention output projection's gathered weight)."""
    @jax.custom_vjp
    def pinned(y_BxSxD: jax.Array) -> jax.Array:
        return y_BxSxD

    pinned.defvjp(lambda y_BxSxD: (y_BxSxD, None), lambda _, g_BxSxD: (constrain("row_output_grad_BxSxD", g_BxSxD),))
    return pinned(y_BxSxD)


def _qkv(x_BxSxD: jax.Array, p: Params, cfg: ModelConfig, dt: Any, constrain: Constrain, lora_scale: float = 1.0,
         linear: Linear = _einsum_linear) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Queries grouped by the kv head they share ``[B, S, K, G, H]``, keys and values ``[B, S, K, H]``,
    biased and rotated: what attention (and a KV cache) takes."""
    b, s, _ = x_BxSxD.shape
    x_BxSxD = checkpoint_name(x_BxSxD, "qkv_input")
    q_BxSxNxH = constrain("attention_heads_BxSxNxH", _project("bsd,dnh->bsnh", x_BxSxD, p, "wq", dt, lora_scale, linear))
    k_BxSxKxH = constrain("kv_heads_BxSxKxH", _project("bsd,dkh->bskh", x_BxSxD, p, "wk", dt, lora_scale, linear))
    v_BxSxKxH = constrain("kv_heads_BxSxKxH", _project("bsd,dkh->bskh", x_BxSxD, p, "wv", dt, lora_scale, linear))
    if "bq" in p:
        q_BxSxNxH, k_BxSxKxH, v_BxSxKxH = q_BxSxNxH + p["bq"].astype(dt), k_BxSxKxH + p["bk"].astype(dt), v_BxSxKxH + p["bv"].astype(dt)
    if cfg.positions is Positions.ROPE:
        q_BxSxNxH, k_BxSxKxH = _rope(q_BxSxNxH, cfg.rope_theta), _rope(k_BxSxKxH, cfg.rope_theta)
    q_BxSxNxH, k_BxSxKxH, v_BxSxKxH = (checkpoint_name(q_BxSxNxH, "q"), checkpoint_name(k_BxSxKxH, "k"),
                                       checkpoint_name(v_BxSxKxH, "v"))
    # Grouped-query attention: query heads grouped by the kv head they share, no k/v copies.
    return q_BxSxNxH.reshape(b, s, cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim), k_BxSxKxH, v_BxSxKxH


def _attend_and_project(q_BxSxKxGxH: jax.Array, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array, p: Params, cfg: ModelConfig, dt: Any,
                        constrain: Constrain, kernel: str = "materialized", lora_scale: float = 1.0,
                        linear: Linear = _einsum_linear) -> jax.Array:
    """Causal attention of ``_qkv``'s outputs with ``kernel``, then the output projection ``[B, S, D]``."""
    b, s = q_BxSxKxGxH.shape[:2]
    if kernel == "flash":  # keeps its own output (`planner.programs.attention`): one copy, not a second reshaped one
        out_BxSxKxGxH = flash_attention(q_BxSxKxGxH, k_BxSxKxH, v_BxSxKxH)
    else:
        out_BxSxKxGxH = checkpoint_name(_materialized(q_BxSxKxGxH, k_BxSxKxH, v_BxSxKxH, cfg, dt, constrain), "attn_out_proj_input")
    out_BxSxNxH = constrain("attention_heads_BxSxNxH", out_BxSxKxGxH.reshape(b, s, cfg.num_heads, cfg.head_dim))
    y_BxSxD = _gathered_gradient(constrain, _project("bsnh,nhd->bsd", out_BxSxNxH, p, "wo", dt, lora_scale, linear))
    return y_BxSxD + p["bo"].astype(dt) if "bo" in p else y_BxSxD


def _attention(x_BxSxD: jax.Array, p: Params, cfg: ModelConfig, dt: Any, constrain: Constrain, kernel: str = "materialized",
               lora_scale: float = 1.0, linear: Linear = _einsum_linear) -> jax.Array:
    q_BxSxKxGxH, k_BxSxKxH, v_BxSxKxH = _qkv(x_BxSxD, p, cfg, dt, constrain, lora_scale, linear)
    return _attend_and_project(q_BxSxKxGxH, k_BxSxKxH, v_BxSxKxH, p, cfg, dt, constrain, kernel, lora_scale, linear)


def _materialized(q_BxSxKxGxH: jax.Array, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array, cfg: ModelConfig, dt: Any,
                  constrain: Constrain) -> jax.Array:
    """Causal attention through the whole ``S×S`` score matrix (fp32 softmax)."""
    s = q_BxSxKxGxH.shape[1]
    scores_BxKxGxSxS = constrain("scores_BxKxGxSxS", jnp.einsum("bskgh,btkh->bkgst", q_BxSxKxGxH, k_BxSxKxH).astype(jnp.float32))
    causal_SxS = jnp.tril(jnp.ones((s, s), bool))
    scores_BxKxGxSxS = jnp.where(causal_SxS, scores_BxKxGxSxS / math.sqrt(cfg.head_dim), -1e30)
    probs_BxKxGxSxS = checkpoint_name(_softmax_to(scores_BxKxGxSxS, jnp.dtype(dt)), "softmax_output")
    return jnp.einsum("bkgst,btkh->bskgh", probs_BxKxGxSxS, v_BxSxKxH)


@partial(jax.custom_vjp, nondiff_argnums=(1,))
def _softmax_to(scores: jax.Array, dtype: Any) -> jax.Array:
    """Softmax over the last axis in fp32, returned in ``dtype``. Its backward reads that
    ``dtype`` output, as a fused softmax kernel keeps it, not an fp32 copy (which would make
    a recompute policy re-run the scores' matmul to get one)."""
    return jax.nn.softmax(scores, axis=-1).astype(dtype)


def _softmax_to_fwd(scores: jax.Array, dtype: Any) -> tuple[jax.Array, jax.Array]:
    probs = checkpoint_name(_softmax_to(scores, dtype), "softmax_output")
    return probs, probs


def _softmax_to_bwd(dtype: Any, probs: jax.Array, d_probs: jax.Array) -> tuple[jax.Array]:
    y, dy = probs.astype(jnp.float32), d_probs.astype(jnp.float32)
    return (y * (dy - (dy * y).sum(-1, keepdims=True)),)


_softmax_to.defvjp(_softmax_to_fwd, _softmax_to_bwd)


def _activation(h: jax.Array, gate: jax.Array | None, kind: MlpKind) -> jax.Array:
    """The MLP's nonlinearity on the up (and gate) projections; its inputs and output are kept by name."""
    h = checkpoint_name(h, "mlp_up_output")
    gate = None if gate is None else checkpoint_name(gate, "mlp_gate_output")
    if kind is MlpKind.SWIGLU:
        out = jax.nn.silu(gate) * h
    elif kind is MlpKind.GEGLU:
        out = jax.nn.gelu(gate) * h
    else:
        out = jax.nn.relu(h) if kind is MlpKind.RELU else jax.nn.gelu(h)
    return checkpoint_name(out, "mlp_down_input")


def _dense_mlp(x: jax.Array, p: Params, cfg: ModelConfig, dt: Any, prefix: str = "", constrain: Constrain = _keep,
               lora_scale: float = 1.0, linear: Linear = _einsum_linear) -> jax.Array:
    """MLP on any leading shape ``[..., D]`` (also one expert's slice ``[..., C, D]``)."""
    x = checkpoint_name(x, "mlp_input" if not prefix else "shared_expert")
    h = constrain("mlp_hidden_BxSxF", _project("...d,df->...f", x, p, f"{prefix}w_in", dt, lora_scale, linear))
    gate = (constrain("mlp_hidden_BxSxF", _project("...d,df->...f", x, p, f"{prefix}w_gate", dt, lora_scale, linear))
            if cfg.mlp.gated else None)
    if "b_in" in p and not prefix:
        h = h + p["b_in"].astype(dt)
        gate = gate + p["b_gate"].astype(dt) if gate is not None else None
    y = _gathered_gradient(constrain, _project("...f,fd->...d", _activation(h, gate, cfg.mlp), p, f"{prefix}w_out", dt, lora_scale, linear))
    return y + p["b_out"].astype(dt) if "b_out" in p and not prefix else y


def moe_capacity(cfg: ModelConfig, seq_len: int) -> int:
    """Slots each expert's buffer has per sequence: `MOE_CAPACITY_FACTOR` times its even share.

    >>> moe_capacity(ModelConfig(name="m", hidden_size=8, num_layers=1, num_heads=1, ffn_size=8, vocab_size=8,
    ...                          num_experts=8, experts_per_token=2), 4096)
    1280
    """
    return cfg.expert_slots(seq_len, MOE_CAPACITY_FACTOR) // cfg.num_experts


def _top_k(x_BxSxE: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """``jax.lax.top_k`` over the last axis as k argmax passes: XLA partitions an argmax with
    the batch, while it replicates a TopK (an all-gather of the router's probabilities)."""
    values, indices = [], []
    for _ in range(k):
        index_BxS = jnp.argmax(x_BxSxE, axis=-1)
        values.append(jnp.take_along_axis(x_BxSxE, index_BxS[..., None], axis=-1)[..., 0])
        indices.append(index_BxS)
        x_BxSxE = jnp.where(jax.nn.one_hot(index_BxS, x_BxSxE.shape[-1], dtype=bool), -jnp.inf, x_BxSxE)
    return jnp.stack(values, -1), jnp.stack(indices, -1).astype(jnp.int32)


def _experts(x_BxSxD: jax.Array, token_BxExC: jax.Array, weight_BxExC: jax.Array, w_in_ExDxF: jax.Array,
             w_gate_ExDxF: jax.Array | None, w_out_ExFxD: jax.Array, *, mlp: MlpKind,
             to_experts: Callable[[jax.Array], jax.Array] = _run,
             from_experts: Callable[[jax.Array], jax.Array] = _run) -> jax.Array:
    """Each expert's MLP on the tokens dispatched to it, weighted and added back in place; the
    weights (as stored) are cast to the tokens' dtype here. Under expert parallelism
    ``to_experts`` hands each ``[B, E, ...]`` dispatch buffer to the devices holding its experts
    (an all-to-all from batch-split to expert-split) and ``from_experts`` hands the outputs back."""
    dt = x_BxSxD.dtype
    x_BxExCxD = to_experts(jax.vmap(lambda x_SxD, token_ExC: x_SxD[token_ExC])(x_BxSxD, token_BxExC))
    x_BxExCxD, weight_BxExC = checkpoint_name(x_BxExCxD, "expert_inputs"), to_experts(weight_BxExC)
    h_BxExCxF = jnp.einsum("becd,edf->becf", x_BxExCxD, w_in_ExDxF.astype(dt))
    gate = jnp.einsum("becd,edf->becf", x_BxExCxD, w_gate_ExDxF.astype(dt)) if w_gate_ExDxF is not None else None
    # Weighted before the down projection (the same product): the weights' gradient then needs
    # only the kept activation, not the projection's output, which would be recomputed.
    y_BxExCxD = jnp.einsum("becf,efd->becd", _activation(h_BxExCxF, gate, mlp) * weight_BxExC[..., None], w_out_ExFxD.astype(dt))
    y_BxExCxD = from_experts(y_BxExCxD)
    s, d = x_BxSxD.shape[1:]
    return jax.vmap(lambda token_ExC, y_ExCxD: jnp.zeros((s, d), y_ExCxD.dtype).at[token_ExC].add(y_ExCxD))(token_BxExC, y_BxExCxD)


def _moe(x_BxSxD: jax.Array, p: Params, cfg: ModelConfig, dt: Any, experts: Experts = _run) -> tuple[jax.Array, jax.Array]:
    """Top-k routed experts with per-sequence capacity; returns output and load-balance loss."""
    b, s, d = x_BxSxD.shape
    e, k = cfg.num_experts, cfg.experts_per_token
    capacity = moe_capacity(cfg, s)
    logits_BxSxE = jnp.einsum("bsd,de->bse", x_BxSxD, p["router"].astype(dt)).astype(jnp.float32)
    probs_BxSxE = checkpoint_name(jax.nn.softmax(logits_BxSxE, axis=-1), "router_probs")
    top_w_BxSxK, top_e_BxSxK = _top_k(probs_BxSxE, k)
    top_w_BxSxK = top_w_BxSxK / top_w_BxSxK.sum(-1, keepdims=True)
    # Slot of each (token, choice) in its expert's buffer, in token order; past capacity it drops.
    onehot_BxTxE = jax.nn.one_hot(top_e_BxSxK.reshape(b, s * k), e, dtype=jnp.int32)
    slot_BxT = (jnp.cumsum(onehot_BxTxE, axis=1) * onehot_BxTxE).sum(-1) - 1
    expert_BxT = top_e_BxSxK.reshape(b, s * k)
    token_BxT = jnp.broadcast_to(jnp.repeat(jnp.arange(s), k), (b, s * k))
    # Per sequence under vmap, so the gathers and scatters carry the batch as a batching
    # dimension: XLA then splits them with the batch instead of replicating them (with an
    # all-gather of the MoE input and an all-reduce of its output).
    to_slots = jax.vmap(lambda expert_T, slot_T, value_T: jnp.zeros((e, capacity), value_T.dtype).at[expert_T, slot_T].set(
        value_T, mode="drop"))
    token_BxExC = to_slots(expert_BxT, slot_BxT, token_BxT)
    weight_BxExC = to_slots(expert_BxT, slot_BxT, top_w_BxSxK.reshape(b, s * k))
    out_BxSxD = experts(partial(_experts, mlp=cfg.mlp))(x_BxSxD, token_BxExC, weight_BxExC.astype(dt), p["w_in"],
                                                         p.get("w_gate"), p["w_out"])
    if "shared_w_in" in p:
        gate_BxSx1 = jax.nn.sigmoid(jnp.einsum("bsd,do->bso", x_BxSxD, p["shared_gate"].astype(dt)))
        out_BxSxD = out_BxSxD + gate_BxSx1 * _dense_mlp(x_BxSxD, p, cfg, dt, prefix="shared_")
    # Switch-Transformer load balancing: E · Σ_e (share of routed tokens) · (mean router prob).
    share_E = onehot_BxTxE.mean(axis=(0, 1)).astype(jnp.float32)
    aux = e * jnp.sum(share_E * probs_BxSxE.mean(axis=(0, 1)))
    return out_BxSxD, aux


def _layer(x_BxSxD: jax.Array, p: Params, cfg: ModelConfig, dt: Any, constrain: Constrain = _keep,
           attention: str = "materialized", experts: Experts = _run, lora_scale: float = 1.0,
           linear: Linear = _einsum_linear) -> tuple[jax.Array, jax.Array]:
    with jax.named_scope("attention"):
        x_BxSxD = checkpoint_name(x_BxSxD, "attn_norm_input")
        attended_BxSxD = _attention(_norm(x_BxSxD, p["attn_norm"], cfg), p["attn"], cfg, dt, constrain, attention, lora_scale, linear)
        x_BxSxD = checkpoint_name(constrain("residual_BxSxD", x_BxSxD + attended_BxSxD), "mlp_norm_input")
    h_BxSxD = _norm(x_BxSxD, p["mlp_norm"], cfg)
    if cfg.is_moe:
        with jax.named_scope("moe"):
            y_BxSxD, aux = _moe(h_BxSxD, p["moe"], cfg, dt, experts)
    else:
        with jax.named_scope("mlp"):
            y_BxSxD = _dense_mlp(h_BxSxD, p["mlp"], cfg, dt, constrain=constrain, lora_scale=lora_scale, linear=linear)
            aux = jnp.zeros((), jnp.float32)
    return constrain("residual_BxSxD", x_BxSxD + y_BxSxD), aux


def forward(
    params: Params, tokens_BxS: jax.Array, cfg: ModelConfig, *, compute_dtype: Any = jnp.bfloat16, remat: str = "none",
    constrain: Constrain = _keep, lookup: Lookup = _take, attention: str = "materialized", experts: Experts = _run,
    lora_scale: float = 1.0, keep_residuals: KeepResiduals = _run, linear: Linear = _einsum_linear, weights: Weights = _held,
) -> tuple[jax.Array, jax.Array]:
    """Logits ``[B, S, V]`` (fp32) and the mean MoE load-balancing loss (0 for dense models).

    ``remat`` is the activation recompute policy: "none", "full" or "selective".
    ``attention`` is the kernel: "materialized" (the ``S×S`` scores) or "flash"
    (`planner.programs.attention`).
    ``constrain(name, x)`` may pin the sharding of the named activations (``residual_BxSxD``,
    ``attention_heads_BxSxNxH``, ``kv_heads_BxSxKxH``, ``scores_BxKxGxSxS``, ``mlp_hidden_BxSxF``,
    ``logits_BxSxV``);
    the validator passes ``jax.lax.with_sharding_constraint`` with the plan's specs.
    ``lookup(table_VxD, tokens_BxS)`` gathers embedding rows (the validator passes a
    vocab-parallel one for a vocabulary-sharded table). ``experts(fn)`` wraps the experts'
    computation of an MoE layer (the validator runs it manual over the tensor axes).
    ``lora_scale`` (alpha / rank) multiplies the LoRA adapters' output where the layers carry
    adapters (`planner.programs.lora`). ``linear(equation, x, w, dtype)`` computes the dense
    layers' projections (`planner.programs.fp8_linear.fp8_linear` for the fp8 recipe; MoE experts and the
    head stay in the compute dtype). ``keep_residuals`` wraps each checkpointed layer (the
    validator passes `planner.programs.residuals.residuals_as_bits` on the CPU backend).
    ``weights(kind, held)`` gives the weights used from those held (`Weights`): under the
    layers' checkpoint, so a layer's are made again for its backward rather than kept.
    """
    x_BxSxD, outer, aux = forward_hidden(params, tokens_BxS, cfg, compute_dtype=compute_dtype, remat=remat, constrain=constrain,
                                         lookup=lookup, attention=attention, experts=experts, lora_scale=lora_scale,
                                         keep_residuals=keep_residuals, linear=linear, weights=weights)
    return head(x_BxSxD, outer, cfg, constrain=constrain), aux


def forward_hidden(
    params: Params, tokens_BxS: jax.Array, cfg: ModelConfig, *, compute_dtype: Any = jnp.bfloat16, remat: str = "none",
    constrain: Constrain = _keep, lookup: Lookup = _take, attention: str = "materialized", experts: Experts = _run,
    lora_scale: float = 1.0, keep_residuals: KeepResiduals = _run, linear: Linear = _einsum_linear, weights: Weights = _held,
) -> tuple[jax.Array, Params, jax.Array]:
    """`forward` up to the head: the last layer's output ``[B, S, D]``, the weights outside the
    layers as used (the head's among them) and the mean MoE load-balancing loss."""
    outer = weights("outer", {k: v for k, v in params.items() if k != "layers"})
    x_BxSxD = embed(outer, tokens_BxS, cfg, compute_dtype=compute_dtype, constrain=constrain, lookup=lookup)
    x_BxSxD, aux_L = run_layers(x_BxSxD, params["layers"], cfg, remat=remat, constrain=constrain, attention=attention, experts=experts,
                                lora_scale=lora_scale, keep_residuals=keep_residuals, linear=linear, weights=weights)
    return x_BxSxD, outer, aux_L.mean()


def embed(params: Params, tokens_BxS: jax.Array, cfg: ModelConfig, *, compute_dtype: Any = jnp.bfloat16,
          constrain: Constrain = _keep, lookup: Lookup = _take) -> jax.Array:
    """Token (and learned position) embeddings in the compute dtype."""
    with jax.named_scope("embed"):
        x_BxSxD = lookup(params["embed"]["tokens"], tokens_BxS).astype(compute_dtype)
        if cfg.positions is Positions.LEARNED:
            # The rows this sequence uses, pinned whole before they meet a sequence-split residual: sliced from a
            # table split like that residual, the partitioner's slice moves rows between the sequence's devices.
            positions_SxD = constrain("positions_SxD", params["embed"]["positions"][: tokens_BxS.shape[1]])
            x_BxSxD = x_BxSxD + positions_SxD.astype(compute_dtype)
        return constrain("residual_BxSxD", x_BxSxD)


def run_layers(x_BxSxD: jax.Array, layers: Params, cfg: ModelConfig, *, remat: str = "none",
               constrain: Constrain = _keep, attention: str = "materialized", experts: Experts = _run,
               lora_scale: float = 1.0, keep_residuals: KeepResiduals = _run,
               linear: Linear = _einsum_linear, weights: Weights = _held) -> tuple[jax.Array, jax.Array]:
    """The stacked layers ``layers`` (leading dim: layers) under ``lax.scan``; returns the
    output and each layer's MoE balancing loss. ``keep_residuals`` wraps the checkpointed layer."""
    if remat not in REMAT_POLICIES:
        raise UnsupportedError(f"remat={remat!r} is not a recompute policy", fix=f"use one of {sorted(REMAT_POLICIES)}")
    body = layer_body(cfg, constrain=constrain, attention=attention, experts=experts, lora_scale=lora_scale, linear=linear,
                      weights=weights)
    return jax.lax.scan(keep_residuals(jax.checkpoint(body, policy=REMAT_POLICIES[remat])), x_BxSxD, layers)


def layer_body(cfg: ModelConfig, *, constrain: Constrain = _keep, attention: str = "materialized", experts: Experts = _run,
               lora_scale: float = 1.0, linear: Linear = _einsum_linear,
               weights: Weights = _held) -> Callable[[jax.Array, Params], tuple[jax.Array, jax.Array]]:
    """One layer as a scan body ``(x_BxSxD, one layer's weights) -> (output, MoE balancing loss)``,
    computing in ``x_BxSxD``'s dtype; the hooks are `forward`'s."""
    if attention not in ATTENTION_KERNELS:
        raise UnsupportedError(f"attention={attention!r} is not an attention kernel", fix=f"use one of {list(ATTENTION_KERNELS)}")

    def body(x_BxSxD: jax.Array, layer_params: Params) -> tuple[jax.Array, jax.Array]:
        with jax.named_scope("layer"):
            return _layer(x_BxSxD, weights("layers", layer_params), cfg, x_BxSxD.dtype, constrain, attention, experts, lora_scale,
                          linear)

    return body


def head(x_BxSxD: jax.Array, params: Params, cfg: ModelConfig, *, constrain: Constrain = _keep) -> jax.Array:
    """Final norm and the vocabulary projection: fp32 logits over the padded vocabulary
    (`ModelConfig.padded_vocab_size`), the padded columns masked (`mask_padded_logits`). On a GPU
    the projection's backward takes a bf16 operand (`vocab_projection`); elsewhere autodiff's."""
    with jax.named_scope("head"):
        h_BxSxD = _norm(constrain("head_input_BxSxD", x_BxSxD), params["final_norm"], cfg)
        w_DxV = params["embed"]["tokens"].T if cfg.tie_embeddings else params["lm_head"]["w"]
        project = vocab_projection if jax.default_backend() == "gpu" else _f32_projection
        logits_BxSxV = constrain("logits_BxSxV", project(h_BxSxD, w_DxV.astype(x_BxSxD.dtype)))
        return mask_padded_logits(logits_BxSxV, cfg.vocab_size)


def _f32_projection(h_BxSxD: jax.Array, w_DxV: jax.Array) -> jax.Array:
    return jnp.einsum("bsd,dv->bsv", h_BxSxD, w_DxV, preferred_element_type=jnp.float32)


@jax.custom_vjp
def vocab_projection(h_BxSxD: jax.Array, w_DxV: jax.Array) -> jax.Array:
    """fp32 logits ``h @ w`` of compute-dtype operands, whose backward products take the logits'
    gradient rounded to the compute dtype (their results fp32, then cast as autodiff casts them).

    Left to autodiff, the fp32 gradient promoted the compute-dtype operands of both backward
    products to fp32, which XLA:GPU runs as TF32 GEMMs at half the bf16 rate: the top kernels of
    the H200 training-step profile of 2026-11-28 (`sm90_xmma_gemm_f32f32_tf32f32`). MaxText and
    Megatron-LM round the logits themselves to bf16; here the forward keeps them fp32 and only the
    backward's operand is rounded. `head` uses it on GPUs only: a TPU runs an fp32 product of
    bf16 operands in bf16 passes at its default precision, and the CPU program is the one the
    validator's predictions of gradient dtypes were read from.

    >>> h, w = jnp.ones((1, 2, 4), jnp.bfloat16), jnp.ones((4, 3), jnp.bfloat16)
    >>> vocab_projection(h, w).dtype, jax.grad(lambda w: vocab_projection(h, w).sum())(w).dtype
    (dtype('float32'), dtype(bfloat16))
    """
    return jnp.einsum("bsd,dv->bsv", h_BxSxD, w_DxV, preferred_element_type=jnp.float32)


def _vocab_projection_fwd(h_BxSxD: jax.Array, w_DxV: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return vocab_projection(h_BxSxD, w_DxV), (h_BxSxD, w_DxV)


def _vocab_projection_bwd(saved: tuple[jax.Array, jax.Array], d_BxSxV: jax.Array) -> tuple[jax.Array, jax.Array]:
    h_BxSxD, w_DxV = saved
    d_BxSxV = d_BxSxV.astype(h_BxSxD.dtype)
    dh_BxSxD = jnp.einsum("bsv,dv->bsd", d_BxSxV, w_DxV, preferred_element_type=jnp.float32)
    dw_DxV = jnp.einsum("bsd,bsv->dv", h_BxSxD, d_BxSxV, preferred_element_type=jnp.float32)
    return dh_BxSxD.astype(h_BxSxD.dtype), dw_DxV.astype(w_DxV.dtype)


vocab_projection.defvjp(_vocab_projection_fwd, _vocab_projection_bwd)


def mask_padded_logits(logits_BxSxV: jax.Array, vocab_size: int) -> jax.Array:
    """Logits with the padding columns (index ``vocab_size`` and above) set to `PADDED_LOGIT`,
    so that the softmax gives them probability 0 and the loss, its gradient and a sampled token
    are those of the unpadded vocabulary; unchanged where nothing is padded. The mask is one
    ``[V]`` row broadcast over the tokens, so it keeps the logits' vocabulary split (an iota of
    the logits' whole shape made XLA's CPU compiler abort on GPT-2 with ZeRO-3 and a
    vocabulary-split tied table: "Invalid binary instruction opcode copy").

    >>> (mask_padded_logits(jnp.zeros((1, 1, 4)), 3) == PADDED_LOGIT).tolist()
    [[[False, False, False, True]]]
    """
    if logits_BxSxV.shape[-1] == vocab_size:
        return logits_BxSxV
    real_V = jnp.arange(logits_BxSxV.shape[-1]) < vocab_size
    return jnp.where(real_V, logits_BxSxV, PADDED_LOGIT)
