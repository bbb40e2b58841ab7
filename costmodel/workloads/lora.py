"""LoRA fine-tuning (Hu et al. 2021): the base weights frozen, low-rank adapters trained.

Frozen weights have no gradient, no optimizer state and no master copy, and may be stored quantized
(`costmodel.inputs.workload.FrozenDtype`); the adapters train in the master dtype with AdamW like any
weight. Each adapter adds a down (``x·A``) and an up (``(x·A)·B``) GEMM, and the frozen weights'
backward computes only the input gradient: the model FLOPs (`costmodel.workloads.flops`) are 2 × the frozen
forward (4·N a token), 3 × the causal attention's and 3 × the adapters'.

>>> from costmodel.inputs.model_config import ModelConfig
>>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, ffn_size=4096, vocab_size=1000)
>>> from costmodel.workloads.training import Pretrain
>>> w = LoraFinetune()
>>> w.trains_base_weights, w.frozen_dtype.value, [a.name for a in w.adapters(m)]
(False, 'bf16', ['wq', 'wk', 'wv', 'wo'])
>>> 0.66 < w.model_flops(m, tokens=128, seq_len=128) / Pretrain().model_flops(m, tokens=128, seq_len=128) < 0.7
True
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.workload import AdaptedMatrix, FrozenDtype, LoraConfig, adapted_matrices, adapter_params_per_layer
from costmodel.workloads.base import WorkloadBase
from costmodel.workloads.flops import attention_forward_flops_per_token, matmul_params


class LoraFinetune(WorkloadBase):
    """LoRA fine-tuning: frozen base weights, trained adapters (``lora`` has their settings)."""

    kind: Literal["finetune-lora"] = Field("finetune-lora", description="The workload's name (--workload).")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="The adapters' rank, targets, scale and dropout, "
                                                                      "and the frozen weights' storage.")

    trains_base_weights: ClassVar[bool] = False
    takes_adapter_settings: ClassVar[bool] = True
    pipeline_lowered: ClassVar[bool] = False  # the LoRA step has no pipelined program in validate yet

    def describe(self, *, global_batch: int, seq_len: int) -> str:
        return f"{self.kind}: rank {self.lora.rank} on {self.lora.target_label}, frozen weights {self.lora.frozen_dtype.value}"

    @property
    def frozen_dtype(self) -> FrozenDtype:
        return self.lora.frozen_dtype

    @property
    def adapter_rank(self) -> int:
        return self.lora.rank

    @property
    def adapter_dropout(self) -> float:
        return self.lora.dropout

    @property
    def adapter_scale(self) -> float:
        return self.lora.alpha / self.lora.rank

    def adapters(self, model: ModelConfig) -> list[AdaptedMatrix]:
        return adapted_matrices(model, self.lora)

    def adapter_params_per_layer(self, model: ModelConfig, *, tp: int = 1) -> float:
        return adapter_params_per_layer(model, self.lora, tp=tp)

    def trainable_params(self, model: ModelConfig) -> float:
        """Only the adapters train."""
        return model.num_layers * self.adapter_params_per_layer(model)

    def model_flops(self, model: ModelConfig, *, tokens: int, seq_len: int) -> float:
        """Per token: ``4·N`` frozen (forward and input gradient), causal attention 3 × its forward, the adapters ``6·n``."""
        frozen, attention = 2 * 2 * matmul_params(model), 3 * attention_forward_flops_per_token(model, seq_len)
        return tokens * (frozen + attention + 3 * 2 * self.trainable_params(model))
