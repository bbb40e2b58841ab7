"""The models and sizes each run measures: real ones on a GPU, toy ones under ``--quick``.

The ~1B model is Llama 3.2 1B's shape (16 layers of width 2048, GQA 32/8, tied embeddings);
the layer-reduced 8B is Llama 3 8B's widths with 4 of its 32 layers, so its step fits one
GPU with fp32 master weights and AdamW state and compiles fast, its GEMMs and attention the
8B's own.

>>> layer_reduced(load_model("llama3-8b"), 4).num_layers, LLAMA_1B.head_dim
(4, 64)
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.inputs.model_config import ModelConfig
from planner.config import load_model
from planner.presets import PRESETS

LLAMA_1B = ModelConfig(**{**PRESETS["llama3.2-1b"], "name": "llama3-1b"})
TOY = ModelConfig(**{**PRESETS["llama3-8b"], "name": "toy", "hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                     "ffn_size": 256, "vocab_size": 512})
TOY_WIDE = ModelConfig(**{**PRESETS["llama3-8b"], "name": "toy-wide", "hidden_size": 256, "num_layers": 1, "num_heads": 8,
                          "num_kv_heads": 2, "ffn_size": 512, "vocab_size": 512})


def layer_reduced(model: ModelConfig, layers: int) -> ModelConfig:
    """``model`` with ``layers`` layers, every width the same."""
    return ModelConfig(**{**model.model_dump(), "name": f"{model.name}-{layers}l", "num_layers": layers})


@dataclass(frozen=True)
class Sizes:
    """What one run measures."""

    gemm_models: tuple[ModelConfig, ...]
    gemm_tokens: int  # GEMM rows: a micro-batch's tokens
    gemm_tps: tuple[int, ...]
    fp8_tps: tuple[int, ...]
    attention_model: ModelConfig
    attention_lengths: tuple[int, ...]
    attention_tokens: int  # batch · length of each attention case
    hbm_bytes: tuple[int, ...]
    elementwise_model: ModelConfig
    elementwise_tokens: int
    step_models: tuple[ModelConfig, ...]
    step_seq_len: int
    step_global_batch: int
    decode_model: ModelConfig
    decode_cases: tuple[tuple[int, int], ...]  # (batch, context)
    prefill_cases: tuple[tuple[int, int], ...]  # (batch, prompt)


def sizes_for(*, quick: bool) -> Sizes:
    """Toy sizes for ``--quick`` (the CPU check), else the real ones for one H100/H200."""
    if quick:
        return Sizes(gemm_models=(TOY_WIDE,), gemm_tokens=256, gemm_tps=(1, 2), fp8_tps=(1,), attention_model=TOY_WIDE,
                     attention_lengths=(128, 256), attention_tokens=512, hbm_bytes=(32 * 2**20,), elementwise_model=TOY_WIDE,
                     elementwise_tokens=1024, step_models=(TOY, TOY_WIDE), step_seq_len=64, step_global_batch=4, decode_model=TOY,
                     decode_cases=((1, 128), (4, 256)), prefill_cases=((1, 64),))
    llama8b = load_model("llama3-8b")
    return Sizes(gemm_models=(LLAMA_1B, llama8b, load_model("llama3-70b")), gemm_tokens=8192, gemm_tps=(1, 2, 4, 8), fp8_tps=(1, 8),
                 attention_model=llama8b, attention_lengths=(2048, 4096, 8192, 16384, 32768), attention_tokens=32768,
                 hbm_bytes=(256 * 2**20, 2 * 2**30), elementwise_model=llama8b, elementwise_tokens=16384,
                 step_models=(LLAMA_1B, layer_reduced(llama8b, 4)), step_seq_len=2048, step_global_batch=16, decode_model=llama8b,
                 decode_cases=((1, 2048), (1, 8192), (8, 4096), (32, 8192), (64, 2048)), prefill_cases=((1, 4096),))
