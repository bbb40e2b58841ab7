"""What each activation-recompute policy re-runs of a layer's forward in backward.

- ``full``: the whole forward, as Megatron-LM's (reentrant) checkpointing does when
  ``SoftwareStack.reentrant_recompute``. JAX remat, PyTorch's non-reentrant checkpointing and
  torch.compile instead stop at the last tensor backward needs: the MLP's input to its
  down projection. The down projection, its output collective and the residual add that
  end the layer are not re-run (`LAYER_TAIL`).
- ``selective``: Korthikanti et al.'s attention core (scores, softmax, dropout, attention·V).
- ``selective-layer``: torchtitan's per-layer checkpointing, every second layer in full.
- ``selective-op``: torchtitan's per-op checkpointing. It saves the output of every
  attention kernel and every ``mm`` except every second one in forward order (q, k, v, o,
  then the MLP's), and re-runs the rest: the elementwise kernels and k, o and the gated
  MLP's second input projection (`every_second_matmul_share`).

>>> from costmodel.step.kernels import layer_forward_kernels
>>> from costmodel.inputs.model_config import ModelConfig
>>> from costmodel.inputs.train_config import TrainConfig
>>> m = ModelConfig(name="m", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=4096, vocab_size=1000, mlp="gelu")
>>> ks = layer_forward_kernels(m, TrainConfig(seq_len=512), Layout())
>>> [k.name for k in recomputed_kernels(ks, m, Layout(recompute="full")) if k.name.startswith("mlp")]
['mlp_norm', 'mlp_in', 'mlp_activation']
"""

from __future__ import annotations

from costmodel.inputs.layout import Layout, Recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.step.kernels import Kernel, KernelKind

# Kernels that end a layer after the last tensor its backward needs.
LAYER_TAIL = frozenset({"mlp_out", "shared_out", "mlp_residual"})


def every_second_matmul_share(model: ModelConfig) -> float:
    """FLOP share of a dense layer's projections that per-op checkpointing re-runs: the
    2nd, 4th and 6th ``mm`` of q, k, v, o, then the MLP's (k, o, and the gated MLP's
    second input projection or the ungated one's down projection). An MoE layer's routed
    GEMMs are counted as half.

    >>> from costmodel.inputs.model_config import ModelConfig
    >>> llama3_8b = ModelConfig(name="l", hidden_size=4096, num_layers=1, num_heads=32, num_kv_heads=8, ffn_size=14336,
    ...                         vocab_size=8)
    >>> round(every_second_matmul_share(llama3_8b), 3)  # (1024 + 4096 + 14336) / (2·4096 + 2·1024 + 3·14336)
    0.365
    """
    if model.is_moe:
        return 0.5
    q, kv, f = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim, model.ffn_size
    widths = [q, kv, kv, q, *([f] * (3 if model.mlp.gated else 2))]
    return sum(widths[1::2]) / sum(widths)


def recomputed_kernels(kernels: list[Kernel], model: ModelConfig, layout: Layout) -> list[Kernel]:
    """The share of a layer's forward ``kernels`` that ``layout.recompute`` re-runs in backward.

    A stack holding fp32 weights casts them again whatever the policy: no JAX checkpoint
    policy saves the cast copies (they are not named), so the backward's GEMMs re-read
    the fp32 weights through a fresh cast.
    """
    casts = [k for k in kernels if k.name == "weight_cast"]
    return _policy_kernels([k for k in kernels if k.name != "weight_cast"], model, layout) + casts


def _policy_kernels(kernels: list[Kernel], model: ModelConfig, layout: Layout) -> list[Kernel]:
    policy = layout.recompute
    tail = frozenset() if layout.stack.reentrant_recompute else LAYER_TAIL
    if policy in (Recompute.FULL, Recompute.SELECTIVE_LAYER):
        share = 1.0 if policy is Recompute.FULL else 0.5  # every second layer in full
        return [k.scaled(share) for k in kernels if k.name not in tail]
    if policy is Recompute.SELECTIVE:
        return [k for k in kernels if k.in_attention_core]
    if policy is Recompute.SELECTIVE_OP:
        # The share is of all projection FLOPs (the down projection's too), so it scales them alike.
        share = every_second_matmul_share(model)
        return [k.scaled(share) if _is_projection(k) else k for k in kernels
                if k.kind is not KernelKind.FLASH_ATTENTION and (_is_projection(k) or k.name not in tail)]
    return []


def _is_projection(k: Kernel) -> bool:
    return k.kind is KernelKind.MATMUL and not k.in_attention_core


def recomputed_forward_comm_fraction(layout: Layout) -> float:
    """Share of a layer's forward tensor/expert-parallel collectives re-issued by recompute.

    A layer's forward issues two all-reduces, one after each block, or with sequence
    parallelism an all-gather before and a reduce-scatter after each block. Stopping at the
    last needed tensor skips the layer's final one: half of the all-reduces, a quarter of
    the sequence-parallel collectives. Per-op checkpointing keeps reduce-scatter outputs but
    not all-gathers, so with sequence parallelism it re-gathers the inputs of both blocks.

    >>> recomputed_forward_comm_fraction(Layout(tp=8, recompute="full", sequence_parallel=True))
    0.75
    """
    policy = layout.recompute
    if policy is Recompute.SELECTIVE_OP:
        return 0.5 if layout.sequence_parallel else 0.0
    full = 1.0 if layout.stack.reentrant_recompute else 0.75 if layout.sequence_parallel else 0.5
    return {Recompute.FULL: full, Recompute.SELECTIVE_LAYER: full / 2}.get(policy, 0.0)
