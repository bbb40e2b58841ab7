"""What the fp8 recipe adds to memory and gathers: the fp8 copies of the layers' weights.

Transformer Engine (NVIDIA/TransformerEngine @0004dbd, v1.5, transformer_engine/pytorch/module/
linear.py) keeps beside each linear layer's bf16 weight two persistent fp8 workspaces, the cast
``weight_fp8`` and its transpose ``weight_t_fp8`` (Hopper's fp8 GEMMs take one layout only), cast
on a step's first micro-batch and reused. With fp8 parameters (``primary_weights_in_fp8``: TE's
``fp8_model_init``, Megatron-LM's ``--fp8-param-gather``; `SoftwareStack.fp8_param_gather`) the
weight itself is fp8 and only its transpose is extra, and ZeRO gathers it as fp8. Master weights
and Adam moments stay fp32 either way. The embedding, head and norms stay 16-bit; a layer's
parameters are counted as its linear weights (its norm weights are under 0.1 % of them).

LoRA over fp8 frozen weights (NeMo's ``fp8_params``, `costmodel.inputs.workload.FrozenDtype.FP8`): the
frozen weight is stored as its fp8 cast, so a stack that keeps casts holds only the transpose
beside it (one byte a parameter); frozen bf16 weights keep cast and transpose (two bytes). Frozen
weights have no master copy or moments, and int8/int4 storage is not combined with the fp8 recipe
(`check_frozen_dtype`).

>>> from costmodel.inputs.model_config import ModelConfig
>>> from costmodel.inputs.stack import stack_with
>>> from costmodel.inputs.train_config import Precision
>>> m = ModelConfig(name="m", hidden_size=1024, num_layers=4, num_heads=16, ffn_size=4096, vocab_size=1000)
>>> fp8 = TrainConfig(seq_len=512).with_precision(Precision.FP8)
>>> te = Layout(stack=stack_with("megatron-core"))
>>> fp8_weight_copy_bytes(m, fp8, te, 0, layer_params=m.params_per_layer) == 2 * 4 * m.params_per_layer
True
>>> fp8_weight_copy_bytes(m, fp8, Layout(), 0, layer_params=m.params_per_layer)  # the JAX program recasts on use
0.0
>>> lora = TrainConfig(seq_len=512, workload="finetune-lora", lora={"frozen_dtype": "fp8"}).with_precision(Precision.FP8)
>>> fp8_weight_copy_bytes(m, lora, te, 0, layer_params=m.params_per_layer) == 4 * m.params_per_layer  # the transposes
True
"""

from __future__ import annotations

from costmodel.errors import InvalidConfigError, UnsupportedError
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.inputs.workload import FrozenDtype

FP8_BYTES = 1


def check_frozen_dtype(train: TrainConfig) -> None:
    """Refuse in one line a weight storage the precision cannot run: fp8 frozen LoRA weights outside
    the fp8 recipe, int8/int4/NF4 frozen weights under it, and the training fp8 recipe for serving
    (serving's fp8 is ``--frozen-dtype fp8``: `TrainConfig.serves_fp8`).

    >>> from costmodel.inputs.train_config import Precision
    >>> try:
    ...     check_frozen_dtype(TrainConfig(workload="finetune-lora", lora={"frozen_dtype": "fp8"}))
    ... except InvalidConfigError as err:
    ...     print(str(err).split(";")[0])
    --frozen-dtype fp8 feeds the fp8 GEMMs as stored and needs --precision fp8, not bf16
    """
    if not train.workload.runs_backward and train.is_fp8:
        raise UnsupportedError("--precision fp8 is a training recipe; serving's fp8 stores the weights in fp8 and runs "
                               "the linear GEMMs on them", fix="use --frozen-dtype fp8 with --precision bf16 (the default)")
    stored = train.workload.frozen_dtype
    if stored is None or not train.workload.runs_backward:
        return
    if stored is FrozenDtype.FP8 and not train.is_fp8:
        raise InvalidConfigError(f"--frozen-dtype fp8 feeds the fp8 GEMMs as stored and needs --precision fp8, not {train.precision.value}",
                                 fix="add --precision fp8 (on a part with an fp8 peak: h100-sxm, h200) "
                                     "or use --frozen-dtype bf16, int8 or int4")
    if stored in (FrozenDtype.INT8, FrozenDtype.INT4, FrozenDtype.NF4, FrozenDtype.NF4_DQ) and train.is_fp8:
        raise UnsupportedError(f"{stored.value} frozen weights under --precision fp8 are not modelled",
                               fix="use --frozen-dtype fp8 (fp8 frozen weights) or bf16, or another --precision")


def gathered_layer_param_bytes(train: TrainConfig, layout: Layout) -> int:
    """Bytes per layer parameter a ZeRO all-gather moves: one under fp8 parameters, else the compute dtype's."""
    return FP8_BYTES if train.is_fp8 and layout.stack.fp8_param_gather else train.compute_dtype.bytes


def fp8_weight_copy_bytes(model: ModelConfig, train: TrainConfig, layout: Layout, stage: int, *, layer_params: float) -> float:
    """Bytes one device of pipeline stage ``stage`` (``layer_params`` parameters a layer) holds for the fp8 weight copies beyond what
    `costmodel.step.memory` counts for compute-dtype parameters (0 outside the fp8 recipe).

    Without ZeRO 3 every layer's cast and transpose stay resident (2 bytes a parameter); with it
    only the layers gathered at once (the one computed and the one prefetched). Under fp8
    parameters the fp8 weight replaces the bf16 copy (one byte less) and its transpose adds one. A
    stack that recasts on use (`SoftwareStack.fp8_kept_casts` False) keeps no copies. Under LoRA
    they are copies of the frozen weights: cast and transpose of bf16 ones, the transpose of fp8 ones.
    """
    if not train.is_fp8 or not (layout.stack.fp8_kept_casts or layout.stack.fp8_param_gather):
        return 0.0
    per_layer = layer_params
    layers = layout.layers_on_stage(model.num_layers, stage)
    if not train.workload.trains_base_weights:  # frozen: no master copy; an fp8-stored weight is its own cast
        copies = FP8_BYTES if train.workload.frozen_dtype is FrozenDtype.FP8 else 2 * FP8_BYTES
        return (layers if layout.zero_stage < 3 else min(2, layers)) * per_layer * copies
    e = train.compute_dtype.bytes
    if layout.zero_stage < 3:
        return layers * per_layer * (2 * FP8_BYTES if not layout.stack.fp8_param_gather else 2 * FP8_BYTES - e)
    gathered = min(2, layers) * per_layer
    if not layout.stack.fp8_param_gather:
        return gathered * 2 * FP8_BYTES
    # The shard kept is fp8 (one byte less a parameter); the gathered layers are fp8 with a transpose.
    return -layers * per_layer * (e - FP8_BYTES) / layout.zero_shards + gathered * (2 * FP8_BYTES - e)
