"""Built-in model presets, by name, with the publication each shape comes from.

>>> PRESETS["llama3-8b"]["num_kv_heads"]
8
>>> from costmodel.inputs.model_config import ModelConfig
>>> [ModelConfig(name=n, **PRESETS[n]).padded_vocab_size for n in ("gpt2", "megatron-gpt-175b", "llama3-8b")]
[50304, 51200, 128256]
"""

from __future__ import annotations

from typing import Any

_GPT2 = dict(norm="layernorm", mlp="gelu", positions="learned", tie_embeddings=True,
             qkv_bias=True, out_bias=True, mlp_bias=True, vocab_size=50257, max_position_embeddings=1024)
_LLAMA = dict(norm="rmsnorm", mlp="swiglu", positions="rope")
_LLAMA2 = dict(_LLAMA, vocab_size=32000, max_position_embeddings=4096, norm_eps=1e-5)
_LLAMA3 = dict(_LLAMA, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0, num_kv_heads=8)
# Megatron-LM's GPT (Narayanan et al. SC'21 Table 1; Korthikanti et al. 2022 Table 3):
# GPT-2 architecture, sequence 2048, FFN = 4h, and GPT-2's 50257 tokens padded to the papers'
# V = 51200, as --make-vocab-size-divisible-by 128 at tensor-parallel size 8 pads them (128 · 8).
# Every other preset pads to a multiple of 128 (`ModelConfig.vocab_multiple`): GPT-2's to 50304.
_MEGATRON = dict(_GPT2, vocab_size=50257, vocab_multiple=1024, max_position_embeddings=2048)


def _megatron(hidden: int, layers: int, heads: int) -> dict[str, Any]:
    return dict(_MEGATRON, hidden_size=hidden, num_layers=layers, num_heads=heads, ffn_size=4 * hidden)


PRESETS: dict[str, dict[str, Any]] = {
    # Radford et al. 2019, HF openai-community/gpt2* configs.
    "gpt2": dict(_GPT2, hidden_size=768, num_layers=12, num_heads=12, ffn_size=3072),
    "gpt2-medium": dict(_GPT2, hidden_size=1024, num_layers=24, num_heads=16, ffn_size=4096),
    "gpt2-large": dict(_GPT2, hidden_size=1280, num_layers=36, num_heads=20, ffn_size=5120),
    "gpt2-xl": dict(_GPT2, hidden_size=1600, num_layers=48, num_heads=25, ffn_size=6400),
    # Touvron et al. 2023 (LLaMA) Table 2: 65B is dim 8192, 80 layers, 64 heads (full multi-head attention); its
    # SwiGLU width 2/3 · 4 · 8192 rounded up to a multiple of 256 (the code's multiple_of) is 22016; context 2048.
    "llama-65b": dict(_LLAMA2, hidden_size=8192, num_layers=80, num_heads=64, ffn_size=22016, max_position_embeddings=2048,
                      norm_eps=1e-6),
    # Touvron et al. 2023 (Llama 2), HF meta-llama/Llama-2-*-hf configs.
    "llama2-7b": dict(_LLAMA2, hidden_size=4096, num_layers=32, num_heads=32, ffn_size=11008),
    "llama2-13b": dict(_LLAMA2, hidden_size=5120, num_layers=40, num_heads=40, ffn_size=13824),
    "llama2-70b": dict(_LLAMA2, hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=8, ffn_size=28672),
    # Llama 3 herd paper (Dubey et al. 2024) Table 3, HF meta-llama/Meta-Llama-3*-* configs.
    "llama3-8b": dict(_LLAMA3, hidden_size=4096, num_layers=32, num_heads=32, ffn_size=14336),
    "llama3-70b": dict(_LLAMA3, hidden_size=8192, num_layers=80, num_heads=64, ffn_size=28672),
    "llama3-405b": dict(_LLAMA3, hidden_size=16384, num_layers=126, num_heads=128, ffn_size=53248),
    # HF meta-llama/Llama-3.2-1B config (tied embeddings): a draft model for Llama 3's (plan serve --draft-model).
    "llama3.2-1b": dict(_LLAMA3, hidden_size=2048, num_layers=16, num_heads=32, ffn_size=8192, tie_embeddings=True),
    # Jiang et al. 2024, HF mistralai/Mixtral-8x7B-v0.1 config.
    "mixtral-8x7b": dict(
        _LLAMA, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_size=14336,
        vocab_size=32000, max_position_embeddings=32768, rope_theta=1e6, num_experts=8, experts_per_token=2,
    ),
    # Narayanan et al. SC'21, Table 1.
    "megatron-gpt-1.7b": _megatron(2304, 24, 24),
    "megatron-gpt-3.6b": _megatron(3072, 30, 32),
    "megatron-gpt-7.5b": _megatron(4096, 36, 32),
    "megatron-gpt-18.4b": _megatron(6144, 40, 48),
    "megatron-gpt-39.1b": _megatron(8192, 48, 64),
    "megatron-gpt-76.1b": _megatron(10240, 60, 80),
    "megatron-gpt-145.6b": _megatron(12288, 80, 96),
    "megatron-gpt-310.1b": _megatron(16384, 96, 128),
    "megatron-gpt-529.6b": _megatron(20480, 105, 128),
    "megatron-gpt-1008b": _megatron(25600, 128, 160),
    # Korthikanti et al. 2022, Table 3.
    "megatron-gpt-22b": _megatron(6144, 48, 64),
    "megatron-gpt-175b": _megatron(12288, 96, 96),
    "megatron-gpt-530b": _megatron(20480, 105, 128),
    "megatron-gpt-1t": _megatron(25600, 128, 160),
}
