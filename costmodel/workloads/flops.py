"""Model FLOPs by convention: what "MFU" counts, in one place.

A training step's model FLOPs per token are ``6·N + 6·L·H·Q·s``, where

- ``N`` is the parameters a token multiplies (`matmul_params`): every layer's weights (for a
  mixture of experts, those of the experts a token is routed to) and the output head's ``d·V``,
  whether or not it is tied to the input embedding. The input embedding table is left out: a
  lookup does no multiply-adds. This is the ``N`` of Megatron-LM's formula (Narayanan et al.
  2021, arXiv 2104.04473, appendix "Floating-point operations": the logit layer's ``6·B·s·h·V``
  counted, the embedding lookup not), of torchtitan's ``get_num_flop_per_token`` (parameters
  less ``tok_embeddings``) and of nanoGPT's ``estimate_mfu`` (the position embedding left out,
  the tied token embedding kept because it is the head's weight).
- ``V`` is the padded vocabulary (`ModelConfig.padded_vocab_size`, GPT-2's 50257 counted as
  50304): the head's GEMM computes every padded column. Megatron-LM's
  ``num_floating_point_operations`` (``training.py``) counts ``args.padded_vocab_size`` too, and
  nanoGPT's ``estimate_mfu`` counts its 50304-row table; a model whose vocabulary is already a
  multiple of 128 (Llama 2's 32000, Llama 3's 128256) is unaffected.
- ``6·L·H·Q·s`` is causal self-attention: forward ``Q·Kᵀ`` and ``P·V`` cost ``4·s·H·Q`` per token
  per layer over a full ``s × s`` score matrix, three times that with the backward; a causal
  kernel computes only the unmasked half. PaLM's appendix B (Chowdhery et al. 2022, arXiv
  2204.02311) defines MFU with ``6N + 12·L·H·Q·T``, the full matrix; we halve that term as
  FlashAttention's benchmarks (``benchmarks/benchmark_flash_attention.py``: ``// (2 if causal
  else 1)``) and FlashInfer's ``attention_flops`` ("FLOPs is halved for causal masking") count a
  causal kernel's work, so that MFU is not inflated by work no kernel does.

No recompute, no norms or elementwise work: MFU = model FLOPs per second / (devices · dense
peak). HFU (hardware FLOPs utilisation) adds the forward work activation recompute repeats.
The workload types (`costmodel.workloads`) own their step's FLOPs and build them from these terms:
LoRA's frozen weights cost ``4·N`` (no weight gradient), serving costs ``2·N`` a token.

Llama 3 8B at 8192 tokens: N = 32 layers × 218.1 M + 4096 × 128256 = 7.50 B, and
6·N = 45.0 GFLOP plus 6 × 32 × 32 × 128 × 8192 = 6.4 GFLOP of attention:

>>> from costmodel.inputs.model_config import ModelConfig
>>> m = ModelConfig(name="llama3-8b", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_size=14336,
...                 vocab_size=128256, norm="rmsnorm", mlp="swiglu", positions="rope", tie_embeddings=False)
>>> round(matmul_params(m) / 1e9, 3), round(training_flops_per_token(m, 8192) / 1e9, 2)
(7.505, 51.47)
"""

from __future__ import annotations

from costmodel.inputs.model_config import ModelConfig


def matmul_params(model: ModelConfig) -> int:
    """``N`` of the convention: the weights one token multiplies, the layers' (active experts only) and the head's
    ``d·V`` over the padded vocabulary (module docstring)."""
    return model.num_layers * model.active_params_per_layer + model.hidden_size * model.padded_vocab_size


def attention_forward_flops_per_token(model: ModelConfig, context: int, *, causal: bool = True) -> float:
    """Forward ``Q·Kᵀ`` and ``P·V`` FLOPs per token against ``context`` keys, all layers: ``4·L·H·Q·context``,
    half that for a causal mask over a sequence of ``context`` tokens (a decode token attends its whole context)."""
    full = 4 * model.num_layers * model.num_heads * model.head_dim * context
    return full / 2 if causal else full


def training_flops_per_token(model: ModelConfig, seq_len: int) -> float:
    """Model FLOPs per token of a training step (forward and backward): ``6·N + 6·L·H·Q·seq_len`` (module docstring)."""
    return 6 * matmul_params(model) + 3 * attention_forward_flops_per_token(model, seq_len)

