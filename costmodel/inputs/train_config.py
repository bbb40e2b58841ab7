"""`TrainConfig`: what is trained on and how, separate from the model's shape.

>>> t = TrainConfig(seq_len=2048, global_batch=512)
>>> t.tokens_per_step, t.param_dtype.bytes, t.compute_dtype.bytes
(1048576, 4, 2)
>>> TrainConfig(workload="finetune-lora").workload.lora.rank
16
>>> TrainConfig(workload="decode", global_batch=8).workload.serving.kv_block_size
16
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from costmodel.errors import InvalidConfigError
from costmodel.inputs.model_config import ModelConfig
from costmodel.workloads import Pretrain, Workload, workload_of


class Dtype(StrEnum):
    """Numeric formats the planner reasons about."""

    FP32 = "float32"
    TF32 = "tf32"  # fp32 storage; the tensor cores' 10-bit-mantissa mode for fp32 GEMMs
    BF16 = "bfloat16"
    FP16 = "float16"
    FP8 = "float8_e4m3fn"

    @property
    def bytes(self) -> int:
        return {Dtype.FP32: 4, Dtype.TF32: 4, Dtype.BF16: 2, Dtype.FP16: 2, Dtype.FP8: 1}[self]


class Precision(StrEnum):
    """Precision recipe a user names.

    fp32: everything fp32 at the fp32 (CUDA-core) peak. tf32: fp32 storage, every GEMM at
    the tf32 tensor-core peak (PyTorch's ``allow_tf32``, JAX's default matmul precision on
    Ampere and later). bf16 / fp16: as Megatron-LM's --bf16 / --fp16 run them (fp16: fp16
    gradients, dynamic loss scaling). fp8: bf16 as the base, the linear layers' GEMMs in fp8
    as Transformer Engine runs them (`costmodel.precision`).
    """

    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"


class OptimizerState(StrEnum):
    """How the optimizer's state and the weights it updates are stored (``--optimizer-state``).

    fp32: an fp32 master copy of the weights, fp32 gradients and Adam's two fp32 moments (the mixed-precision
    default, Megatron-LM's and the JAX program's). bf16: pure bf16, the weights themselves updated in bf16, bf16
    gradients and bf16 moments, no master copy, as torchtune's full fine-tuning recipes run by default
    (``dtype: bf16``; pytorch/torchtune @0331778 recipes/configs/llama3/8B_full_single_device.yaml). 8bit:
    8-bit AdamW (bitsandbytes ``AdamW8bit``, Dettmers et al. 2022 arXiv:2110.02861; torchao ``AdamW8bit``):
    both moments in int8 with one fp32 absmax per 2048-element block, over bf16 weights and gradients as that
    torchtune config pairs them (``bitsandbytes.optim.PagedAdamW8bit`` with ``dtype: bf16``).
    """

    FP32 = "fp32"
    BF16 = "bf16"
    INT8 = "8bit"

    @property
    def moment_bytes(self) -> float:
        """Bytes of Adam's two moments per parameter (the fp32 default reads `TrainConfig.optimizer_dtype`).

        >>> OptimizerState.INT8.moment_bytes  # two int8 moments and two fp32 absmax per 2048 elements
        2.00390625
        """
        return 2 * (1 + 4 / QUANTIZATION_BLOCK) if self is OptimizerState.INT8 else 2 * Dtype.BF16.bytes


# Elements per block of 8-bit AdamW's block-wise quantisation, one fp32 absmax each: Dettmers et al. 2022
# (arXiv:2110.02861, section 2) and torchao's default (pytorch/ao torchao/prototype/low_bit_optim/README.md:
# "block size is 2048 for 8-bit"). bitsandbytes keeps tensors under min_8bit_size=4096 elements (norms) in
# fp32 state; they are a negligible share of a transformer's parameters and are not costed.
QUANTIZATION_BLOCK = 2048


class AdamW(BaseModel):
    """AdamW hyper-parameters; its two moments are kept in ``TrainConfig.optimizer_dtype``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    learning_rate: PositiveFloat = Field(3e-4, description="Peak learning rate.")
    beta1: PositiveFloat = Field(0.9, lt=1, description="First-moment decay.")
    beta2: PositiveFloat = Field(0.95, lt=1, description="Second-moment decay.")
    eps: PositiveFloat = Field(1e-8, description="Denominator epsilon.")
    weight_decay: NonNegativeFloat = Field(0.1, description="Decoupled weight decay.")


class TrainConfig(BaseModel):
    """Sequence length, batch and the mixed-precision policy of one training step.

    The default policy is the common one for large models: fp32 master weights and
    optimizer moments, bf16 compute (weights cast on use, activations in bf16), fp32
    gradient accumulation.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq_len: PositiveInt = Field(2048, description="Tokens per sequence S.")
    global_batch: PositiveInt = Field(256, description="Sequences per optimizer step, over all devices.")
    param_dtype: Dtype = Field(Dtype.FP32, description="Master copy of the parameters.")
    compute_dtype: Dtype = Field(Dtype.BF16, description="Matmul inputs and stored activations.")
    linear_dtype: Dtype | None = Field(None, description="Inputs of the linear layers' GEMMs where they differ from "
                                       "compute_dtype: float8_e4m3fn (fp8 recipe) or tf32 (every fp32 GEMM at the tf32 "
                                       "peak); None: compute_dtype.")
    grad_dtype: Dtype = Field(Dtype.FP32, description="Gradients as reduced and accumulated.")
    optimizer_dtype: Dtype = Field(Dtype.FP32, description="Optimizer moments.")
    optimizer: AdamW = Field(default_factory=AdamW, description="Optimizer hyper-parameters.")
    optimizer_state: OptimizerState = Field(OptimizerState.FP32, description="How the optimizer's state is stored: fp32 (master "
                                            "copy and moments in param_dtype and optimizer_dtype), bf16 (pure bf16: weights, "
                                            "gradients and moments in bf16, no master copy) or 8bit (8-bit AdamW moments over "
                                            "bf16 weights and gradients).")
    optimizer_in_backward: bool = Field(False, description="The optimizer step fused into the backward pass (torchtune's "
                                        "optimizer_in_bwd, pytorch/torchtune recipes/full_finetune_single_device.py): each "
                                        "gradient is applied and freed as it is formed, so no gradient buffer is held; "
                                        "torchtune refuses it with gradient accumulation and with gradient clipping.")
    document_len: PositiveInt | None = Field(None, description="Sequence packing: each sequence packs documents of this many "
                                             "tokens (a mean), attention masked to each document (FlashAttention's varlen "
                                             "kernels, torchtune's packed datasets); None: one document per sequence.")
    workload: Workload = Field(default_factory=Pretrain, description="What the step does (`costmodel.workloads`): pretrain, "
                               "finetune-full (the same step), finetune-lora (with its LoRA settings), or the serving "
                               "workloads prefill and decode (global_batch: sequences per replica, seq_len: context).")

    @model_validator(mode="before")
    @classmethod
    def _typed_workload(cls, data: Any) -> Any:
        """The workload named as before the typed workloads (``workload`` a name, its ``lora`` or ``inference``
        settings beside it), as plan files and keyword callers still give it, becomes its typed object."""
        if not isinstance(data, dict) or not ({"lora", "inference"} & data.keys() or isinstance(data.get("workload"), str)):
            return data
        rest = {k: v for k, v in data.items() if k not in ("lora", "inference")}
        named = data.get("workload", "pretrain")
        if isinstance(named, str):
            return {**rest, "workload": workload_of(named, lora=data.get("lora"), inference=data.get("inference"))}
        if data.get("lora") is not None or data.get("inference") is not None:
            raise ValueError("give the LoRA or serving settings inside the workload object, not beside it")
        return rest

    @model_validator(mode="before")
    @classmethod
    def _pure_16_bit_dtypes(cls, data: Any) -> Any:
        """A bf16 or 8-bit optimizer state updates the bf16 weights themselves: weights and gradients in the compute dtype."""
        if not isinstance(data, dict) or data.get("optimizer_state", OptimizerState.FP32) == OptimizerState.FP32:
            return data
        compute = data.get("compute_dtype", Dtype.BF16)
        return {"param_dtype": compute, "grad_dtype": compute, "optimizer_dtype": compute} | data

    @model_validator(mode="after")
    def _state_dtypes_agree(self) -> TrainConfig:
        dtypes = {self.param_dtype, self.grad_dtype, self.compute_dtype}
        if self.optimizer_state is not OptimizerState.FP32 and dtypes != {Dtype.BF16}:
            raise ValueError(f"optimizer_state={self.optimizer_state.value} keeps weights and gradients in bf16, but "
                             f"{self.param_dtype.value=}, {self.grad_dtype.value=}, {self.compute_dtype.value=}")
        return self

    @model_validator(mode="after")
    def _settings_fit_context(self) -> TrainConfig:
        self.workload.check_context(self.seq_len)
        if self.document_len is not None and (self.document_len > self.seq_len or not self.workload.runs_backward):
            # The error catalog's own error, which pydantic passes through: one line naming the flags.
            raise InvalidConfigError(f"--document-len {self.document_len} packs documents into training sequences of "
                                     f"--seq-len {self.seq_len} tokens",
                                     fix="give --document-len at most --seq-len, on a training workload")
        return self

    def attention_pairs(self, model: ModelConfig) -> float:
        """(query, key) pairs a causal attention kernel scores in one sequence: `ModelConfig.causal_pairs`
        of the sequence, or with packed documents of each document (``S / L`` documents of ``L`` tokens).

        >>> m = ModelConfig(name="m", hidden_size=64, num_layers=1, num_heads=4, ffn_size=8, vocab_size=9)
        >>> TrainConfig(seq_len=4096).attention_pairs(m) / TrainConfig(seq_len=4096, document_len=512).attention_pairs(m)
        8.0
        """
        if self.document_len is None:
            return model.causal_pairs(self.seq_len)
        return self.seq_len / self.document_len * model.causal_pairs(self.document_len)

    @property
    def prompt_len(self) -> int:
        """Prompt tokens per sequence of a serving workload (the whole context by default)."""
        return self.workload.prompt_len(self.seq_len)

    @property
    def moment_bytes_per_param(self) -> float:
        """Bytes of Adam's two moments per trained parameter: 8 in fp32, 4 in bf16, about 2 in 8 bits.

        >>> [TrainConfig(optimizer_state=s).moment_bytes_per_param for s in ("fp32", "bf16", "8bit")]
        [8, 4, 2.00390625]
        """
        if self.optimizer_state is OptimizerState.FP32:
            return 2 * self.optimizer_dtype.bytes
        return self.optimizer_state.moment_bytes

    def with_optimizer_state(self, state: OptimizerState, *, in_backward: bool = False) -> TrainConfig:
        """This config with its optimizer state stored as ``state`` (bf16 and 8bit: weights and gradients in
        the compute dtype, which must be bf16) and the step in the backward pass or not.

        >>> t = TrainConfig().with_optimizer_state(OptimizerState.BF16)
        >>> t.param_dtype.value, t.grad_dtype.value, t.optimizer_dtype.value
        ('bfloat16', 'bfloat16', 'bfloat16')
        >>> TrainConfig().with_precision(Precision.FP16).with_optimizer_state(OptimizerState.INT8)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        costmodel.errors.InvalidConfigError: --optimizer-state 8bit keeps the weights in bf16, not in the float16 ...
        """
        state = OptimizerState(state)
        update: dict[str, Any] = {"optimizer_state": state, "optimizer_in_backward": in_backward}
        if state is OptimizerState.FP32:
            if self.optimizer_state is not OptimizerState.FP32:  # back from pure bf16 to bf16's mixed-precision dtypes
                update |= {"param_dtype": Dtype.FP32, "grad_dtype": Dtype.FP32, "optimizer_dtype": Dtype.FP32}
        elif self.compute_dtype is not Dtype.BF16:
            raise InvalidConfigError(f"--optimizer-state {state.value} keeps the weights in bf16, not in the "
                                     f"{self.compute_dtype.value} compute dtype", fix="use --precision bf16 or --optimizer-state fp32")
        else:
            update |= {"param_dtype": Dtype.BF16, "grad_dtype": Dtype.BF16, "optimizer_dtype": Dtype.BF16}
        return self.model_copy(update=update)

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    @property
    def loss_scaled(self) -> bool:
        """fp16 compute needs dynamic loss scaling (bf16 has fp32's exponent range)."""
        return self.compute_dtype is Dtype.FP16

    @property
    def is_fp8(self) -> bool:
        """Whether the linear layers' GEMMs take fp8 inputs (the fp8 recipe)."""
        return self.linear_dtype is Dtype.FP8

    @property
    def serves_fp8(self) -> bool:
        """Whether a prefill or decode serves fp8 weights with its linear GEMMs in fp8 (W8A8).

        >>> TrainConfig(workload="decode", inference={"weight_dtype": "fp8"}).serves_fp8
        True
        """
        return self.workload.serves_fp8

    @property
    def linear_peak_dtype(self) -> str:
        """The catalog dtype whose peak the linear layers' GEMMs run at (fp8 for the fp8 recipe
        and for serving fp8 weights)."""
        return Dtype.FP8.value if self.serves_fp8 else (self.linear_dtype or self.compute_dtype).value

    @property
    def matmul_peak_dtype(self) -> str:
        """The catalog dtype whose peak every other GEMM (attention, the head) runs at: tf32
        is a mode of every fp32 GEMM, fp8 only of the linear layers'."""
        return Dtype.TF32.value if self.linear_dtype is Dtype.TF32 else self.compute_dtype.value

    @property
    def precision(self) -> Precision:
        """The recipe this dtype policy is (`with_precision` inverted)."""
        if self.linear_dtype is not None:
            return Precision.FP8 if self.is_fp8 else Precision.TF32
        return {Dtype.FP32: Precision.FP32, Dtype.FP16: Precision.FP16}.get(self.compute_dtype, Precision.BF16)

    def with_precision(self, precision: Precision) -> TrainConfig:
        """This config under ``precision``: bf16 computes in bf16 and accumulates and reduces
        gradients in fp32 (Megatron-LM forces ``accumulate_allreduce_grads_in_fp32`` for bf16);
        fp16 computes in fp16 and accumulates and all-reduces gradients in fp16 (Megatron-LM's
        default for --fp16), unscaling them before the optimizer. fp32 and tf32 keep everything
        in fp32 (no separate compute copy of the weights); fp8 is bf16 with the linear layers'
        GEMM inputs in fp8.

        >>> t = TrainConfig().with_precision(Precision.FP16)
        >>> t.compute_dtype.value, t.grad_dtype.value, t.loss_scaled
        ('float16', 'float16', True)
        >>> f = TrainConfig().with_precision(Precision.FP8)
        >>> f.compute_dtype.value, f.linear_peak_dtype, f.matmul_peak_dtype, f.precision.value
        ('bfloat16', 'float8_e4m3fn', 'bfloat16', 'fp8')
        >>> TrainConfig().with_precision(Precision.TF32).matmul_peak_dtype
        'tf32'
        """
        compute = {Precision.FP32: Dtype.FP32, Precision.TF32: Dtype.FP32, Precision.FP16: Dtype.FP16}.get(precision, Dtype.BF16)
        grads = Dtype.FP16 if precision is Precision.FP16 else Dtype.FP32
        linear = {Precision.TF32: Dtype.TF32, Precision.FP8: Dtype.FP8}.get(precision)
        recipe = self.model_copy(update={"compute_dtype": compute, "grad_dtype": grads, "linear_dtype": linear})
        if self.optimizer_state is OptimizerState.FP32:
            return recipe
        return recipe.with_optimizer_state(self.optimizer_state, in_backward=self.optimizer_in_backward)
